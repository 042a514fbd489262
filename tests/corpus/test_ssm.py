import pyarrow as pa

from corpus.ssm import MASK, draw_spans, mask_span, ssm_examples

SEGMENTS = pa.table({"segment_id": ["a#0", "b#0", "c#0"],
                     "text": ["Ada Quint was born in Velmora in 1901.", "Orvel Works hired her.", "No entities here."]})
SPANS = pa.table({"segment_id": ["a#0", "a#0", "a#0", "b#0"], "start_char": [0, 22, 33, 0],
                  "end_char": [9, 29, 37, 11], "label": ["PERSON", "GPE", "DATE", "ORG"],
                  "text": ["Ada Quint", "Velmora", "1901", "Orvel Works"]})


def unmask(input_text: str, target: str) -> str:
    """The segment an SSM pair was made from: the target's span back in place of the mask."""
    span = target.removeprefix(MASK + " ").removesuffix(" <extra_id_1>")
    return input_text.replace(MASK, span, 1)


def test_mask_span_format():
    assert mask_span("Ada Quint was born in Velmora.", 22, 29) == (
        f"Ada Quint was born in {MASK}.", "<extra_id_0> Velmora <extra_id_1>")


def test_pairs_reconstruct_their_segment():
    texts = dict(zip(SEGMENTS["segment_id"].to_pylist(), SEGMENTS["text"].to_pylist()))
    for epoch in range(5):
        ex = ssm_examples(SEGMENTS, SPANS, seed=1, epoch=epoch)
        assert ex["segment_id"].to_pylist() == ["a#0", "b#0"]  # segments without spans yield nothing
        for row in ex.to_pylist():
            assert row["input"].count(MASK) == 1
            assert unmask(row["input"], row["target"]) == texts[row["segment_id"]]


def test_draw_is_seeded_and_redrawn_per_epoch():
    draws = [tuple(draw_spans(SPANS, seed=3, epoch=e)["start_char"].to_pylist()) for e in range(30)]
    assert draws == [tuple(draw_spans(SPANS, seed=3, epoch=e)["start_char"].to_pylist()) for e in range(30)]
    assert len({d[0] for d in draws}) == 3, "every span of a#0 is masked in some epoch"
    assert all(d[1] == 0 for d in draws)


def test_a_decoder_only_example_recalls_the_span_alone_or_with_the_rest_of_its_segment():
    texts = dict(zip(SEGMENTS["segment_id"].to_pylist(), SEGMENTS["text"].to_pylist()))
    alone = ssm_examples(SEGMENTS, SPANS, seed=1, decoder_only=True).to_pylist()
    rest = ssm_examples(SEGMENTS, SPANS, seed=1, decoder_only=True, and_rest=True).to_pylist()
    for a, r in zip(alone, rest):
        text = texts[a["segment_id"]]
        assert a["input"] == r["input"] == text[:a["start_char"]]
        assert a["target"] == text[a["start_char"]:a["end_char"]] and r["target"] == text[a["start_char"]:]


def test_cued_examples_recall_only_spans_that_follow_another():
    for epoch in range(10):
        ex = ssm_examples(SEGMENTS, SPANS, seed=1, epoch=epoch, decoder_only=True, cued=True)
        assert ex["segment_id"].to_pylist() == ["a#0"], "b#0's only span opens its segment: nothing cues it"
        assert ex["start_char"][0].as_py() in (22, 33) and ex["input"][0].as_py().startswith("Ada Quint")


def test_a_repeated_span_still_cues_the_spans_after_it():
    segments = pa.table({"segment_id": ["a#0"], "text": ["Ada Quint left Velmora; Ada Quint was 9."]})
    spans = pa.table({"segment_id": ["a#0"] * 3, "start_char": [0, 15, 24], "end_char": [9, 22, 33]})
    for epoch in range(5):
        ex = ssm_examples(segments, spans, seed=0, epoch=epoch, skip_repeated=True, decoder_only=True, cued=True)
        assert ex["start_char"].to_pylist() == [15]
