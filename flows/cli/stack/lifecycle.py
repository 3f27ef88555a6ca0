"""`torchship stack up|down|status|env|restart`: a team stack on loopback for trying and testing the team topology —
PostgreSQL, an S3-compatible store (moto), `mlflow server`, `prefect server` and N process workers, each a
process of its own in a session of its own, started from this project's environment. State lives in one folder
(the project's git-ignored .stack/, or TORCHSHIP_STACK_DIR): secrets.env (0600, kept across down/up),
stack.json (ports, pids), logs/. `up` and `down` are idempotent; every wait is bounded."""
from __future__ import annotations

import shlex
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from flows.cli.stack import postgres
from flows.cli.stack import servers as parts
from flows.cli.stack.state import (
    MOTO_SEED,
    StackPaths,
    StackState,
    is_running,
    load_secrets,
    process_start_time,
    stop_group,
    tree_rss_mib,
)
from tasks.core.env import MLFLOW_TRACKING_URI_ENV, STACK_DIR_ENV
from tasks.core.errors import TorchshipError
from tasks.core.procs import free_port, start_child

SERVERS = ("postgres", "moto", "mlflow", "prefect")
START_TIMEOUT_S = {"moto": 30.0, "mlflow": 180.0, "prefect": 180.0, "workers": 90.0}   # first starts migrate
STOP_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class PartStatus:
    name: str
    up: bool
    url: str
    pid: int | None
    rss_mib: float


def stack_paths(project_root: Path, environ: Mapping[str, str]) -> StackPaths:
    """TORCHSHIP_STACK_DIR, else the project's .stack/ (git-ignored)."""
    return StackPaths(Path(environ.get(STACK_DIR_ENV) or project_root / ".stack").resolve())


def server_urls(ports: Mapping[str, int]) -> dict[str, str]:
    host = parts.HOST
    return {"postgres": f"postgresql://{host}:{ports['postgres']}", "moto": f"http://{host}:{ports['moto']}",
            "mlflow": f"http://{host}:{ports['mlflow']}", "prefect": f"http://{host}:{ports['prefect']}/api"}


def health_probe(name: str, ports: Mapping[str, int]):
    """Does the server answer? Its open endpoint (/health stays open under auth), or a TCP accept for PostgreSQL."""
    urls = server_urls(ports)
    if name == "postgres":
        def accepts() -> bool:
            with socket.create_connection((parts.HOST, ports["postgres"]), timeout=2):
                return True
        return accepts
    if name == "moto":   # its own API answers without credentials
        return parts.http_answers(f"{urls['moto']}/moto-api/config", lambda response: response.status_code < 500)
    return parts.http_answers(urls["mlflow"] + "/health" if name == "mlflow" else urls["prefect"] + "/health")


def answers(name: str, ports: Mapping[str, int]) -> bool:
    try:
        return bool(health_probe(name, ports)())
    except Exception:
        return False


def choose_ports(state: StackState) -> None:
    """Ports are chosen once (free ones, from the OS) and kept: URLs stay valid across down/up."""
    for name in SERVERS:
        state.ports.setdefault(name, free_port(parts.HOST))


def start_detached(paths: StackPaths, state: StackState, name: str, command: list[str], env: dict[str, str]) -> None:
    """Start a part in its own session (it outlives this command), output to logs/NAME.log, and record it."""
    paths.logs.mkdir(parents=True, exist_ok=True)
    paths.logs.chmod(0o700)
    paths.home(name).mkdir(parents=True, exist_ok=True, mode=0o700)
    child = start_child(name, command, paths.logs / f"{name}.log", env=env, cwd=paths.home(name))
    state.processes[name] = {"pid": child.process.pid, "started": process_start_time(child.process.pid) or 0.0}
    state.save(paths)


def refuse_taken_port(name: str, ports: Mapping[str, int]) -> None:
    """Before starting a part: nothing else may listen on its port (the part would fail, or a client be misled)."""
    if port_taken(ports[name]):
        raise TorchshipError(f"port {ports[name]} ({name}) is taken by a process this stack did not start. Stop "
                             f"it, or remove \"ports\" from stack.json to choose new ones (the URLs change).")


def port_taken(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex((parts.HOST, port)) == 0


def stack_up(paths: StackPaths, workers: int, environ: Mapping[str, str]) -> list[PartStatus]:
    """Start what is not running, each part as soon as what it needs answers, and wait until all answer (every
    wait bounded); returns the status. PostgreSQL first; Prefect on it; MLflow once moto has issued the S3 keys;
    the workers once Prefect answers."""
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.root.chmod(0o711)   # PostgreSQL (another user) traverses it; nobody else lists it
    state = StackState.load(paths)
    choose_ports(state)
    state.save(paths)
    secrets, ports = load_secrets(paths), state.ports
    fresh_moto = launch_moto(paths, state, environ)
    if postgres.postgres_pid(paths) is None:
        refuse_taken_port("postgres", ports)
    postgres.start_postgres(paths, ports["postgres"], environ)
    postgres.create_databases(paths, ports["postgres"], secrets, environ)
    started = time.time()
    launch_server(paths, state, "prefect", secrets, environ)
    if fresh_moto:
        parts.wait_for("moto", health_probe("moto", ports), START_TIMEOUT_S["moto"], paths.logs / "moto.log")
        secrets = load_secrets(paths, parts.bootstrap_moto(ports["moto"], secrets[MOTO_SEED]))
        state.processes["moto"]["bootstrapped"] = 1.0
        state.save(paths)
    launch_server(paths, state, "mlflow", secrets, environ)
    parts.wait_for("prefect server", health_probe("prefect", ports), START_TIMEOUT_S["prefect"],
                   paths.logs / "prefect.log")
    parts.ensure_pool(ports["prefect"], secrets)
    names = scale_workers(paths, state, workers, secrets, environ)
    parts.wait_for("mlflow server", health_probe("mlflow", ports), START_TIMEOUT_S["mlflow"],
                   paths.logs / "mlflow.log")
    parts.ensure_mlflow_user(ports["mlflow"], secrets)
    parts.wait_for(f"{len(names)} worker(s) on pool {parts.POOL}",
                   parts.workers_online(ports["prefect"], secrets, names, started - 5),
                   START_TIMEOUT_S["workers"], paths.logs / f"{names[-1]}.log" if names else None)
    return stack_status(paths)


def launch_moto(paths: StackPaths, state: StackState, environ: Mapping[str, str]) -> bool:
    """Start moto unless it runs set up; True when started here (its keys and bucket are still to be made)."""
    moto = state.processes.get("moto")
    if is_running(moto) and not moto.get("bootstrapped"):   # an up that failed before moto's set-up: start over
        stop_group(moto, STOP_TIMEOUT_S)
    if is_running(moto):
        return False
    refuse_taken_port("moto", state.ports)
    start_detached(paths, state, "moto", parts.moto_command(state.ports["moto"]), parts.base_env(environ))
    return True


def launch_server(paths: StackPaths, state: StackState, name: str, secrets: Mapping[str, str],
                  environ: Mapping[str, str]) -> None:
    """Start the MLflow or Prefect server unless it runs (not waiting: the other parts start meanwhile)."""
    if is_running(state.processes.get(name)):
        return
    refuse_taken_port(name, state.ports)
    command, env = {"mlflow": (parts.mlflow_command, parts.mlflow_env),
                    "prefect": (parts.prefect_server_command, parts.prefect_server_env)}[name]
    start_detached(paths, state, name, command(state.ports[name]), env(paths, state.ports, secrets, environ))


def scale_workers(paths: StackPaths, state: StackState, workers: int, secrets: Mapping[str, str],
                  environ: Mapping[str, str]) -> list[str]:
    """Exactly `workers` workers: start the missing ones, stop any beyond; returns the names of those started."""
    wanted = [f"worker-{i}" for i in range(1, workers + 1)]
    for name in [n for n in state.processes if n.startswith("worker-") and n not in wanted]:
        stop_group(state.processes.pop(name), STOP_TIMEOUT_S)
    started = []
    for name in wanted:
        if not is_running(state.processes.get(name)):
            start_detached(paths, state, name, parts.worker_command(f"stack-{name}"),
                           parts.worker_env(paths, name, state.ports, secrets, environ))
            started.append(f"stack-{name}")
    state.workers = workers
    state.save(paths)
    return started


def stack_down(paths: StackPaths, environ: Mapping[str, str]) -> list[str]:
    """Stop every part, workers first (a worker whose server is gone ignores SIGTERM), PostgreSQL last; returns
    the names of those that were running. Idempotent: a stopped stack is left as it is."""
    state = StackState.load(paths)
    stopped = []
    order = sorted((n for n in state.processes if n.startswith("worker-")), reverse=True) + ["prefect", "mlflow",
                                                                                              "moto"]
    for name in order:
        record = state.processes.get(name)
        if is_running(record):
            stop_group(record, STOP_TIMEOUT_S)
            stopped.append(name)
        state.processes.pop(name, None)
        state.save(paths)
    if postgres.postgres_pid(paths) is not None:
        postgres.stop_postgres(paths, environ)
        stopped.append("postgres")
    return stopped


RESTARTABLE = ("mlflow", "prefect")


def stack_restart(paths: StackPaths, name: str, environ: Mapping[str, str]) -> float:
    """Stop one server (its process group) and start it again on the same port with the same store, as a team's
    server is restarted for an upgrade; returns the seconds until it answered again. Its clients see it refuse
    connections meanwhile (docs/deploy.md: what a register step does then)."""
    if name not in RESTARTABLE:
        raise TorchshipError(f"`torchship stack restart` restarts {' or '.join(RESTARTABLE)}, not {name!r}: "
                             "`torchship stack down` and `up` for the others.")
    state = StackState.load(paths)
    if not state.ports:
        raise TorchshipError(f"no stack in {paths.root}: run `torchship stack up` first.")
    began = time.monotonic()
    stop_group(state.processes.pop(name, {}), STOP_TIMEOUT_S)
    state.save(paths)
    launch_server(paths, state, name, load_secrets(paths), environ)
    parts.wait_for(f"{name} server", health_probe(name, state.ports), START_TIMEOUT_S[name],
                   paths.logs / f"{name}.log")
    return time.monotonic() - began


def stack_status(paths: StackPaths) -> list[PartStatus]:
    """Each part: up (its process runs and, for a server, answers), its URL, PID and RSS (with its children)."""
    state = StackState.load(paths)
    if not state.ports:
        return []
    urls, rows = server_urls(state.ports), []
    for name in SERVERS:
        pid = postgres.postgres_pid(paths) if name == "postgres" else state.processes.get(name, {}).get("pid")
        running = (name == "postgres" and pid is not None) or is_running(state.processes.get(name))
        up = running and answers(name, state.ports)
        rows.append(PartStatus(name, up, urls[name], pid if running else None, tree_rss_mib(pid) if running else 0.0))
    known = {f"worker-{i}" for i in range(1, state.workers + 1)}
    known |= {name for name in state.processes if name.startswith("worker-")}
    for name in sorted(known, key=lambda n: int(n.split("-")[1])):
        record = state.processes.get(name)
        pid = int(record["pid"]) if is_running(record) else None
        rows.append(PartStatus(name, pid is not None, f"pool {parts.POOL}", pid, tree_rss_mib(pid) if pid else 0.0))
    return rows


def shell_env(paths: StackPaths) -> str:
    """Shell lines that point a client at the stack: addresses literally, credentials read from the 0600 file at
    eval time (so they are never printed), and the params and DVC settings torchship itself reads."""
    state = StackState.load(paths)
    if not state.ports:
        raise TorchshipError(f"no stack in {paths.root}: run `torchship stack up` first.")
    secrets = load_secrets(paths)
    env = parts.client_env(state.ports, secrets)
    lines = [f"# the team stack in {paths.root}: eval \"$(torchship stack env)\""]
    held = {value: name for name, value in secrets.items()}   # the secrets file's name of each value
    for name, value in env.items():
        if value in held:   # PGPASSWORD is the sweep role's: read by that name
            value = f"$(sed -n 's/^{held[value]}=//p' {shlex.quote(str(paths.secrets))})"
            lines.append(f'export {name}="{value}"')
        else:
            lines.append(f"export {name}={shlex.quote(value)}")
    mlflow = env[MLFLOW_TRACKING_URI_ENV]
    lines += ["# torchship reads tracking.* from params (no secret in them):",
              # null: the server's own store, mlflow-artifacts:/<experiment id>; basic auth judges proxied artifacts
              # by that id (an other location is admin-only), and MLflow 3.17 refuses one that names a host
              f"#   torchship run --set tracking.uri={mlflow} --set tracking.artifacts=null",
              # DVC's S3 client reads AWS_ENDPOINT_URL too (push, pull and a refused wrong key checked by hand)
              "# DVC's remote on the bucket (.dvc/config holds no secret; endpoint and keys come from the variables):",
              f"#   dvc remote add -d stack s3://{parts.BUCKET}/dvc"]
    return "\n".join(lines) + "\n"
