"""Routing by retrieval: the slots asked only where a text matches the knowledge they hold.

A text (a question, a cloze prompt, a held-out passage) is routed to the slots when its best BM25 match in the
knowledge's Lucene index scores at least a threshold, and to the base (the slots unmounted, which is exactly the
base) otherwise. The threshold comes from the train split's questions, which are about the knowledge by
construction: the lowest best-match score among them (a question drawn as they were falls below it with probability
about 1 / (train questions + 1)). A question that shares no rare term with the knowledge (`The capital of France
is` against the sample world, whose only match is the word `capital`) scores a fraction of what a question naming
one of the knowledge's subjects does.

What routing can and cannot do: it keeps what the base knew of everything the knowledge does not mention, exactly;
it does nothing for text the knowledge does mention (a Wikipedia-wide knowledge mentions nearly everything).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

ROUTE_FRACTION = 1.0  # of the lowest train question's best score; lower routes more to the slots


def best_scores(searcher, texts: Sequence[str]) -> np.ndarray:
    """Each text's best BM25 score in `searcher`'s index (0 where nothing matches)."""
    return np.array([next((hit.score for hit in searcher.search(text, 1)), 0.0) if text.strip() else 0.0
                     for text in texts], dtype=float)


def routing_threshold(train_scores: Sequence[float], fraction: float = ROUTE_FRACTION) -> float:
    """The score a text needs to be asked of the slots: `fraction` of the lowest of the train questions' best
    scores (`best_scores` of the questions the slots were trained beside)."""
    if not len(train_scores):
        raise ValueError("routing needs the train split's questions to set its threshold; the split has none")
    if not 0 < fraction <= 1:
        raise ValueError(f"the routing fraction must be in (0, 1], not {fraction}")
    return fraction * float(np.min(train_scores))


def routed(to_slots: Sequence[bool], slots: Sequence, base: Sequence) -> list:
    """Per item, the slots' result where it is routed to them and the base's elsewhere."""
    if not len(to_slots) == len(slots) == len(base):
        raise ValueError(f"routing needs one decision per item: {len(to_slots)} decisions, {len(slots)} results "
                         f"with the slots, {len(base)} without")
    return [s if r else b for r, s, b in zip(to_slots, slots, base)]
