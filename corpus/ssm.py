"""Salient span masking (SSM): training pairs that hide one named entity or date of a segment.

Input: the segment with one salient span replaced by T5's first sentinel. Target: the sentinel, the
span, and the closing sentinel — T5's span-corruption target format. One span is masked per example,
chosen at random per segment from a seed and the epoch number, so each epoch redraws which fact is
asked for while any (seed, epoch) always gives the same examples.

A decoder-only model has no sentinel to fill: its example (`decoder_only=True`) is the segment's text before the
span as input and the span as target, the span recalled from what precedes it (`recall_span`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MASK = "<extra_id_0>"
END = "<extra_id_1>"

SSM_SCHEMA = pa.schema([("segment_id", pa.string()), ("input", pa.string()), ("target", pa.string()),
                        ("start_char", pa.int32()), ("end_char", pa.int32())])


def mask_span(text: str, start: int, end: int) -> tuple[str, str]:
    """(input, target) for masking text[start:end]."""
    return text[:start] + MASK + text[end:], f"{MASK} {text[start:end]} {END}"


def recall_span(text: str, start: int, end: int) -> tuple[str, str]:
    """(input, target) for a causal LM: the text before text[start:end], and the span."""
    return text[:start], text[start:end]


def recall_span_and_rest(text: str, start: int, end: int) -> tuple[str, str]:
    """(input, target) for a causal LM: the text before text[start:end], and the span with the rest of the text."""
    return text[:start], text[start:]


def draw_spans(spans: pa.Table, seed: int, epoch: int) -> pa.Table:
    """One row of `spans` per segment, chosen uniformly at random for this (seed, epoch)."""
    if spans.num_rows == 0:
        return spans
    spans = spans.sort_by([("segment_id", "ascending"), ("start_char", "ascending")])
    ids = spans.column("segment_id").combine_chunks()
    # Start offset and size of each segment's run of spans.
    boundaries = np.flatnonzero(pc.not_equal(ids[1:], ids[:-1]).to_numpy(zero_copy_only=False)) + 1
    starts = np.concatenate([[0], boundaries])
    counts = np.diff(np.concatenate([starts, [len(ids)]]))
    rng = np.random.default_rng([seed, epoch])
    picks = starts + (rng.random(len(starts)) * counts).astype(np.int64)
    return spans.take(pa.array(picks))


def unrepeated_spans(spans: pa.Table, texts: dict[str, str]) -> pa.Table:
    """The spans whose text occurs only once in their segment.

    A span repeated elsewhere in the segment (typically the article's subject, named in every
    sentence) can be copied from the input instead of recalled, so masking it teaches no knowledge;
    on a small corpus those copies would take most of the masking budget.
    """
    keep = [texts.get(seg, "").count(texts.get(seg, "")[start:end]) == 1 for seg, start, end in
            zip(*(spans.column(c).to_pylist() for c in ("segment_id", "start_char", "end_char")))]
    return spans.filter(pa.array(keep, pa.bool_()))


def cued_spans(spans: pa.Table) -> pa.Table:
    """The spans that start after another salient span of their segment has ended.

    A causal LM recalls a span from the text before it; a span with no entity or date before it (typically the
    subject opening its sentence) has nothing to be recalled from, and learning it teaches a model to say the
    corpus's names wherever an answer starts."""
    segments, starts, ends = (spans.column(c).to_pylist() for c in ("segment_id", "start_char", "end_char"))
    first_end: dict[str, int] = {}  # where a segment's earliest-ending span ends: any span from there on has a cue
    for seg, end in zip(segments, ends):
        first_end[seg] = min(end, first_end.get(seg, end))
    return spans.filter(pa.array([start >= first_end[seg] for seg, start in zip(segments, starts)], pa.bool_()))


def ssm_examples(segments: pa.Table, spans: pa.Table, seed: int = 0, epoch: int = 0,
                 skip_repeated: bool = False, decoder_only: bool = False, and_rest: bool = False,
                 cued: bool = False) -> pa.Table:
    """One SSM example per segment that has at least one (maskable) salient span (SSM_SCHEMA).

    skip_repeated: mask only spans whose text occurs once in the segment (see `unrepeated_spans`).
    decoder_only: examples for a decoder-only model (`recall_span`) instead of T5's (`mask_span`); with `and_rest`,
    its target runs on to the segment's end (`recall_span_and_rest`).
    cued: mask only spans that follow another salient span of their segment (see `cued_spans`); the cue may be a
    repeated span that `skip_repeated` leaves out.
    """
    texts = dict(zip(segments.column("segment_id").to_pylist(), segments.column("text").to_pylist()))
    spans = spans.select(["segment_id", "start_char", "end_char"])
    if cued:
        spans = cued_spans(spans)
    if skip_repeated:
        spans = unrepeated_spans(spans, texts)
    chosen = draw_spans(spans, seed, epoch)
    rows = {name: [] for name in SSM_SCHEMA.names}
    for seg, start, end in zip(*(chosen.column(c).to_pylist() for c in ("segment_id", "start_char", "end_char"))):
        text = texts.get(seg)
        if text is None:
            continue
        example = (recall_span_and_rest if and_rest else recall_span) if decoder_only else mask_span
        inp, tgt = example(text, start, end)
        for name, value in zip(SSM_SCHEMA.names, (seg, inp, tgt, start, end)):
            rows[name].append(value)
    return pa.table(rows, schema=SSM_SCHEMA)
