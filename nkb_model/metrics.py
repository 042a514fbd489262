"""Evaluation metrics: exact match with SQuAD's answer normalisation (lower case, no punctuation, no
articles, single spaces), ROUGE-L and SacreBLEU for the general-generation check."""

from __future__ import annotations

import re
import string
from typing import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold_answers: Iterable[str]) -> bool:
    """True when the normalised prediction equals any normalised gold answer."""
    pred = normalize_answer(prediction)
    return any(pred == normalize_answer(gold) for gold in gold_answers)


def rouge_l(predictions: list[str], references: list[str]) -> float:
    """Mean ROUGE-L F1 in % (Google's `rouge-score`, Porter stemming), as summarisation papers report it."""
    from rouge_score import rouge_scorer
    if len(predictions) != len(references) or not references:
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return 100.0 * sum(scorer.score(r, p)["rougeL"].fmeasure for p, r in zip(predictions, references)) / len(references)


def bleu(predictions: list[str], references: list[str]) -> float:
    """Corpus BLEU with SacreBLEU's defaults (13a tokenisation, one reference per example)."""
    import sacrebleu
    if len(predictions) != len(references) or not references:
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    return float(sacrebleu.corpus_bleu(predictions, [references]).score)


def bootstrap_interval(groups: list[list[bool]], resamples: int = 2000, level: float = 0.95,
                       seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval, in %, of the mean of the groups' exact-match rates: one group for a
    dataset's EM, several for the average over datasets (each dataset resampled on its own, as the average
    weighs datasets equally). Questions are resampled with replacement `resamples` times."""
    import numpy as np
    rng = np.random.default_rng(seed)
    means = np.zeros(resamples)
    for hits in groups:
        hits = np.asarray(hits, dtype=float)
        means += hits[rng.integers(0, len(hits), size=(resamples, len(hits)))].mean(axis=1)
    low, high = np.percentile(100 * means / len(groups), [50 * (1 - level), 50 * (1 + level)])
    return float(low), float(high)


def retrieval_share(row: list[list[bool]], base: list[list[bool]], rag: list[list[bool]], resamples: int = 2000,
                    level: float = 0.95, seed: int = 0) -> tuple[float | None, float | None, float | None]:
    """(r, low, high): the share of retrieval's gain over the base that a row keeps in its weights,
    r = (EM - base) / (RAG - base), with a paired percentile bootstrap interval: each group (a dataset: the three
    rows' hits on the same questions, in the same order) resampled on its own, the same draw for the three rows, the
    groups' EMs averaged as the report averages datasets. None where retrieval gains nothing over the base (r has no
    meaning), and a bound None where more than a twentieth of the draws gain nothing. The draws where retrieval gains
    nothing are left out of the interval: they are the ratio's wildest, so the interval is a little narrow there."""
    import numpy as np
    rng = np.random.default_rng(seed)
    sums = {name: np.zeros(resamples) for name in ("row", "base", "rag")}
    for hits in zip(row, base, rag):
        arrays = [np.asarray(h, dtype=float) for h in hits]
        if len({len(a) for a in arrays}) != 1:
            raise ValueError("the three rows must be answers to the same questions, in the same order")
        drawn = rng.integers(0, len(arrays[0]), size=(resamples, len(arrays[0])))
        for name, array in zip(sums, arrays):
            sums[name] += array[drawn].mean(axis=1)

    def share(r, b, g):
        return (r - b) / (g - b)
    means = {name: sum(np.mean(h) for h in group) for name, group in (("row", row), ("base", base), ("rag", rag))}
    if means["rag"] - means["base"] <= 0:
        return None, None, None
    gained = sums["rag"] - sums["base"] > 0
    if gained.mean() < 0.95:
        return float(share(means["row"], means["base"], means["rag"])), None, None
    draws = share(sums["row"][gained], sums["base"][gained], sums["rag"][gained])
    low, high = np.percentile(draws, [50 * (1 - level), 50 * (1 + level)])
    return float(share(means["row"], means["base"], means["rag"])), float(low), float(high)


def sign_test(gained: int, lost: int) -> float:
    """The two-sided exact sign test's p of a model that answers `gained` questions another misses and misses `lost`
    it answers, on the same questions (those both answer, or both miss, say nothing of which is better)."""
    import math
    n = gained + lost
    tail = sum(math.comb(n, k) for k in range(min(gained, lost) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def seeds_intervals(trainings: list[list[bool]], reference: list[bool], resamples: int = 2000, level: float = 0.95,
                    seed: int = 0) -> dict[str, tuple[float, float]]:
    """Percentile bootstrap intervals, in %, of the mean EM of several trainings of one setting (seeds) on the same
    questions (`mean`), and of that mean minus a reference's EM (`lead`, in points), the questions resampled with
    replacement, the same draw for both. Each question counts as its share of right answers over the trainings: what
    varies is which questions were drawn, not the seeds, which are all there are. A `lead` interval above 0 says the
    setting answers more than the reference beyond what the questions' draw explains, where each training's own
    interval may still touch the reference's."""
    import numpy as np
    if not trainings or any(len(t) != len(reference) for t in trainings):
        raise ValueError(f"trainings of {sorted({len(t) for t in trainings})} questions against {len(reference)}")
    share = np.asarray(trainings, dtype=float).mean(axis=0)
    lead = share - np.asarray(reference, dtype=float)
    draws = np.random.default_rng(seed).integers(0, len(reference), size=(resamples, len(reference)))
    bounds = [50 * (1 - level), 50 * (1 + level)]
    return {name: tuple(float(v) for v in np.percentile(100 * values[draws].mean(axis=1), bounds))
            for name, values in (("mean", share), ("lead", lead))}
