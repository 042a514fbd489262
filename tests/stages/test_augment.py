"""The augment stage on the sample world: other wordings of the retrieved segments, each row with its source and
method, resumable by shard, and their own salient spans for injection."""

import pytest

from corpus import rewordings
from stages import augment, data
from stages.configs import AugmentConfig, IndexConfig, RetrieveConfig, SalientSpansConfig
from tests.stages.test_retrieval import load_world
from warehouse import list_runs, query

pytestmark = pytest.mark.slow  # a real Lucene index first


def spanned_world(home):
    """The sample world with its retrieved segments and their salient spans: what augment reads."""
    wh = load_world(home)
    data.build_index(wh, IndexConfig())
    data.retrieve(wh, RetrieveConfig())
    data.find_salient_spans(wh, SalientSpansConfig())
    return wh


def test_augmented_segments_name_their_source_and_method_resume_after_a_crash_and_get_their_spans(tmp_path,
                                                                                                  monkeypatch):
    wh = spanned_world(tmp_path / "wh")
    with pytest.raises(ValueError, match="no augmented segments of corpus 'sampleworld'; run the augment stage"):
        data.find_salient_spans(wh, SalientSpansConfig(source="augmented"))
    config = AugmentConfig(methods=["permute", "full_name"], shard_size=10)
    real, calls = augment.augmented_rows, []

    def crash_on_third_shard(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt("simulated crash")
        return real(*args, **kwargs)
    monkeypatch.setattr(augment, "augmented_rows", crash_on_third_shard)
    with pytest.raises(KeyboardInterrupt):
        augment.augment(wh, config)
    assert query(wh, "SELECT count(*) AS n FROM augmented_segments").to_pylist() == [{"n": 0}]
    monkeypatch.setattr(augment, "augmented_rows", real)
    resumed = augment.augment(wh, config)
    assert resumed.value["resumed_shards"] == 2 and [r.status for r in list_runs(wh, stage="augment")] == ["success"]

    rows = query(wh, "SELECT a.*, s.text AS source, s.doc_id AS source_doc FROM augmented_segments a "
                     "JOIN segments s ON s.segment_id = a.source_segment_id ORDER BY a.segment_id").to_pylist()
    spanned = query(wh, "SELECT DISTINCT s.segment_id, s.text FROM segments s JOIN salient_spans p "
                        "USING (segment_id) WHERE s.segment_id NOT LIKE '%~%'").to_pylist()
    several = [r for r in spanned if len(rewordings.sentence_texts(r["text"])) > 1]
    permuted = [r for r in rows if r["method"] == "permute"]
    assert len(permuted) == len(several) > 0  # every segment of two or more sentences, once
    for row in permuted:
        assert row["segment_id"] == row["source_segment_id"] + "~permute" and row["doc_id"] == row["source_doc"]
        assert row["text"] != row["source"]
        assert sorted(rewordings.sentence_texts(row["text"])) == sorted(rewordings.sentence_texts(row["source"]))
    assert resumed.value["written"] == {"permute": len(permuted), "full_name": len(rows) - len(permuted)}
    # what salient-spans reads: the same rows as segments of <corpus>.augmented; their spans found there
    as_segments = query(wh, "SELECT segment_id, text FROM segments WHERE segment_id LIKE '%~%' ORDER BY 1")
    assert as_segments.to_pylist() == [{"segment_id": r["segment_id"], "text": r["text"]} for r in rows]
    data.find_salient_spans(wh, SalientSpansConfig(source="augmented"))
    found = query(wh, "SELECT DISTINCT segment_id FROM salient_spans WHERE segment_id LIKE '%~%'").to_pylist()
    assert len(found) == len(rows)
    assert augment.augment(wh, config).skipped


def test_a_paraphrase_model_that_is_not_there_is_named(tmp_path):
    wh = spanned_world(tmp_path / "wh")
    with pytest.raises(ValueError, match="base model ./no-such.gguf: no such folder or file"):
        augment.augment(wh, AugmentConfig(paraphrase_model="./no-such.gguf"))
