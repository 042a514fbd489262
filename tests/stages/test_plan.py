"""A pipeline's plan says, before anything runs, what will run and what will be skipped; then the pipeline does exactly
that."""

import pytest

from stages.configs import IngestConfig, RetrieveConfig
from stages.inputs import world_dir
from stages.plan import Rewritten, changed_settings, plan_steps
from stages.runner import dispatch
from tests.experiments import tiny_experiment
from warehouse import RunRecord, Warehouse, list_runs


def run_plan(wh, plan) -> list[str]:
    """Run every stage of `plan` as the pipeline does; the 'stage subject' of each that ran (not skipped)."""
    from stages.registry import run_subject
    ran = []
    for name, config in plan:
        result = dispatch(name, wh, config)
        if not result.skipped:
            ran.append(f"{name} {run_subject(name, result.run.config)}")
    return ran


def snapshot(home) -> dict[str, tuple[int, int]]:
    """Every file under the warehouse with its size and modification time (the DuckDB file aside: a read opens it)."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(home.rglob("*"))
            if p.is_file() and not p.name.startswith("warehouse.duckdb")}


def planned(steps, action: str) -> list[str]:
    return [f"{s.stage} {s.subject}" for s in steps if s.action == action]


@pytest.mark.slow
def test_the_plan_names_what_runs_and_why_and_the_pipeline_then_does_just_that(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    plan = tiny_experiment().with_world(world_dir(wh)).plan(train_models=True)
    fresh = plan_steps(wh, plan)
    assert list_runs(wh) == []  # planning wrote nothing
    assert [s.action for s in fresh] == ["run"] * len(plan)
    assert fresh[0].why == "not run here yet" and fresh[1].why.startswith("after sample-world")
    assert all(s.seconds is None for s in fresh)  # nothing ran here: no time to go by
    assert run_plan(wh, plan) == planned(fresh, "run")

    before = snapshot(wh.home)
    again = plan_steps(wh, plan)
    assert planned(again, "run") == [] and all(s.why.startswith("unchanged since run ") for s in again)

    changed = tiny_experiment("stages.retrieve.k=2", "stages.inject.steps=4").with_world(world_dir(wh)).plan(True)
    steps = plan_steps(wh, changed)
    step = {f"{s.stage} {s.subject}": s for s in steps}
    assert step["retrieve corpus sampleworld"].why == "k 3 → 2"
    assert step["salient-spans corpus sampleworld (retrieved)"].why == "reads what retrieve rewrites"
    assert step["salient-spans corpus general (pretraining)"].action == "skip"  # reads no retrievals
    inject = step["inject base+nkb from base, 4 steps"]
    assert inject.action == "run" and inject.seconds is not None and "for 3 steps" in inject.basis
    assert step["sample-world "].action == step["index corpus sampleworld"].action == "skip"
    assert snapshot(wh.home) == before  # planning wrote no file, even where a stage would run
    assert run_plan(wh, changed) == planned(steps, "run")  # what the plan said, no more, no less


def test_a_stage_that_cannot_start_says_why_when_nothing_before_it_runs(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    missing = tmp_path / "nowhere.jsonl"
    steps = plan_steps(wh, [("ingest", IngestConfig(path=str(missing), corpus="k")),
                            ("retrieve", RetrieveConfig(corpus="k"))])
    assert steps[0].action == "fails" and str(missing) in steps[0].why
    assert steps[1].action == "fails" and "no index for corpus 'k'" in steps[1].why


def test_changed_settings_name_each_key_that_decides_the_output():
    before = RetrieveConfig(corpus="k").model_dump()
    assert changed_settings(before, RetrieveConfig(corpus="k", k=5)) == "k 3 → 5"
    assert changed_settings(before, RetrieveConfig(corpus="k")) == ""


def test_a_read_of_a_rewritten_run_or_model_names_the_stage_that_rewrites_it():
    rewritten = Rewritten()
    run = RunRecord(run_id="inject-1", stage="inject", status="success", inputs_fingerprint="f00d", config={},
                    code_version="x")
    rewritten.add("inject", [run], "base+nkb")
    assert rewritten.read_by(["nq.train:beef", "inject-1"]) == "inject"         # a model by the run that built it
    assert rewritten.read_by(["segments.k:f00d"]) == "inject"                   # a partition by its writer's inputs
    assert rewritten.read_by(["base+nkb:{\"em\": 1}"]) == "inject"              # a report's mark of a model's scores
    assert rewritten.read_by(["base+nkb.qa:{}", "nq.train:beef"]) is None       # another model, another writer
