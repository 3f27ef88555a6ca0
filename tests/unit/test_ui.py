"""`torchship ui` decides per server: a configured one (tracking URI over HTTP, PREFECT_API_URL) is named and
not started; only the embedded default's servers get a command, bound to 127.0.0.1."""
from __future__ import annotations

from tasks.core.env import MLFLOW_STORE_ENV, PREFECT_API_URL, PREFECT_UI_URL
from tasks.core.params_spec import TrackingParams
from tasks.workspace.ui import ui_servers


def by_name(tracking: TrackingParams, environ: dict[str, str]) -> dict:
    return {server.name: server for server in ui_servers(tracking, 5001, 4201, environ)}


def test_the_embedded_default_starts_both_on_loopback_with_the_store_off_the_command_line():
    servers = by_name(TrackingParams(uri="sqlite:///mlflow/mlflow.db"), {})
    assert [name for name, server in servers.items() if server.remote] == []
    assert servers["MLflow"].url == "http://127.0.0.1:5001" and servers["Prefect"].url == "http://127.0.0.1:4201"
    mlflow = servers["MLflow"]
    assert dict(mlflow.env)[MLFLOW_STORE_ENV].startswith("sqlite:////")      # made absolute for the child
    assert not any("sqlite" in part for part in mlflow.command)
    for server in servers.values():
        assert server.command[server.command.index("--host") + 1] == "127.0.0.1"


def test_configured_servers_are_named_not_started():
    servers = by_name(TrackingParams(uri="https://mlflow.team.example:5443"),
                      {PREFECT_API_URL: "http://prefect.team.example:4200/api/"})
    assert {name: (server.remote, server.url, server.command) for name, server in servers.items()} == {
        "MLflow": (True, "https://mlflow.team.example:5443", ()),
        "Prefect": (True, "http://prefect.team.example:4200", ())}


def test_each_server_is_decided_on_its_own_and_an_explicit_prefect_ui_wins():
    servers = by_name(TrackingParams(), {PREFECT_API_URL: "http://10.0.0.5:4200/api",
                                         PREFECT_UI_URL: "https://prefect.team.example/ui"})
    assert not servers["MLflow"].remote and servers["MLflow"].url == "http://127.0.0.1:5001"
    assert servers["Prefect"].remote and servers["Prefect"].url == "https://prefect.team.example/ui"
    assert not by_name(TrackingParams(uri="postgresql+psycopg2://db.team.example/mlflow"), {})["MLflow"].remote


def test_a_credential_in_an_address_is_never_printed():
    servers = by_name(TrackingParams(uri="http://alice:s3cret-pw@mlflow.team.example:5000"),
                      {PREFECT_API_URL: "http://bob:other-pw@prefect.team.example:4200/api"})
    assert servers["MLflow"].url == "http://mlflow.team.example:5000"
    assert servers["Prefect"].url == "http://prefect.team.example:4200"
