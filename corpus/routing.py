"""Routing by retrieval: the slots asked only where a text matches the knowledge they hold.

A text (a question, a cloze prompt, a held-out passage) is routed to the slots when its best BM25 match in the
knowledge's Lucene index scores at least a threshold, and to the base (the slots unmounted, which is exactly the
base) otherwise. The threshold comes from the train split's questions, which are about the knowledge by
construction: the lowest best-match score among them (a question drawn as they were falls below it with probability
about 1 / (train questions + 1)). A question that shares no rare term with the knowledge (`The capital of France
is` against the sample world, whose only match is the word `capital`) scores a fraction of what a question naming
one of the knowledge's subjects does.

The threshold is set on questions, so a text is scored on stretches of a question's length: one longer than the
longest train question scores the best of its stretches of that many words (`routing_window`). BM25 sums over a
query's terms, and a whole 50-word text piles up score from common words alone: the sample world's index gave 10 of
128 texts the base writes itself (numbers, `generation`, `surgeon`) a score above the lowest train question's, and
none of them a 7-word stretch that reaches it. Texts as short as the questions (questions, probes, the capitals'
prompts) are scored whole, as before.

What routing can and cannot do: it keeps what the base knew of everything the knowledge does not mention, exactly;
it does nothing for text the knowledge does mention (a Wikipedia-wide knowledge mentions nearly everything).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

ROUTE_FRACTION = 1.0  # of the lowest train question's best score; lower routes more to the slots


def best_scores(searcher, texts: Sequence[str], window: int | None = None) -> np.ndarray:
    """Each text's best BM25 score in `searcher`'s index (0 where nothing matches); with `window`, the best over the
    text's `stretches` of that many words."""
    def best(text: str) -> float:
        return next((hit.score for hit in searcher.search(text, 1)), 0.0) if text.strip() else 0.0
    return np.array([max(map(best, stretches(text, window))) if window else best(text) for text in texts],
                    dtype=float)


def stretches(text: str, window: int) -> list[str]:
    """The text whole if it has at most `window` words, else its runs of `window` words, half a window apart, the
    last ending with the text."""
    words = text.split()
    if len(words) <= window:
        return [text]
    step = max(1, window // 2)
    starts = list(range(0, len(words) - window, step)) + [len(words) - window]
    return [" ".join(words[i:i + window]) for i in starts]


def routing_window(train_questions: Sequence[str]) -> int:
    """The stretch a text is scored on: the longest train question's words (each train question scores whole)."""
    if not len(train_questions):
        raise ValueError("routing needs the train split's questions to set its threshold; the split has none")
    return max(len(q.split()) for q in train_questions)


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
