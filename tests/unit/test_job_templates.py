"""The docker and kubernetes pools of prefect.yaml (docs/deploy.md sections 2 and 3), checked without a
cluster or a Docker daemon: every job variable they set validates against the pool type's variables schema
(the check Prefect's server makes when a deployment is created), and renders, through the worker package's
own code, into a job configuration that carries the environment torchship's runs need (tasks/core/env.py)
and, on kubernetes, the credentials Secret of the pool template in docs/deploy.md."""
from __future__ import annotations

import asyncio
import copy
import importlib
import json
import os
import re
import uuid

import pytest
import yaml

from tasks.core.env import JOB_ENV
from tests.conftest import REPO

# Each pool name prefect.yaml uses -> its Prefect work-pool type (a new pool must be added here to be checked).
POOL_TYPES = {"torchship-process": "process", "torchship-docker": "docker", "torchship-k8s": "kubernetes"}
WORKERS = {"docker": ("prefect_docker.worker", "DockerWorker"),
           "kubernetes": ("prefect_kubernetes.worker", "KubernetesWorker")}
CREDENTIALS_SECRET = "torchship-secrets"
# Any call to a Prefect API while rendering fails here: a block or variable reference in the job variables
# would be one (and would mean a value resolved and stored by `prefect deploy`).
NO_API = "http://127.0.0.1:9/api"


def worker(pool_type: str):
    """The worker class of a pool type; skipped where its package is missing, a failure on CI (dev extra)."""
    module, name = WORKERS[pool_type]
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError:
        package = module.split(".")[0].replace("_", "-")
        if os.environ.get("CI") == "true":
            pytest.fail(f"{package} is missing on CI: it is in pyproject's dev extra (make install)")
        pytest.skip(f"{package} not installed: pip install -e '.[dev]'")


def team_pools() -> dict[str, dict]:
    """The pools prefect.yaml defines besides the process pool, by definition name."""
    definitions = yaml.safe_load((REPO / "prefect.yaml").read_text(encoding="utf-8"))["definitions"]
    pools = {key: value for key, value in definitions.items() if isinstance(value, dict) and "job_variables" in value}
    assert {pool["name"] for pool in pools.values()} <= set(POOL_TYPES), "a pool without a type in POOL_TYPES"
    return {key: pool for key, pool in pools.items() if POOL_TYPES[pool["name"]] != "process"}


def pool_template_patch() -> dict:
    """What docs/deploy.md tells a kubernetes pool's base job template to add: its one ```json block."""
    blocks = re.findall(r"```json\n(.*?)```", (REPO / "docs" / "deploy.md").read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1, "docs/deploy.md should hold exactly one JSON block: the kubernetes template patch"
    return json.loads(blocks[0])


def merged(base, patch):
    """`patch` laid over `base`: dicts key by key, lists of named items (containers) by name."""
    if isinstance(base, dict) and isinstance(patch, dict):
        return {**base, **{key: merged(base[key], value) if key in base else value for key, value in patch.items()}}
    if isinstance(base, list) and isinstance(patch, list) and all("name" in item for item in base + patch):
        names = {item["name"]: item for item in patch}
        return [merged(item, names.pop(item["name"])) if item["name"] in names else item for item in base] + \
            list(names.values())
    return patch


def base_job_template(pool_type: str) -> dict:
    """The pool's base job template: the worker's default, with the docs' additions on kubernetes."""
    template = worker(pool_type).get_default_base_job_template()
    return merged(template, pool_template_patch()) if pool_type == "kubernetes" else template


def validate_job_variables(job_variables: dict, template: dict) -> None:
    from prefect.utilities.schema_tools import validate

    unknown = set(job_variables) - set(template["variables"]["properties"])
    assert not unknown, f"not variables of the pool type (ignored when the job renders): {sorted(unknown)}"
    validate(job_variables, template["variables"], raise_on_error=True, preprocess=True, ignore_required=True,
             allow_none_with_default=True)   # as prefect.server.api.validation does for a deployment


def rendered(pool_type: str, template: dict, job_variables: dict):
    """The job configuration a worker of `pool_type` builds for a flow run of a deployment with `job_variables`."""
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.objects import FlowRun

    configuration_class = worker(pool_type).job_configuration
    configuration = asyncio.run(configuration_class.from_template_and_values(
        template, job_variables, client=PrefectClient(api=NO_API)))
    configuration.prepare_for_flow_run(FlowRun(flow_id=uuid.uuid4(), name="rendered-here"))
    return configuration


def test_prefect_yaml_defines_a_docker_and_a_kubernetes_pool():
    assert {POOL_TYPES[pool["name"]] for pool in team_pools().values()} == {"docker", "kubernetes"}


@pytest.mark.parametrize("definition", sorted(team_pools()))
def test_every_job_variable_validates_against_the_pool_types_schema(definition):
    pool = team_pools()[definition]
    validate_job_variables(pool["job_variables"], base_job_template(POOL_TYPES[pool["name"]]))


def test_a_wrong_job_variable_is_refused():
    from prefect.utilities.schema_tools import ValidationError

    template = base_job_template("kubernetes")
    with pytest.raises(ValidationError, match="finished_job_ttl"):
        validate_job_variables({"finished_job_ttl": "an hour"}, template)
    with pytest.raises(AssertionError, match="memory"):
        validate_job_variables({"memory": "4Gi"}, template)   # the old docs' name: silently ignored by Prefect


def test_a_docker_run_gets_the_job_env_and_its_credentials_files_read_only():
    (pool,) = [pool for pool in team_pools().values() if POOL_TYPES[pool["name"]] == "docker"]
    configuration = rendered("docker", base_job_template("docker"), pool["job_variables"])
    assert JOB_ENV.items() <= configuration.env.items()
    assert configuration.image == pool["job_variables"]["image"]
    mounts = {volume.split(":")[1]: volume.split(":")[2:] for volume in configuration.volumes}
    assert mounts == {"/root/.aws": ["ro"], "/root/.mlflow": ["ro"]}   # DVC's S3 keys, MLflow's basic auth


def test_a_kubernetes_run_gets_the_job_env_the_credentials_secret_and_its_resources():
    pools = {key: pool for key, pool in team_pools().items() if POOL_TYPES[pool["name"]] == "kubernetes"}
    assert len(pools) == 2
    limits = {}
    for key, pool in pools.items():
        configuration = rendered("kubernetes", base_job_template("kubernetes"), pool["job_variables"])
        (container,) = configuration.job_manifest["spec"]["template"]["spec"]["containers"]
        env = {item["name"]: item.get("value") for item in container["env"]}
        assert JOB_ENV.items() <= env.items(), key
        assert container.get("envFrom") == [{"secretRef": {"name": CREDENTIALS_SECRET}}], key
        assert configuration.namespace == "torchship"
        limits[key] = container["resources"]["limits"]
    assert limits == {"kubernetes_pool": {"memory": "4Gi", "nvidia.com/gpu": "0"},
                      "kubernetes_gpu_pool": {"memory": "32Gi", "nvidia.com/gpu": "4"}}


def test_the_patch_leaves_the_default_template_whole():
    default = worker("kubernetes").get_default_base_job_template()
    patched = base_job_template("kubernetes")
    assert set(default["variables"]["properties"]) < set(patched["variables"]["properties"])
    container = patched["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"]
    default_container = default["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in container] == ["prefect-job"]
    stripped = copy.deepcopy(container[0])
    stripped.pop("envFrom")
    stripped["resources"]["limits"].pop("nvidia.com/gpu")
    assert stripped == default_container[0]


def test_the_docs_pull_steps_bind_to_prefects_steps_and_dvc_pull_runs_in_the_clone():
    import inspect

    from prefect.utilities.importtools import import_object

    blocks = re.findall(r"```yaml\n(.*?)```", (REPO / "docs" / "deploy.md").read_text(encoding="utf-8"), re.S)
    (steps,) = [loaded["pull"] for loaded in map(yaml.safe_load, blocks) if isinstance(loaded, dict) and
                "pull" in loaded]
    outputs = {}
    for step in steps:
        ((name, inputs),) = step.items()
        arguments = {key: value for key, value in inputs.items() if key not in ("id", "requires")}  # Prefect's own
        inspect.signature(import_object(name)).bind(**arguments)   # a wrong or missing argument raises here
        outputs[name.rsplit(".", 1)[-1]] = inputs
    assert list(outputs) == ["git_clone", "run_shell_script"]
    assert outputs["run_shell_script"]["script"].startswith("dvc pull")
    # The clone's path is git_clone's output `directory`; Prefect moves there only after the last pull step.
    assert outputs["run_shell_script"]["directory"] == f"{{{{ {outputs['git_clone']['id']}.directory }}}}"
