"""Code says what a setting does; docs say what it measured. A measured figure, a trial's date or code in a
setting's description, an experiment file's comment or a docstring goes stale with the next run: the figures
belong in docs/ (decisions.md, results.md), generated or dated there."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("corpus", "warehouse", "nkb_model", "stages", "flows", "bench")

# What a measurement looks like in prose: a dated trial, a journal's trial code, an EM figure, "x against y",
# a step's time.
MEASURED = re.compile(r"\b20\d\d-\d\d-\d\d\b|\bjournal\b[^.]{0,40}\b[A-Z]\d{1,2}\b|\bEM \d|"
                      r"\d(\.\d+)? ?%? against \d|\d s a step")
# In a setting's description or an experiment's comment, any percentage too (decoder.33% names a block)
PERCENT = re.compile(r"(?<![.\w])\d+(\.\d+)? ?%")


def found(text: str, percent: bool = False) -> list[str]:
    hits = [m.group(0) for m in MEASURED.finditer(text)]
    return hits + ([m.group(0) for m in PERCENT.finditer(text)] if percent else [])


@pytest.mark.parametrize("text, measured", [
    ("On SmolLM2: 0-shot EM 62.7 (docs/decisions.md).", True), ("116 against 145 GFLOP/s", True),
    ("the journal, evening, B5", True), ("trials of 2026-12-03", True), ("0.32 s a step on 2 cores", True),
    ("a slot changed 4.3 % of answers", False), ("an EM of 50 %", False), ("the paper's T5 experiment", False),
])
def test_the_finder_tells_a_measurement(text, measured):
    assert bool(found(text)) == measured
    assert found("blocks decoder.33% and decoder.50%", percent=True) == []
    assert found("held-out within 2 %", percent=True) == ["2 %"]


def test_no_setting_describes_a_measurement():
    from stages.experiment import Experiment
    from stages.registry import STAGES
    bad = {f"{model.__name__}.{name}": found(field.description or "", percent=True)
           for model in [s.config for s in STAGES.values()] + [Experiment]
           for name, field in model.model_fields.items()}
    assert not {k: v for k, v in bad.items() if v}


def test_no_experiment_file_comments_a_measurement():
    bad = {}
    for path in sorted((ROOT / "experiments").rglob("*.yaml")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "#" in line and (hits := found(line[line.index("#"):], percent=True)):
                bad[f"{path.relative_to(ROOT)}:{number}"] = hits
    assert not bad


def test_no_docstring_reports_a_trial():
    bad = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    if hits := found(ast.get_docstring(node) or ""):
                        bad[f"{path.relative_to(ROOT)}:{getattr(node, 'name', '')}"] = hits
    assert not bad
