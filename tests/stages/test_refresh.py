"""A knowledge refresh, as pure logic: the report's comparison with the report before, and fingerprints that
survive an upgrade (settings added later leave earlier runs' fingerprints alone while at their default)."""

from stages.configs import BaseModelConfig, IndexConfig, InjectConfig
from stages.report import refresh_rows


def report(model: str, run: str, ems: dict[str, float], probe: float) -> list[dict]:
    rows = [{"model": model, "dataset": d, "em": em, "probe_em": probe, "model_run": run} for d, em in ems.items()]
    return [r | {"run_id": "report-1"} for r in rows]


def answers(model: str, right: dict[tuple[str, str], bool]) -> list[dict]:
    return [{"model": model, "dataset": d, "question_id": q, "exact_match": e} for (d, q), e in right.items()]


def test_a_rebuilt_row_is_compared_question_by_question():
    before = report("base+NKB", "inject-1", {"nq": 50.0, "wq": 0.0, "average": 25.0}, 40.0) + \
        report("base", "base-1", {"nq": 0.0, "average": 0.0}, 4.0)
    after = report("base+NKB", "inject-2", {"nq": 50.0, "wq": 100.0, "average": 75.0}, 45.0) + \
        report("base", "base-1", {"nq": 0.0, "average": 0.0}, 4.0)
    then = answers("base+NKB", {("nq", "1"): True, ("nq", "2"): False, ("wq", "3"): False})
    now = answers("base+NKB", {("nq", "1"): False, ("nq", "2"): True, ("wq", "3"): True, ("wq", "4"): True})
    rows = {r["dataset"]: r for r in refresh_rows(before, then, after, now)}
    assert {r["model"] for r in rows.values()} == {"base+NKB"}  # the base was not rebuilt: no comparison
    assert (rows["nq"]["em_before"], rows["nq"]["em_after"]) == (50.0, 50.0)
    assert (rows["nq"]["newly_right"], rows["nq"]["newly_wrong"]) == (1, 1)
    assert (rows["wq"]["newly_right"], rows["wq"]["newly_wrong"]) == (1, 0)  # question 4 is new: not counted
    assert (rows["average"]["newly_right"], rows["average"]["newly_wrong"]) == (2, 1)
    assert (rows["probe"]["em_before"], rows["probe"]["em_after"], rows["probe"]["newly_right"]) == (40.0, 45.0, None)
    assert rows["nq"]["model_run_before"] == "inject-1" and rows["nq"]["model_run_after"] == "inject-2"
    assert rows["nq"]["report_before"] == "report-1"


def test_nothing_rebuilt_or_no_report_before_compares_nothing():
    rows = report("base+NKB", "inject-1", {"nq": 50.0, "average": 50.0}, 40.0)
    assert refresh_rows(rows, [], rows, []) == []
    assert refresh_rows([], [], rows, []) == []
    # a report written before reports recorded their models' runs cannot be compared
    assert refresh_rows([r | {"model_run": None} for r in rows], [], rows, []) == []


def test_settings_added_later_leave_fingerprints_alone_at_their_default():
    assert "start" not in InjectConfig().identity() and InjectConfig(start="previous").identity()["start"] == "previous"
    assert "store" not in IndexConfig().identity() and IndexConfig(store=["raw"]).identity()["store"] == ["raw"]
    assert "source" not in BaseModelConfig().identity() and BaseModelConfig(source="t5").identity()["source"] == "t5"
    assert "device" not in InjectConfig().identity() and "steps" in InjectConfig().identity()
