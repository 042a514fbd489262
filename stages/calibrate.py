"""A short timed calibration, for a plan's runs that this warehouse has never run: the stage's own recipe, on made-up
text of the planned shape, timed for a few steps on this machine and scaled by the run's length.

Only the runs whose time grows with their length are timed this way: bringing in a base (loading it is the run) and
injecting into it (its recipe prepared, then a few of its steps). Nothing is read from or written to the warehouse;
the base is loaded from its source, as base-model would load it."""

from __future__ import annotations

import copy
import functools
import time
from typing import Callable

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from stages.configs import BaseModelConfig, InjectConfig, SalientSpansConfig, StageConfig

TIMED_STEPS = 8  # timed after one step that warms the kernels and the optimizer's state up
MADE_UP_SEGMENTS = 64  # enough for a few batches of any batch size; the cache's work per segment is small
# Prose the made-up segments are cut from: names, years and common words, so that it tokenizes into about as many
# tokens a word as encyclopedic text does.
WORDS = ("The Haverstock bridge over the Ellery river was built in 1874 by Tomasz Wrexley, a mason from Kalveth, after "
         "the long winter; his daughter Ingrid Wrexley became mayor of Port Adley in 1911 and founded its library, "
         "which still lends books to the fishermen of the Sørvik islands and the Quenford valley.").split()


def calibrated(stage: str, config: StageConfig, plan: list[tuple[str, StageConfig]]) -> tuple[float | None, str]:
    """(seconds, what they come from) of a run of `stage` timed here on made-up text, or (None, "") for a stage
    that is not timed this way or a base that is pretrained here rather than brought."""
    timer = TIMERS.get(stage)
    try:
        return timer(config, plan) if timer else (None, "")
    except (ValueError, OSError, RuntimeError):  # a base that does not load here: its own run says why, not the plan
        return None, ""


def _base_of(name: str, plan) -> BaseModelConfig | None:
    """The plan's base-model run that makes base `name`, if it brings one in."""
    return next((c for s, c in plan if s == "base-model" and c.name == name and c.source), None)


def loaded_base(base: BaseModelConfig) -> tuple[object, object, float]:
    """(model, tokenizer, seconds the load took) of a brought base, loaded once for the whole plan."""
    if base.source not in LOADED:
        from stages.sources import resolve_source
        from stages.training import load_brought_model
        source = resolve_source(base.source)
        started = time.perf_counter()
        model, tokenizer, _ = load_brought_model(base, source, source.is_file() and source.suffix == ".gguf")
        LOADED[base.source] = model, tokenizer, time.perf_counter() - started
    return LOADED[base.source]


LOADED: dict[str, tuple[object, object, float]] = {}


def base_model_seconds(config: BaseModelConfig, plan) -> tuple[float | None, str]:
    """Bringing a base in is loading it (and writing it once): the load, timed."""
    if not config.source:
        return None, ""
    seconds = loaded_base(config)[2]
    return seconds, f"loaded here in {seconds:.0f} s"


def inject_seconds(config: InjectConfig, plan) -> tuple[float | None, str]:
    """The recipe's preparation plus its time per step times `steps`, from `inject_timing`."""
    timing = inject_timing(config, plan)
    if timing is None:
        return None, ""
    preparing, per_step = timing
    seconds = preparing + per_step * config.steps
    return seconds, f"{TIMED_STEPS} steps timed here on made-up text: {per_step:.2f} s a step"


def inject_timing(config: InjectConfig, plan) -> tuple[float, float] | None:
    """(seconds the recipe takes to prepare, seconds a step) of an injection into a brought base, timed here on
    made-up segments: the base's own text written, the cache built, then TIMED_STEPS steps after a first; None for
    a base pretrained here."""
    base = _base_of(config.base_model, plan)
    if base is None:
        return None
    from nkb_model.families import family
    from nkb_model.injection import Injection
    from nkb_model.train import choose_device, train
    loaded, tokenizer, _ = loaded_base(base)
    model = copy.deepcopy(loaded)  # the method is mounted on it; the next run of the plan starts from the base
    spans = next((c for s, c in plan if s == "salient-spans" and c.corpus == config.corpus), SalientSpansConfig())
    device = choose_device(config.device, config.precision)
    started = time.perf_counter()
    prepared = Injection(config, made_up_data(config, spans.max_words, family(model), tokenizer),
                         device).prepare(model, tokenizer)
    ends: list[float] = []

    def timed() -> None:
        if prepared.after_step:
            prepared.after_step()
        ends.append(time.perf_counter())
    train(prepared.module, prepared.batches, config.train_config(1 + TIMED_STEPS), device,
          progress=functools.partial(tqdm, disable=True), after_step=timed)  # no bar: it is part of printing a plan
    per_step = (ends[-1] - ends[0]) / TIMED_STEPS
    return ends[0] - started - per_step, per_step  # the first step is a step too


def made_up_data(config: InjectConfig, max_words: int, kind, tokenizer):
    """InjectionData of the planned shape: MADE_UP_SEGMENTS segments of `max_words` words, each with two salient
    spans (so that a cued span has its cue), as many questions, and general text rows, where the settings read
    them."""
    from nkb_model.injection import InjectionData
    from stages.training import GENERAL_SEQ_LEN, ssm_draws
    texts = [" ".join(WORDS[(i + k) % len(WORDS)] for k in range(max_words)) + "."
             for i in range(MADE_UP_SEGMENTS)]
    ids = [f"made-up-{i}" for i in range(MADE_UP_SEGMENTS)]
    segments = pa.table({"segment_id": ids, "text": texts})
    words = [_span_words(t) for t in texts]
    unrepeated = config.model_copy(update={"skip_repeated_spans": False})  # made-up text repeats its words
    spans = pa.table({"segment_id": [i for i in ids for _ in range(2)],
                      "start_char": [start for pair in words for start, _ in pair],
                      "end_char": [end for pair in words for _, end in pair]})
    questions = ([f"Who {t[:-1].lower()}?" for t in texts], [t.split(" ")[-1][:-1] for t in texts])
    general = None
    if config.general_share or config.sparse_slots:
        tokens = tokenizer(" ".join(texts))["input_ids"]
        reps = -(-GENERAL_SEQ_LEN * MADE_UP_SEGMENTS // len(tokens))
        general = np.array((tokens * reps)[:GENERAL_SEQ_LEN * MADE_UP_SEGMENTS]).reshape(-1, GENERAL_SEQ_LEN)
    return InjectionData(ids, texts, ssm_draws(segments, spans, unrepeated, kind),
                         questions if config.qa_share else None, general,
                         [[t] for t in texts] if config.qa_share and config.qa_teacher else None)


def _span_words(text: str) -> list[tuple[int, int]]:
    """(start, end) of a segment's two made-up spans: its second word and its middle word (after it, so cued)."""
    words = text.split(" ")
    starts = [sum(len(w) + 1 for w in words[:k]) for k in range(len(words))]
    return [(starts[k], starts[k] + len(words[k])) for k in (1, len(words) // 2)]


TIMERS: dict[str, Callable] = {"base-model": base_model_seconds, "inject": inject_seconds}
