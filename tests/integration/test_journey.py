"""The team's journey on the team stack, on loopback: hosts that share nothing but the servers, the bucket and the
git remote. Each host is a Unix user of its own with a private HOME (tests/helpers/hosts.py); the stack is
`torchship stack up --workers 0` (PostgreSQL, moto's S3 with its checks on, `mlflow server` with basic auth,
`prefect server` with its auth string), the one test_stack.py checks next (tests/conftest.py team_stack).

1. Host A commits the project (tracking on the MLflow server, the DVC remote in the bucket, and the `pull:` steps of
   docs/deploy.md pointing at a bare git repository on disk, the team's remote), pushes it and runs
   `torchship deploy`. Workers on hosts B and C, which have never seen the project, take the code by the pull steps
   (git clone, then `dvc pull`) and run the `pipeline` deployment twice at once, with no champion yet: B's run from
   that commit, C's from a teammate's next one (one epoch more; identical bytes would be one version). The test
   holds the model's registry lock until both have blessed: exactly one version moves an alias (champion), the other
   is registered `stale` with the message that names the champion. Each is recorded from the commit its run cloned,
   and their artifacts and data land in the bucket.
-  (the batch index) Host C accepts a batch as a retrain does: it joins the shared index on the MLflow server, under
   the model's registry lock on the Prefect server, and the next run on B pulls it before it starts.
2. Host D, which has a clone of the git remote and nothing else, runs `torchship serve`: it follows `champion`
   through the MLflow server and ships its request log and feedback to the bucket.
3. Drifted traffic with its true labels goes to D. The `monitor` deployment, run by a worker on host C, reads D's
   log from the bucket and emits the drift event; the event starts the `retrain` deployment on C's worker: the
   window joins the training data (the shared batch index), and the retrain's version, trained on it and longer than
   the pair (the team's second commit, pushed before step 5's runs: train.epochs up, and promotion.approval
   required), passes the gates and waits for a person. On D, `torchship approve VERSION --url` runs the live canary
   on D's own traffic, which promotes it, and D serves it.
4. Once the retrain's register step has begun on C (its MLflow run exists), the MLflow server is restarted
   (`torchship stack restart mlflow`): MLflow's client waits for it (tasks/core/env.py MLFLOW_HTTP_RETRY), the
   retrain completes, and exactly one new version holds its bytes, finished (no `register_unfinished` tag), with its
   lineage; the rest of step 3 runs on the restarted server.
5. (the kill and the resume) A run on a worker of B is SIGKILLed with every process of host B once it has mirrored
   a training checkpoint to the DVC remote (the machine dies mid-training): the flow run leaves Running, marked
   Crashed by `torchship-crash-watch`, within crash_watch.crashed_within_s() (plus a slack for a loaded box), and
   every Prefect concurrency limit is free again. The next run, on a fresh worker of B started right after the kill
   (while the crash watch waits out the dead run's silence), completes (its version waits for approval: the pair's
   champion stays, and nothing holds `challenger`) and resumes what was done: DVC restores the stages the killed
   run finished from the run cache on the remote, and training resumes from the mirrored checkpoint (step > 0).
6. Meanwhile `torchship rebuild CHAMPION` on host C, with only a clone of the git remote and the servers (no DVC
   cache, nothing of A's or B's), reproduces the version's metrics.
Four full pipeline runs in all (a killed run and its successor count as one): the pair, the killed and resumed run,
the retrain.
And the planted-secrets search of the stack: the database password, MLflow's passwords, Prefect's auth string
and the S3 keys appear in none of A's files, the hosts' console output, any command line while the journey ran,
MLflow's runs and versions, Prefect's flow runs, or the bucket. Run it alone with `pytest -m stack`.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.cli.stack.servers import BUCKET
from flows.cli.stack.state import StackPaths, read_env_file
from tasks.config import load_params
from tasks.core.env import FAULT_ENV, TOKEN_ENV
from tasks.core.prefect_limits import dead_holder_bound_s
from tasks.core.procs import free_port
from tasks.modalities.table.sources import SYNTHETIC_TARGET, generate_customers
from tasks.monitoring.demo import DemoTraffic
from tasks.monitoring.segments import bucket_source
from tasks.monitoring.window import read_feedback, read_lines
from tasks.registry.approvals import REQUESTED_TAG
from tasks.registry.read import UNFINISHED_TAG
from tasks.workspace import crash_watch
from tests.conftest import REPO, TEAM_STACK_GROUP, make_project
from tests.helpers import LIGHT_RUN
from tests.helpers.command_lines import CommandLines
from tests.helpers.hosts import Host, hosts, kill_processes_of, require_root
from tests.helpers.stack import bucket_texts, evaluated, mlflow_http, prefect_http, s3_client, server_records, stack_cli
from tests.helpers.traffic import LiveTraffic
from tests.reliability.test_secrets import leaks

# Four pipeline runs (two at once), the monitor and a live canary: ~15 min alone on 2 cores, more beside other tests
pytestmark = [pytest.mark.integration, pytest.mark.stack, pytest.mark.timeout(3600),
              pytest.mark.xdist_group(TEAM_STACK_GROUP)]
RUN_TIMEOUT_S = 1500     # one tiny pipeline run on a worker: ~2-3 min alone on 2 cores, 8 at load 10
POOL = "torchship-process"
CRASH_SLACK_S = 30       # a server on a loaded 2-core box evaluates its automations late
SHIP_TO = f"s3://{BUCKET}/serve-logs"   # where host D's service ships its request log and feedback
DRIFT, DRIFT_ROWS = 0.6, 600            # covariate drift (the labelling function stays): the monitor fires on it
ADMIN_TOKEN = "journey-admin-token"     # D's service's /admin token: the live canary sets the split with it
RETRAIN_EPOCHS = 10                     # the team's second commit: the retrain trains longer than the pair's
CHECKPOINT_EVERY, HANG_AT_STEP = 4, 6   # the killed run stops at training step 6, after a checkpoint
# The pair's second run: a teammate's next commit, one epoch more (identical bytes would be one version). Not fewer:
# a one-epoch model answers "no" to every drifted row, and on D's traffic the live canary (accuracy, and the PSI of
# the answers) then holds such a champion over any retrain that answers "yes" at all. Not another seed: the retrain
# must beat the champion there, and another seed's model may be the better one by chance.
TEAMMATE_EPOCHS = 3
MODEL = "synthetic-churn"               # the journey's registered model (the synthetic default's)


@pytest.fixture(scope="module")
def journey(team_stack):
    """The shared stack (tests/conftest.py team_stack: up here without workers), four hosts, and their folder with
    the git remote; the hosts and the folder removed on every way out (the stack by test_stack.py's last test, or at
    the session's end)."""
    require_root()
    root = Path(tempfile.mkdtemp(prefix="torchship-journey-", dir="/tmp"))   # the hosts traverse it
    root.chmod(0o711)
    try:
        stack_cli(team_stack, "up", "--workers", "0")
        with hosts(root / "hosts", "a", "b", "c", "d") as made:
            yield root, team_stack, made
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def env(journey) -> dict[str, str]:
    return evaluated(stack_cli(journey[1], "env"))


def checked(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, f"{done.args[-6:]}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def git_remote(root: Path, owner: Host, readers: list[Host]) -> Path:
    """A bare repository on disk, the team's git remote: A pushes to it, every host may read it. Each reader trusts
    it by name in its own ~/.gitconfig (git refuses another user's repository on disk; a git server would not)."""
    remote = root / "remote.git"
    remote.mkdir(mode=0o755)
    shutil.chown(remote, owner.user, owner.user)
    checked(owner.run("git", "init", "-q", "--bare", "-b", "main", str(remote)))
    for host in readers:
        checked(host.run("git", "config", "--global", "--add", "safe.directory", str(remote)))
    return remote


def publish_project(host: Host, remote: Path, env: dict[str, str]) -> tuple[Path, str]:
    """Host A's project: tracking on the MLflow server, the DVC remote in the bucket, the docs' pull steps; committed
    and pushed. Returns the project and the pushed commit."""
    team = {"serve": {"ship_to": SHIP_TO, "ship_seconds": 2}, "data": {"shift": "covariate"},
            # v2 is trained to answer otherwise on the drifted traffic, so its mix of answers may move: the canary
            # judges it on errors, latency and accuracy on the labelled traffic here (a challenger whose mix moved
            # is rolled back by the PSI check in tests/integration/test_canary_live.py)
            "canary": {"max_psi": 1.0}, "train": {"checkpoint_every": CHECKPOINT_EVERY},
            # the gate's baseline without cross-validation (4 fits, not 24, in each of the journey's five baseline
            # stages): TINY's max_baseline_gap leaves that gate open here, and the pick is tests/model's to check
            "baseline": {"cv_max_rows": 0}}
    project = publish(host, remote, env, {**team, **light_params()})
    return project, checked(host.run("git", "rev-parse", "HEAD", cwd=project)).strip()


def publish(host: Host, remote: Path, env: dict[str, str], params: dict) -> Path:
    """`host`'s project with `params` over the tiny ones, tracking on the MLflow server, the DVC remote in the bucket
    and the docs' pull steps at `remote`; committed and pushed."""
    project = host.home / "project"
    make_project(project, {"tracking": {"uri": env["MLFLOW_TRACKING_URI"], "artifacts": None}, **params})
    with (project / "prefect.yaml").open("a") as handle:
        handle.write(docs_pull_steps(f"file://{remote}"))
    subprocess.run(["chown", "-R", f"{host.user}:{host.user}", str(project)], check=True, timeout=60)
    for command in (["dvc", "remote", "add", "-d", "-f", "stack", f"s3://{BUCKET}/dvc"],
                    ["git", "commit", "-qam", "the team topology: MLflow server, DVC remote, pull steps"],
                    ["git", "push", "-q", str(remote), "HEAD:main"]):
        checked(host.run(*command, cwd=project, env=env))
    return project


def docs_pull_steps(remote: str) -> str:
    """The `pull:` section of docs/deploy.md, as a team pastes it, with the remote's URL put in."""
    blocks = re.findall(r"```yaml\n(.*?)```", (REPO / "docs" / "deploy.md").read_text(encoding="utf-8"), re.S)
    (block,) = [block for block in blocks if block.startswith("pull:")]
    return "\n" + re.sub(r"repository: \S+", f"repository: {remote}", block, count=1)


def light_params() -> dict:
    """LIGHT_RUN as params (a deployment's run takes no --set)."""
    from tasks.stages.overrides import merge, parse_assignment

    params: dict = {}
    for keys, value in map(parse_assignment, LIGHT_RUN):
        nested: dict = {keys[-1]: value}
        for key in reversed(keys[:-1]):
            nested = {key: nested}
        params = merge(params, nested)
    return params


def wait_for_flow_run(env: dict[str, str], flow_run_id: str, timeout: float = RUN_TIMEOUT_S) -> dict:
    """The flow run once it reaches a final state."""
    deadline = time.monotonic() + timeout
    with prefect_http(env) as prefect:
        while True:
            run = prefect.get(f"/flow_runs/{flow_run_id}").json()
            if run["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
                return run
            assert time.monotonic() < deadline, f"flow run still {run['state_type']} after {timeout:.0f} s"
            time.sleep(2)


def worker_log(log: Path) -> str:
    """What host B's worker printed (its flow runs' output included)."""
    return log.read_text(errors="replace") if log.exists() else ""


def test_a_deployment_runs_on_another_hosts_worker_and_a_fresh_host_rebuilds_it_leaking_no_secret(journey, env):
    root, paths, made = journey
    host_a, host_b, host_c, host_d = made["a"], made["b"], made["c"], made["d"]
    remote = git_remote(root, host_a, [host_b, host_c, host_d])
    logs = {name: root / f"host-{name}.log" for name in ("b", "c", "d")}   # B's and C's workers, D's service
    started: list[subprocess.Popen] = []
    with CommandLines() as command_lines:
        project, _ = publish_project(host_a, remote, env)
        deployed = checked(host_a.run("torchship", "deploy", cwd=project, env=env))
        assert f"prefect worker start --pool {POOL}" in deployed, deployed[-3000:]
        assert_review_form(env)
        try:
            champion, stale, commits = two_runs_at_once(host_a, {"b": host_b, "c": host_c}, project, remote, env,
                                                        logs, started)
            checked(host_c.run("git", "clone", "-q", f"file://{remote}", "retrain", env=env))
            accepted = host_c.run("python", "-c", ACCEPT_A_BATCH, cwd=host_c.home / "retrain", env=env)
            assert checked(accepted) and accepted.stdout.split()[-1] == "1"   # files the shared index names
            publish_the_teams_second_commit(host_a, project, remote, env)
            offset = len(worker_log(logs["b"]))
            with concurrent.futures.ThreadPoolExecutor(3) as meanwhile:   # C rebuilds and D starts as B's machine dies
                rebuild = meanwhile.submit(rebuild_on_a_fresh_host, host_c, remote, env, champion)
                serving = meanwhile.submit(serve_on_a_fresh_host, host_d, remote, env, logs["d"], champion)
                killed_run, killed_at = kill_the_machine_mid_training(host_a, host_b, project, env, logs["b"], started)
                assert "pulled 1 accepted batch file(s) named by the shared index" in worker_log(logs["b"])[offset:]
                # the next run starts at once: the crash watch's verdict on the dead one takes minutes, by design
                crash = meanwhile.submit(wait_crashed, env, killed_run, killed_at)
                resumed_from = the_next_run_resumes(host_a, host_b, project, env, logs["b"], started)
                crashed, crashed_after_s = crash.result()
                rebuilt = rebuild.result()
                service, url = serving.result()
                started.append(service)
            started.append(host_c.start("prefect", "worker", "start", "--pool", POOL, "--name", "host-c-2",
                                        log=logs["c"], env=env))
            closed_loop = drift_retrain_and_live_canary(host_a, host_d, project, env, url, logs["c"], paths)
        finally:
            for process in reversed(started):
                stop(process)
    assert f"v{champion} rebuilt: every metric within" in rebuilt, rebuilt[-3000:]
    assert_registered_from_the_remote(env, commits, champion, stale)
    assert resumed_from > 0, resumed_from
    assert crashed["state_type"] == "CRASHED", crashed["state"]
    assert crashed_after_s <= crash_watch.crashed_within_s() + CRASH_SLACK_S, crashed_after_s
    assert_no_slot_taken(env)
    records = server_records(env)
    secrets = [value for value in read_env_file(paths.secrets).values() if len(value) >= 8]
    texts = {"deploy": deployed, "rebuild": rebuilt, "closed loop": closed_loop,
             **{f"host {name.upper()}'s log": worker_log(log) for name, log in logs.items()},
             "command lines": "\n".join(command_lines.seen), "MLflow and Prefect records": str(records),
             **bucket_texts(env, BUCKET)}
    assert len(command_lines.seen) > 50                                # the watch saw the run's processes
    assert leaks(project, texts, secrets) == {}


def assert_review_form(env: dict[str, str]) -> None:
    """The approval form the Prefect UI renders from the deployed `review` flow's parameters."""
    with prefect_http(env) as prefect:
        form = prefect.get("/deployments/name/torchship-review/review").json()["parameter_openapi_schema"]
    assert form["properties"]["decision"]["enum"] == ["approve", "reject"] and "reviewer" in form["required"]


def serve_on_a_fresh_host(host: Host, remote: Path, env: dict[str, str], log: Path, champion: str
                          ) -> tuple[subprocess.Popen, str]:
    """`torchship serve` in a clone of the git remote on host D: the service and its URL once it is ready (it
    serves the champion, which it found through the MLflow server)."""
    import httpx

    clone = host.home / "project"
    checked(host.run("git", "clone", "-q", f"file://{remote}", str(clone), env=env))
    port = free_port()
    service = host.start("torchship", "serve", "--port", str(port), log=log, env={**env, TOKEN_ENV: ADMIN_TOKEN},
                         cwd=clone)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while True:
        assert service.poll() is None and time.monotonic() < deadline, worker_log(log)[-3000:]
        with contextlib.suppress(httpx.HTTPError):
            if (ready := httpx.get(f"{url}/ready", timeout=10)).status_code == 200:
                assert ready.json()["champion"] == champion, ready.json()
                return service, url
        time.sleep(1)


def publish_the_teams_second_commit(host: Host, project: Path, remote: Path, env: dict[str, str]) -> None:
    """Host A's next commit, before the killed run: a person approves what reaches traffic (promotion.approval:
    required), so the killed run's successor waits for approval and leaves the pair's champion and no `challenger`
    (its own canary could otherwise promote it, or leave it holding `challenger`, which makes the retrain stale);
    and the model trains longer (RETRAIN_EPOCHS), so the retrain's version is better than the pair's by
    construction."""
    push_params(host, project, remote, env, ["promotion.approval=required", f"train.epochs={RETRAIN_EPOCHS}"],
                "a person approves; train longer")


def push_params(host: Host, project: Path, remote: Path, env: dict[str, str], settings: list[str], message: str
                ) -> str:
    """Host A commits `settings` to params.yaml and pushes; the commit."""
    from tasks.stages.overrides import resolve, write_params

    raw, _ = resolve(settings, base_file=str(project / "params.yaml"))
    write_params(raw, str(project / "params.yaml"))
    shutil.chown(project / "params.yaml", host.user, host.user)
    for command in (["git", "commit", "-qam", message], ["git", "push", "-q", str(remote), "HEAD:main"]):
        checked(host.run(*command, cwd=project, env=env))
    return checked(host.run("git", "rev-parse", "HEAD", cwd=project)).strip()


def drift_retrain_and_live_canary(host_a: Host, host_d: Host, project: Path, env: dict[str, str], url: str,
                                  log: Path, paths: StackPaths) -> str:
    """Journey steps 3 and 4: drifted traffic with labels to D, the monitor deployment, the retrain its event starts
    (the MLflow server restarted during its register), and the live canary on D that promotes its version. Returns
    what the hosts printed."""
    import httpx

    traffic = DemoTraffic(url, load_params(project / "params.yaml"))
    served = traffic.send(DRIFT_ROWS, DRIFT, seed=7) + "; " + traffic.send_feedback()
    wait_shipped(env, DRIFT_ROWS)
    before = version_numbers(env)
    began = time.monotonic()
    monitored = wait_for_flow_run(env, run_deployment(host_a, project, env, "torchship-monitor/monitor"))
    assert monitored["state_type"] == "COMPLETED", worker_log(log)[-5000:]
    assert "trigger fired" in worker_log(log), worker_log(log)[-5000:]
    retrained, version = restart_the_tracking_server_mid_register(
        paths, env, first_run_of(env, "torchship-retrain/retrain"), log, before)
    print(f"monitor and retrain on host C's worker: {time.monotonic() - began:.0f} s")
    assert retrained["state_type"] == "COMPLETED", worker_log(log)[-5000:]
    assert_retrained_version(env, version)
    # the monitor's and the retrain's decisions, made in two fresh clones, are in the bucket beside D's log
    status = checked(host_a.run("torchship", "status", cwd=project, env=env))
    assert "fired" in status and "retrained" in status, status[-3000:]
    waiting = version_tags(env, version)
    assert REQUESTED_TAG in waiting, {v: version_tags(env, str(v)) for v in sorted(version_numbers(env))}
    features = generate_customers(400, seed=8, drift=DRIFT, shift="covariate")
    truth = features.pop(SYNTHETIC_TARGET).astype(str)
    began = time.monotonic()
    with LiveTraffic(url, features, truth):
        approved = checked(host_d.run("torchship", "approve", version, "--reason", "the retrain on the drifted window",
                                      "--url", url, cwd=host_d.home / "project",
                                      env={**env, TOKEN_ENV: ADMIN_TOKEN}, timeout=RUN_TIMEOUT_S))
    print(f"live canary of v{version} on host D: {time.monotonic() - began:.0f} s")
    assert champion_of(env) == version, approved[-3000:]
    deadline = time.monotonic() + 60   # D follows the alias (serve.poll_seconds; the canary's reload asked already)
    while (health := httpx.get(f"{url}/health", timeout=30).json()).get("champion") != version:
        assert time.monotonic() < deadline, health
        time.sleep(1)
    return f"{served}\n{status}\n{approved}"


def restart_the_tracking_server_mid_register(paths: StackPaths, env: dict[str, str], flow_run_id: str, log: Path,
                                              before: set[int]) -> tuple[dict, str]:
    """Journey step 4: once the retrain's register step has begun (its MLflow run is RUNNING), `torchship stack
    restart mlflow`; then the flow run as it ended and, when it completed, the one version it added to `before`
    (the versions there were), finished."""
    def register_runs(status: str = "") -> list[dict]:
        with mlflow_http(env) as mlflow:
            ids = [e["experiment_id"] for e in mlflow.post("/experiments/search", json={"max_results": 100}).json()
                   .get("experiments", [])]
            where = "tags.`torchship.stage` = 'register'" + (f" and attributes.status = '{status}'" if status else "")
            found = mlflow.post("/runs/search", json={"experiment_ids": ids, "filter": where, "max_results": 100})
        assert found.status_code == 200, found.text[:500]
        return sorted((run["info"] for run in found.json().get("runs", [])), key=lambda info: info["start_time"])

    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not register_runs("RUNNING"):
        assert time.monotonic() < deadline, "the retrain's register step did not begin"
        time.sleep(0.5)
    began, offset = time.monotonic(), len(worker_log(log))
    print(stack_cli(paths, "restart", "mlflow").strip(), f"({time.monotonic() - began:.0f} s with the command)")
    run = wait_for_flow_run(env, flow_run_id)
    if run["state_type"] != "COMPLETED":
        return run, ""
    print("tries MLflow's client repeated on C meanwhile:",   # urllib3's warning, in the flow run's output
          worker_log(log)[offset:].count("urllib3.connectionpool - Retrying"))
    added = sorted(version_numbers(env) - before)
    assert len(added) == 1, added   # one version, no duplicate of its bytes
    version = str(added[0])
    assert UNFINISHED_TAG not in version_tags(env, version), version_tags(env, version)
    seconds = [(info["end_time"] - info["start_time"]) / 1000 for info in register_runs()]
    print("register steps (s; the last one the restart's):", ", ".join(f"{s:.0f}" for s in seconds))
    return run, version


def wait_shipped(env: dict[str, str], rows: int, timeout: float = 120, ship_to: str = SHIP_TO) -> None:
    """Until the bucket holds `rows` served rows and their labels (D ships every serve.ship_seconds)."""
    source = bucket_source(ship_to, s3_client(env))
    deadline = time.monotonic() + timeout
    while len(read_lines(source.served(), 10 * rows, 0.0)) < rows or len(read_feedback(source.feedback())) < rows:
        assert time.monotonic() < deadline, "host D's log did not reach the bucket"
        time.sleep(1)


def first_run_of(env: dict[str, str], deployment: str, timeout: float = 180, known: frozenset[str] = frozenset()
                 ) -> str:
    """The id of the deployment's first flow run not in `known`, once there is one (an automation starts it)."""
    deadline = time.monotonic() + timeout
    with prefect_http(env) as prefect:
        found = prefect.get(f"/deployments/name/{deployment}").json()["id"]
        while not (runs := [run for run in prefect.post("/flow_runs/filter", json={
                "flow_runs": {"deployment_id": {"any_": [found]}}}).json() if run["id"] not in known]):
            assert time.monotonic() < deadline, f"no run of {deployment} within {timeout:.0f} s"
            time.sleep(2)
    return runs[0]["id"]


def champion_of(env: dict[str, str], model: str = MODEL) -> str:
    with mlflow_http(env) as mlflow:
        found = mlflow.get("/registered-models/alias", params={"name": model, "alias": "champion"})
    assert found.status_code == 200, found.text[:500]
    return found.json()["model_version"]["version"]


def version_tags(env: dict[str, str], version: str, model: str = MODEL) -> dict[str, str]:
    with mlflow_http(env) as mlflow:
        found = mlflow.get("/model-versions/get", params={"name": model, "version": version})
    assert found.status_code == 200, found.text[:500]
    return {tag["key"]: tag["value"] for tag in found.json()["model_version"].get("tags", [])}


def version_numbers(env: dict[str, str], model: str = MODEL) -> set[int]:
    with mlflow_http(env) as mlflow:
        found = mlflow.get("/model-versions/search", params={"filter": f"name='{model}'"})
    assert found.status_code == 200, found.text[:500]
    return {int(version["version"]) for version in found.json().get("model_versions", [])}


def newest_version(env: dict[str, str]) -> str:
    return str(max(version_numbers(env)))


def assert_retrained_version(env: dict[str, str], version: str) -> None:
    """The newest version is the retrain's: its lineage names the trigger and the window's batch among the data it
    trained on."""
    tags = version_tags(env, version)
    assert tags.get("trigger") == "retrain" and tags.get("retrain_batch"), tags
    assert tags["retrain_batch"] in tags.get("data_batches", "") and tags.get("dvc_batches_md5"), tags


# What a retrain on host C does with an accepted batch (tasks/retrain.py keep_batch): on the tracking server it goes
# into the shared index, under the model's registry lock on the Prefect server. Prints the files the index names.
ACCEPT_A_BATCH = """
from tasks.config import load_params
from tasks.core import paths
from tasks.registry.read import registry_client
from tasks.modalities.table.sources import generate_customers
from tasks.monitoring.batch_index import shared_snapshot
from tasks.retrain import keep_batch
params = load_params()
def store():
    paths.BATCHES.mkdir(parents=True, exist_ok=True)
    generate_customers(60, seed=21).to_parquet(paths.BATCHES / "host-c.parquet", index=False)
    return paths.BATCHES / "host-c.parquet"
keep_batch(params, store)
print(shared_snapshot(registry_client(params.tracking), params.data.registered_model_name())["nfiles"])
"""


def run_deployment(host: Host, project: Path, env: dict[str, str], name: str = "torchship-pipeline/pipeline"
                   ) -> str:
    """`prefect deployment run` of a deployment (the pipeline) from host A; the flow run's id."""
    started = checked(host.run("prefect", "deployment", "run", name, cwd=project, env=env))
    return started.split("UUID:")[1].split()[0]


def kill_the_machine_mid_training(host_a: Host, host_b: Host, project: Path, env: dict[str, str], log: Path,
                                  started: list[subprocess.Popen]) -> tuple[str, float]:
    """A run on a new worker of B, and once it has mirrored a training checkpoint to the DVC remote, every process of
    B SIGKILLed (the worker's machine dies): the flow run's id and the moment of the kill. The worker's runs stop at
    training step HANG_AT_STEP (TORCHSHIP_FAULT=hang, the reliability tests' fault), so the kill lands mid-training
    however fast the tiny model trains: not a race."""
    offset = len(worker_log(log))
    start_worker(host_b, "host-b-2", log, env, started, {FAULT_ENV: f"hang:0:{HANG_AT_STEP}"})
    flow_run_id = run_deployment(host_a, project, env)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not re.search(r"── train ──.*train: checkpoint \S+ mirrored to the DVC remote", worker_log(log)[offset:],
                        re.S):
        assert time.monotonic() < deadline, worker_log(log)[offset:][-3000:]
        time.sleep(1)
    kill_processes_of(host_b.user)
    return flow_run_id, time.monotonic()


def wait_crashed(env: dict[str, str], flow_run_id: str, killed_at: float) -> tuple[dict, float]:
    """The killed flow run once it left Running, and the seconds from the kill until then."""
    run = wait_for_flow_run(env, flow_run_id, timeout=crash_watch.crashed_within_s() + 2 * CRASH_SLACK_S)
    print(f"SIGKILLed mid-training: {run['state_type']} after {time.monotonic() - killed_at:.0f} s "
          f"(bound {crash_watch.crashed_within_s():.0f} s)")
    return run, time.monotonic() - killed_at


def the_next_run_resumes(host_a: Host, host_b: Host, project: Path, env: dict[str, str], log: Path,
                         started: list[subprocess.Popen]) -> int:
    """The next run, on a fresh worker of host B (a fresh clone, nothing of the killed run's on its disk), started
    while the crash watch has yet to judge the killed one, completes and resumes what the killed run did: DVC
    restores the stages it finished from the run cache on the remote, and training resumes from the checkpoint it
    mirrored. Returns the step training resumed from."""
    offset = len(worker_log(log))
    start_worker(host_b, "host-b-3", log, env, started)
    began = time.monotonic()
    run = wait_for_flow_run(env, run_deployment(host_a, project, env))
    kill_processes_of(host_b.user)   # the worker, idle now (see two_runs_at_once)
    printed = worker_log(log)[offset:]
    print(f"the next run on a fresh worker of host B: {time.monotonic() - began:.0f} s")
    assert run["state_type"] == "COMPLETED", printed[-5000:]
    for stage in ("validate", "baseline"):   # what DVC can run-cache and the killed run finished
        assert f"{stage}: restored from the DVC remote's run cache" in printed, printed[-5000:]
    assert "train: fetched" in printed, printed[-5000:]
    resumed = [int(step) for step in re.findall(r"resuming from step (\d+)", printed)]
    assert resumed, printed[-5000:]
    return max(resumed)


def two_runs_at_once(host_a: Host, workers: dict[str, Host], project: Path, remote: Path, env: dict[str, str],
                     logs: dict[str, Path], started: list[subprocess.Popen]) -> tuple[str, str, set[str]]:
    """The pipeline deployment twice at once, with no champion yet: on B's worker from the first commit, and on C's
    from a teammate's next one (TEAMMATE_EPOCHS: identical bytes would be one version, register reuses it), pushed
    once B's run has cloned. The test holds the model's registry lock until both runs have blessed, so both
    register against the same state, not by a race: the first to take the lock then is champion, the other is
    registered `stale` with a message that names the champion. Returns (champion, stale, the two commits)."""
    first = checked(host_a.run("git", "rev-parse", "HEAD", cwd=project)).strip()
    began = time.monotonic()
    with registry_lock_held(host_a, project, env):
        runs = [run_deployment(host_a, project, env)]
        start_worker(workers["b"], "host-b", logs["b"], env, started)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while "All deployment steps completed successfully" not in worker_log(logs["b"]):   # B's clone is done
            assert time.monotonic() < deadline, worker_log(logs["b"])[-3000:]
            time.sleep(1)
        second = push_params(host_a, project, remote, env, [f"train.epochs={TEAMMATE_EPOCHS}"], "one epoch more")
        start_worker(workers["c"], "host-c", logs["c"], env, started)
        runs.append(run_deployment(host_a, project, env))
        apart_s = wait_blessed(env, runs)
    finished = [wait_for_flow_run(env, run) for run in runs]
    print(f"\ntwo pipeline runs at once on hosts B and C: {time.monotonic() - began:.0f} s "
          f"(blessed {apart_s:.0f} s apart)")
    for host in workers.values():   # their runs have ended; a worker's SIGTERM leaves its poller running a while
        kill_processes_of(host.user)
    printed = {name: worker_log(logs[name]) for name in workers}
    assert [run["state_type"] for run in finished] == ["COMPLETED"] * 2, {k: v[-3000:] for k, v in printed.items()}
    assert all("── train ──" in text for text in printed.values())   # one run on each host
    champion = champion_of(env)
    (stale,) = {"1", "2"} - {champion}
    assert newest_version(env) == "2"
    tags = version_tags(env, stale)
    assert f"the champion moved to v{champion} while this run was blessing" in tags.get("stale", ""), tags
    return champion, stale, {first, second}


@contextlib.contextmanager
def registry_lock_held(host: Host, project: Path, env: dict[str, str]) -> Iterator[None]:
    """The model's registry lock (its Prefect global concurrency limit) held by a process of `host` while inside."""
    holder = subprocess.Popen(host.argv("python", "-c", HOLD_THE_REGISTRY_LOCK), cwd=project, env=host.env(env),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said = []
    while (line := holder.stdout.readline()) and line.strip() != "held":   # the holder exits if it cannot take it
        said.append(line)
    assert line.strip() == "held", "".join(said)[-3000:]
    try:
        yield
    finally:
        with contextlib.suppress(BrokenPipeError):
            holder.stdin.write("release\n")
            holder.stdin.close()
        holder.wait(timeout=120)


# Holds the registry lock as tasks/registry/lock.py takes it on the stack, until a line comes on stdin.
HOLD_THE_REGISTRY_LOCK = """
import sys
from tasks.core.prefect_limits import held_slot
from tasks.registry.lock import limit_name
with held_slot(limit_name("synthetic-churn"), 120):
    print("held", flush=True)
    sys.stdin.readline()
"""


def wait_blessed(env: dict[str, str], flow_runs: list[str]) -> float:
    """Until every flow run's bless task has completed; the seconds between the first and the last."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + RUN_TIMEOUT_S
    with prefect_http(env) as prefect:
        while len(seen) < len(flow_runs):
            found = prefect.post("/task_runs/filter", json={"flow_runs": {"id": {"any_": flow_runs}}}).json()
            for task_run in found:
                if task_run["name"].startswith("bless") and task_run["state_type"] == "COMPLETED":
                    seen.setdefault(task_run["flow_run_id"], time.monotonic())
            for flow_run in set(flow_runs) - set(seen):
                state = prefect.get(f"/flow_runs/{flow_run}").json()["state_type"]
                assert state in ("SCHEDULED", "PENDING", "RUNNING"), f"flow run {flow_run} ended {state} unblessed"
            assert time.monotonic() < deadline, f"not blessed within {RUN_TIMEOUT_S} s: {sorted(seen)}"
            time.sleep(2)
    return max(seen.values()) - min(seen.values())


def start_worker(host: Host, name: str, log: Path, env: dict[str, str], started: list[subprocess.Popen],
                 extra: dict[str, str] | None = None) -> subprocess.Popen:
    """A process worker of `host` on the pool that takes one flow run at a time."""
    worker = host.start("prefect", "worker", "start", "--pool", POOL, "--name", name, "--limit", "1", log=log,
                        env={**env, **(extra or {})})
    started.append(worker)
    return worker


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to a host process's session (a worker, a service), then wait for it to end."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=60)


def assert_no_slot_taken(env: dict[str, str]) -> None:
    """Every Prefect concurrency limit (the registry locks, the workspace slots) is free: the dead run's leases ran
    out (within prefect_limits.dead_holder_bound_s of its death, shorter than the crash bound)."""
    deadline = time.monotonic() + dead_holder_bound_s(5)
    with prefect_http(env) as prefect:
        while taken := [limit["name"] for limit in prefect.post("/v2/concurrency_limits/filter", json={}).json()
                        if limit["active_slots"]]:
            assert time.monotonic() < deadline, taken
            time.sleep(1)


def rebuild_on_a_fresh_host(host: Host, remote: Path, env: dict[str, str], version: str) -> str:
    """`torchship rebuild VERSION` in a clone of the git remote: no DVC cache, nothing of the other hosts."""
    clone = host.home / "project"
    checked(host.run("git", "clone", "-q", f"file://{remote}", str(clone), env=env))
    began = time.monotonic()
    rebuilt = checked(host.run("torchship", "rebuild", version, cwd=clone, env=env, timeout=RUN_TIMEOUT_S))
    print(f"rebuild of v{version} on host C: {time.monotonic() - began:.0f} s")
    return rebuilt


def assert_registered_from_the_remote(env: dict[str, str], commits: set[str], champion: str, stale: str) -> None:
    """The pair's versions are on the MLflow server, each recorded from the pushed commit its run cloned; the
    champion (D served it first; a later promotion made it `previous`) has its ONNX model and the run's data in the
    bucket (MLflow's artifacts, register's `dvc push`)."""
    tags = version_tags(env, champion)
    assert {tags["git_commit"], version_tags(env, stale)["git_commit"]} == commits and "previous" in tags, tags
    keys = [item["Key"] for item in s3_client(env).list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    assert any(key.endswith("model.onnx") for key in keys), keys
    assert any(key.startswith("dvc/") for key in keys), keys
