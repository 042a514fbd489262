import importlib
from pathlib import Path

import yaml
from prefect.flows import Flow

from stages.registry import STAGES

ROOT = Path(__file__).resolve().parents[2]


def deployments():
    return yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]


def test_every_entrypoint_imports_as_a_flow():
    for dep in deployments():
        module_path, name = dep["entrypoint"].split(":")
        module = importlib.import_module(module_path.removesuffix(".py").replace("/", "."))
        assert isinstance(getattr(module, name), Flow), dep["name"]


def test_every_stage_and_the_pipeline_is_deployed():
    assert {d["name"] for d in deployments()} == set(STAGES) | {"pipeline"}


def test_prefect_yaml_is_generated_from_the_registry():
    from flows.deployments import render
    assert (ROOT / "prefect.yaml").read_text() == render(), "run `python -m flows.deployments`"


def test_stage_deployments_default_to_their_config_defaults_and_enforce_the_schema():
    from flows.deployments import config_defaults
    by_name = {d["name"]: d for d in deployments()}
    for stage in STAGES.values():
        d = by_name[stage.name]
        assert d["enforce_parameter_schema"] is True and d["work_pool"]["name"] == stage.pool
        assert d["parameters"]["config"] == config_defaults(stage.config)
    assert by_name["pipeline"]["schedules"][0]["active"] is False
