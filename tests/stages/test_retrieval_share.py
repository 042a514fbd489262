"""The report's share of retrieval's gain: each line weighed against the base and RAG asked its way, on the same
questions."""

import pytest

from stages.report import retrieval_shares

LABELS = {"base (5-shot)": "base", "base (0-shot)": "base", "RAG (5-shot)": "RAG", "base+NKB (5-shot)": "base+NKB",
          "base+NKB (0-shot)": "base+NKB"}


def report_of(rows: dict[tuple[str, str], list[bool]]):
    """(out, answers) as the report builds them, one dataset `nq` and its average, from each row's hits."""
    out = {"model": [], "asked": [], "dataset": []}
    answers = {"model": [], "dataset": [], "question_id": [], "exact_match": []}
    for (model, asked), hits in rows.items():
        for dataset in ("nq", "average"):
            out["model"].append(model), out["asked"].append(asked), out["dataset"].append(dataset)
        for n, right in enumerate(hits):
            for key, value in zip(answers, (model, "nq", f"q{n}", right)):
                answers[key].append(value)
    return out, answers


def test_a_row_is_weighed_against_the_base_asked_its_way_and_rag_in_its_one_way():
    out, answers = report_of({
        ("base (5-shot)", "5-shot"): [True] * 10 + [False] * 90, ("base (0-shot)", "0-shot"): [False] * 100,
        ("RAG (5-shot)", "5-shot"): [True] * 50 + [False] * 50,
        ("base+NKB (5-shot)", "5-shot"): [True] * 30 + [False] * 70,
        ("base+NKB (0-shot)", "0-shot"): [True] * 25 + [False] * 75})
    shares, lows, highs = retrieval_shares(out, answers, LABELS)
    by_line = dict(zip(zip(out["model"], out["dataset"]), zip(shares, lows, highs)))
    assert by_line["base (5-shot)", "nq"] == by_line["RAG (5-shot)", "average"] == (None, None, None)
    assert by_line["base+NKB (5-shot)", "nq"][0] == pytest.approx((30 - 10) / (50 - 10))
    assert by_line["base+NKB (0-shot)", "nq"][0] == pytest.approx(25 / 50)  # the 0-shot base; RAG's 5-shot
    r, low, high = by_line["base+NKB (5-shot)", "average"]
    assert r == pytest.approx(0.5) and low < r < high


def test_a_row_asked_a_way_the_base_was_not_has_no_share():
    out, answers = report_of({("base (5-shot)", "5-shot"): [True, False], ("RAG (5-shot)", "5-shot"): [True, True],
                              ("base+NKB (fine-tuned)", "fine-tuned"): [True, True]})
    assert retrieval_shares(out, answers, LABELS | {"base+NKB (fine-tuned)": "base+NKB"})[0] == [None] * 6


def test_without_rag_there_is_no_share():
    out, answers = report_of({("base (5-shot)", "5-shot"): [False, True], ("base+NKB (5-shot)", "5-shot"): [True, True]})
    assert retrieval_shares(out, answers, LABELS) == ([None] * 4, [None] * 4, [None] * 4)
