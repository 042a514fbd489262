"""docs/your-data.md and the files it shows: each block is the file it names, the experiment loads and plans, its data
stages run and say what the page says they say, and the templates hold the settings measured on real passages."""

import re
from pathlib import Path

import pytest
import yaml

from stages.experiment import Experiment

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "your-data.md"
EXAMPLE = ROOT / "experiments" / "your-data" / "experiment.yaml"
SHOWN = re.compile(r"<!-- file: (?P<path>[^,]+?)(?:, first (?P<lines>\d+) lines)? -->\n```\w*\n(?P<text>.*?)```",
                   re.S)


def test_every_block_of_the_page_is_the_file_it_names():
    blocks = list(SHOWN.finditer(PAGE.read_text()))
    assert len(blocks) == 3
    for block in blocks:
        lines = (ROOT / block["path"]).read_text().splitlines(keepends=True)
        expected = "".join(lines[:int(block["lines"])] if block["lines"] else lines)
        assert block["text"] == expected, f"docs/your-data.md's block of {block['path']} differs from the file"


def test_the_example_loads_and_plans_both_rows_few_shot_and_zero_shot():
    experiment = Experiment.load(str(EXAMPLE))
    evaluations = [config.model_name() for name, config in experiment.plan() if name == "evaluate"]
    assert evaluations == ["base.5shot", "base", "base+nkb.5shot", "base+nkb"]


def test_the_template_for_a_real_corpus_holds_the_settings_measured_on_real_passages():
    """bench.real_passages' experiment (the demo's settings, the three measured on real text from the template) is
    where the template's figures come from; the template and the small example must ask the same, the steps aside
    (sized to a corpus) and the blocks (given as shares of the depth, the same blocks on SmolLM2's 30)."""
    from bench.real_passages import REAL_TEXT_SETTINGS
    from stages.experiment import SAMPLE_WORLD_SMOLLM2
    demo = yaml.safe_load(SAMPLE_WORLD_SMOLLM2.read_text())["stages"]
    template = yaml.safe_load((ROOT / "experiments" / "example-causal-lm.yaml").read_text())["stages"]
    example = yaml.safe_load(EXAMPLE.read_text())["stages"]
    measured = {k: v for k, v in demo["inject"].items() if k not in ("steps", "layers", "warmup_steps")}
    measured |= {k: template["inject"][k] for k in REAL_TEXT_SETTINGS}
    for stages in (template, example):
        assert stages["salient-spans"] == demo["salient-spans"] == {"max_words": 15}
        assert {k: v for k, v in stages["inject"].items() if k in measured} == measured
        assert stages["inject"]["layers"] == ["decoder.33%", "decoder.47%", "decoder.67%"]
    assert template["inject"]["warmup_steps"] == demo["inject"]["warmup_steps"]
    assert yaml.safe_load((ROOT / "experiments" / "example-causal-lm.yaml").read_text())["precision"] == "bf16"


@pytest.mark.slow
def test_the_examples_data_stages_run_and_its_split_is_as_small_as_the_page_says(tmp_path):
    from flows.cli import main
    from stages.data import em_margin
    from warehouse import Warehouse, query
    home = str(tmp_path / "wh")
    assert main(["--home", home, "pipeline", str(EXAMPLE), "--no-models"]) == 0
    counts = query(Warehouse(home), "SELECT split, count(*) AS n FROM questions GROUP BY split ORDER BY split")
    assert counts.to_pylist() == [{"split": "train", "n": 12}, {"split": "validation", "n": 8}]
    # the note the questions stage prints for it (tests/stages/test_data.py holds that it is printed)
    assert f"8 questions give about ±{em_margin(8):.0f} points" in " ".join(PAGE.read_text().split())


def test_one_stage_of_the_example_rerun_with_a_setting_runs_each_distinct_run_once(tmp_path):
    """`nkb run evaluate --experiment FILE --set shots=3`: each row asked 3-shot once, not once per way it was asked."""
    from flows.cli_pipeline import experiment_runs
    home = str(tmp_path / "wh")
    assert [c.model_name() for c in experiment_runs(str(EXAMPLE), "evaluate", home)] == [
        "base.5shot", "base", "base+nkb.5shot", "base+nkb"]
    assert [c.model_name() for c in experiment_runs(str(EXAMPLE), "evaluate", home, ["shots=3"])] == [
        "base.3shot", "base+nkb.3shot"]
