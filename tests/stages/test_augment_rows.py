"""Which segments the augment stage rewrites, as a function of the segments it reads (no warehouse)."""

from stages import augment
from stages.configs import AugmentConfig


def test_full_name_rewrites_only_the_segments_of_articles_about_a_person():
    segments = [{"segment_id": "p1#0", "doc_id": "p1", "title": "Meet the Press", "person": False,
                 "text": "He took over as moderator in 1991."},
                {"segment_id": "p2#0", "doc_id": "p2", "title": "Claudia Wells", "person": True,
                 "text": "She is best known for her role as Jennifer Parker."}]
    spans = {"p1#0": [(29, 33, "DATE")], "p2#0": [(34, 49, "PERSON")]}
    rows = augment.augmented_rows(segments, spans, AugmentConfig(methods=["full_name"]), None, None, None,
                                  lambda share: None)
    assert rows["source_segment_id"] == ["p2#0"]
    assert rows["text"] == ["Claudia Wells is best known for her role as Jennifer Parker."]


def test_the_progress_of_a_shard_advances_in_whole_segments_and_ends_at_its_size():
    shown = []
    advance = augment.whole_steps(shown.append, 500)
    for _ in range(7):  # seven batches of a shard: shares whose float sum is not exactly 1
        advance(1 / 7)
    assert sum(shown) == 500 and all(isinstance(n, int) and n >= 0 for n in shown)
    advance(1e-9)  # a share past the end moves nothing
    assert sum(shown) == 500
