import importlib
from pathlib import Path

import yaml
from prefect.flows import Flow

from flows.registry import STAGES

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
