"""The report's routed rows (`routed`): base+NKB asked of its slots only where a text matches the knowledge, of the
base elsewhere (`corpus.routing`), once per way the row is asked in a prompt (a fine-tuned row's model without its
slots is not the fine-tuned base).

Unmounted slots leave exactly the base (the report checks it on every injected model), so the routed row's answer to
a text routed away is the base's own: the row combines base+NKB's and the base's answers, probe hits and fact hits
text by text, and its held-out loss is the slots' loss on the rows routed to them with the unmounted model's on the
others, each row's read off one pass of each model over them all. The texts routed are each question, each probe's
prompt and each fact's prompt without the blank, and each held-out row as the tokenizer reads it back.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from corpus.routing import ROUTE_FRACTION, best_scores, routed, routing_threshold, routing_window
from stages.configs import MAIN_ROW
from warehouse import Warehouse, list_runs, query

BLANK = "<extra_id_0>"


@dataclass(frozen=True)
class Router:
    """Which texts go to the slots: those whose best BM25 score in `index_id`, over stretches of `window` words,
    reaches `threshold`."""
    searcher: object
    threshold: float
    window: int
    index_id: str

    def __call__(self, texts: list[str]) -> np.ndarray:
        return best_scores(self.searcher, texts, self.window) >= self.threshold

    def prompts(self, items: list[dict]) -> np.ndarray:
        """The decisions for cloze items (probes, facts): their prompts with the blank left out."""
        return self([i["prompt"].replace(BLANK, " ") for i in items])


@contextlib.contextmanager
def open_router(wh: Warehouse, fraction: float = ROUTE_FRACTION) -> Iterator[Router]:
    """The router over the index the newest retrieve run searched, its threshold `fraction` of the lowest train
    question's best score, its window the longest train question."""
    from corpus.bm25 import Searcher
    from stages.data import latest_index
    retrieved = next((r for r in list_runs(wh, stage="retrieve") if r.status == "success"), None)
    if retrieved is None:
        raise ValueError("routed: the report routes by the index the questions were retrieved from; run retrieve "
                         "first")
    directory, meta = latest_index(wh, retrieved.config["corpus"])
    with Searcher(directory, k1=meta["k1"], b=meta["b"]) as searcher:
        train = query(wh, "SELECT question FROM questions WHERE split = 'train'").column("question").to_pylist()
        yield Router(searcher, routing_threshold(best_scores(searcher, train), fraction), routing_window(train),
                     meta["index_id"])


def routed_loss(to_slots: np.ndarray, slots, base) -> float:
    """The routed held-out loss from two models' `RowLosses` on the same rows: the slots' on the rows routed to them,
    the base's on the others, over every row's tokens."""
    return float(np.where(to_slots, slots.sums, base.sums).sum() / base.tokens.sum())


def routed_label(shown: str) -> str:
    """`base+NKB (0-shot)` → `base+NKB routed (0-shot)`."""
    return shown.replace(MAIN_ROW.label, f"{MAIN_ROW.label} routed", 1)


@dataclass(frozen=True)
class Routes:
    """Where each of the report's texts goes (True: the slots), decided once for every routed row."""
    questions: dict[tuple[str, str], bool]   # (dataset, question_id)
    probes: dict[str, np.ndarray]            # by wording, in the order of the report's probes of that wording
    facts: np.ndarray

    def by_kind(self) -> dict[str, np.ndarray]:
        """Each kind of text's decisions as one array (the probes of every wording together)."""
        return {"questions": np.array(list(self.questions.values()), bool),
                "probes": np.concatenate([np.zeros(0, bool), *self.probes.values()]), "facts": self.facts}

    def summary(self, router: Router, held_out: np.ndarray | None = None) -> str:
        """How many of each kind of text the router sends to the slots, with the held-out rows (`held_out`: their
        decisions, where the routed held-out loss was measured)."""
        kinds = self.by_kind() | ({"held-out rows": held_out} if held_out is not None else {})
        return (f"threshold {router.threshold:.3f} (the lowest train question's best BM25 score, over stretches of "
                f"{router.window} words, index {router.index_id}): to the slots "
                + ", ".join(f"{int(d.sum())} of {len(d)} {what}" for what, d in kinds.items() if len(d)))


def route_texts(wh: Warehouse, router: Router, split: str, probes: dict[str, list[dict]],
                facts: list[dict]) -> Routes:
    """The router's decision for each of the split's questions, each probe (`probes`: by wording) and each fact."""
    questions = query(wh, f"SELECT dataset, question_id, question FROM questions WHERE split = '{split}'").to_pylist()
    to_slots = router([q["question"] for q in questions])
    return Routes({(q["dataset"], q["question_id"]): bool(r) for q, r in zip(questions, to_slots)},
                  {wording: router.prompts(items) for wording, items in probes.items()},
                  router.prompts(facts) if facts else np.zeros(0, bool))


def routed_answers(wh: Warehouse, routes: Routes, slots: str, base: str, split: str) -> tuple[dict, dict]:
    """({dataset: EM}, {dataset, question_id, exact_match} lists) of the routed row asked as `slots` (base+NKB's
    evaluated name) and `base` (the base's, asked the same way) were."""
    def hits(name):
        got = wh.read("predictions", ["dataset", "question_id", "exact_match"],
                      partitions=[f"{name}.{split}"]).to_pydict()
        return {(d, q): h for d, q, h in zip(got["dataset"], got["question_id"], got["exact_match"])}
    mine, theirs = hits(slots), hits(base)
    keys = [k for k in mine if k in theirs]
    combined = routed([routes.questions[k] for k in keys], [mine[k] for k in keys], [theirs[k] for k in keys])
    ems = {d: 100.0 * float(np.mean([h for k, h in zip(keys, combined) if k[0] == d]))
           for d in sorted({k[0] for k in keys})}
    return ems, {"dataset": [k[0] for k in keys], "question_id": [k[1] for k in keys], "exact_match": combined}


def routed_checks(routes: Routes, slots: dict, base: dict) -> dict:
    """The routed row's checks from base+NKB's (`slots`) and the base's: probe (unseen, then seen wording) and fact
    hits combined item by item, the held-out loss routed; parameters, training time and run are base+NKB's."""
    def rate(to_slots, mine, theirs):
        return 100.0 * float(np.mean(routed(to_slots, mine, theirs)))
    out = dict(slots, heldout_loss=slots["heldout_loss_routed"])
    for key, (wording, to_slots) in zip(("probe_em", "probe_seen_em"), routes.probes.items()):
        if wording in slots["probe_hits"] and wording in base["probe_hits"]:
            out[key] = rate(to_slots, slots["probe_hits"][wording], base["probe_hits"][wording])
    if slots["fact_hits"] and base["fact_hits"]:
        out["retained_em"] = rate(routes.facts, slots["fact_hits"], base["fact_hits"])
    return out
