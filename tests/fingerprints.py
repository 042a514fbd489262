"""Inputs fingerprints made comparable across runs and machines, so that a test can hold a whole plan's fingerprints
against those an earlier version of the code gave: run ids counted instead of drawn, and the warehouse's own path
written as HOME wherever it enters a fingerprint (the generated world's files are under it).

The golden file (`tests/data/plan_fingerprints.json`) was written by the code before stages declared their inputs,
with `python -m tests.fingerprints`, which runs the tiny every-row plan this way and writes the file. A change that
means to rerun stages (a new sample-world generator, a stage that now reads more) writes it again the same way,
and says so in its commit.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

GOLDEN = Path(__file__).parent / "data" / "plan_fingerprints.json"
# The report's inputs hold its rows' scores, which move with the CPU's rounding: left out.
MEASURED = {"report"}


def make_deterministic(monkeypatch, home: Path) -> None:
    """Run ids `STAGE-0001`, ... in the order runs start; HOME for `home` in every fingerprinted payload."""
    import importlib
    import warehouse.commit
    fingerprints = importlib.import_module("warehouse.fingerprint")  # the module: the package's name is the function
    counter = itertools.count(1)
    monkeypatch.setattr(warehouse.commit, "new_run_id", lambda stage: f"{stage}-{next(counter):04d}")

    class HomeNeutralJson:
        @staticmethod
        def dumps(obj, **kwargs) -> str:
            return json.dumps(obj, **kwargs).replace(str(Path(home).resolve()), "HOME")

    monkeypatch.setattr(fingerprints, "json", HomeNeutralJson)


def plan_fingerprints(home: Path) -> list[list[str]]:
    """[stage, run id, inputs fingerprint] of every run, in the order they ran (the report's left out)."""
    from warehouse import Warehouse, query
    rows = query(Warehouse(home), "SELECT stage, run_id, inputs_fingerprint FROM runs").to_pylist()
    rows.sort(key=lambda r: int(r["run_id"].rsplit("-", 1)[1]))
    return [[r["stage"], r["run_id"], r["inputs_fingerprint"]] for r in rows if r["stage"] not in MEASURED]


def write_golden() -> None:
    """Run the tiny every-row plan in a scratch warehouse, deterministically, and write its fingerprints."""
    import tempfile

    from _pytest.monkeypatch import MonkeyPatch

    from flows.flows import pipeline
    from stages.experiment import FULL_DEMO
    from tests.experiments import tiny_experiment
    with tempfile.TemporaryDirectory() as tmp, MonkeyPatch.context() as monkeypatch:
        home = Path(tmp) / "wh"
        make_deterministic(monkeypatch, home)
        pipeline(tiny_experiment(*FULL_DEMO), home=str(home))
        GOLDEN.write_text(json.dumps(plan_fingerprints(home), indent=0) + "\n")


if __name__ == "__main__":
    write_golden()
