"""index, retrieve and salient-spans on a small sample world (real Lucene, real spaCy)."""

import json
import shutil

import pytest

from corpus.ssm import ssm_examples
from stages import data
from stages.configs import IndexConfig, RetrieveConfig, SalientSpansConfig, SampleWorldConfig
from tests.corpus.test_ssm import unmask
from warehouse import Warehouse, list_runs, query

pytestmark = pytest.mark.slow  # every test searches a real Lucene index (the JVM and an index build first)

WORLD = SampleWorldConfig(people=15, background_people=5)


def load_world(home) -> Warehouse:
    wh = Warehouse(home)
    data.load_sample_world(wh, WORLD, general=False)  # one corpus: the stages find it themselves
    return wh


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    wh = load_world(tmp_path_factory.mktemp("built") / "wh")
    data.build_index(wh, IndexConfig())
    data.retrieve(wh, RetrieveConfig())
    data.find_salient_spans(wh, SalientSpansConfig(shard_size=40))
    return wh


def test_every_question_gets_ranked_top_k(built):
    rows = query(built, "SELECT question_id, rank, score FROM retrievals ORDER BY question_id, rank").to_pylist()
    by_question = {}
    for r in rows:
        by_question.setdefault(r["question_id"], []).append(r)
    assert len(by_question) == query(built, "SELECT count(*) AS n FROM questions").to_pylist()[0]["n"]
    for hits in by_question.values():
        assert 1 <= len(hits) <= 3
        assert [h["rank"] for h in hits] == list(range(1, len(hits) + 1))
        scores = [h["score"] for h in hits]
        assert scores == sorted(scores, reverse=True)


def test_answer_recall_at_3_is_high(built):
    recalls = query(built, "SELECT dataset, split, value FROM metrics WHERE metric = 'answer_recall@3'").to_pylist()
    assert len(recalls) == 6 and min(r["value"] for r in recalls) >= 0.9


def test_each_retrieved_document_is_segmented_once(built):
    retrieved = set(query(built, "SELECT DISTINCT doc_id FROM retrievals").column("doc_id").to_pylist())
    segments = query(built, "SELECT segment_id, doc_id, text FROM segments").to_pylist()
    assert {s["doc_id"] for s in segments} == retrieved
    assert len({s["segment_id"] for s in segments}) == len(segments)
    assert max(len(s["text"].split()) for s in segments) <= 300


def test_span_offsets_point_at_the_span_text(built):
    texts = {s["segment_id"]: s["text"] for s in query(built, "SELECT segment_id, text FROM segments").to_pylist()}
    spans = query(built, "SELECT * FROM salient_spans").to_pylist()
    assert len(spans) > 100
    for s in spans:
        assert texts[s["segment_id"]][s["start_char"]:s["end_char"]] == s["text"]
    assert {"PERSON", "ORG", "DATE", "GPE"} <= {s["label"] for s in spans}


def test_ssm_pairs_reconstruct_their_segments(built):
    segments, spans = built.read("segments"), built.read("salient_spans")
    texts = dict(zip(segments["segment_id"].to_pylist(), segments["text"].to_pylist()))
    for row in ssm_examples(segments, spans, seed=5, epoch=2).to_pylist():
        assert unmask(row["input"], row["target"]) == texts[row["segment_id"]]
    for row in query(built, "SELECT segment_id, input, target FROM ssm_examples").to_pylist():
        assert unmask(row["input"], row["target"]) == texts[row["segment_id"]]


def test_reruns_are_skipped(built):
    assert data.build_index(built, IndexConfig()).skipped
    assert data.retrieve(built, RetrieveConfig()).skipped
    assert data.find_salient_spans(built, SalientSpansConfig(shard_size=40)).skipped


def test_index_is_rebuilt_when_documents_change(tmp_path):
    wh = load_world(tmp_path / "wh")
    first = data.build_index(wh, IndexConfig())
    data.ingest(wh, data.sample_world_inputs(wh)[0][0].model_copy(update={"limit": 20}))
    second = data.build_index(wh, IndexConfig())
    assert not second.skipped and second.value["documents"] == 20
    assert second.run.checkpoint != first.run.checkpoint
    directory, meta = data.latest_index(wh, "sampleworld")
    assert str(directory) == second.run.checkpoint and meta["documents"] == 20


@pytest.mark.parametrize("damage", ["delete", "corrupt"])
def test_missing_or_corrupt_index_gives_a_clear_error_and_no_retrievals(tmp_path, damage):
    from corpus.bm25 import LuceneIndexError
    wh = load_world(tmp_path / "wh")
    index = data.build_index(wh, IndexConfig()).run.checkpoint
    if damage == "delete":
        shutil.rmtree(index)
        expected = (ValueError, "missing or incomplete")
    else:
        for f in list(__import__("pathlib").Path(index).glob("segments_*")):
            f.write_bytes(b"garbage")
        expected = (ValueError, r"is damaged: its file segments_\w+ differs from what was built; rebuild it with "
                                r"`nkb run index --set corpus=sampleworld --force`")
    with pytest.raises(expected[0], match=expected[1]):
        data.retrieve(wh, RetrieveConfig())
    assert query(wh, "SELECT count(*) AS n FROM retrievals").to_pylist() == [{"n": 0}]
    assert not list(wh.tables_dir.glob("retrievals/*.parquet"))
    rebuilt = data.build_index(wh, IndexConfig())  # the index stage sees the damage: rebuilt, not skipped
    assert not rebuilt.skipped and rebuilt.run.checkpoint == index
    assert data.retrieve(wh, RetrieveConfig()).run.outputs["retrievals"] > 0


def test_a_lucene_error_is_one_line_without_a_java_stack_trace(tmp_path, capfd):
    """An index damaged in a way its recorded digests cannot tell (they are gone) still fails in one line."""
    from corpus.bm25 import LuceneIndexError
    wh = load_world(tmp_path / "wh")
    index = __import__("pathlib").Path(data.build_index(wh, IndexConfig()).run.checkpoint)
    meta = json.loads((index / data.INDEX_META).read_text())
    (index / data.INDEX_META).write_text(json.dumps({k: v for k, v in meta.items() if k != "files"}))
    for f in index.glob("segments_*"):
        f.write_bytes(b"garbage")
    with pytest.raises(LuceneIndexError, match="cannot open the Lucene index"):
        data.retrieve(wh, RetrieveConfig())
    assert "\tat org.apache" not in capfd.readouterr().err


def test_salient_spans_resume_after_a_crash(tmp_path, monkeypatch):
    from corpus import ner
    wh = load_world(tmp_path / "wh")
    data.build_index(wh, IndexConfig())
    data.retrieve(wh, RetrieveConfig())
    config = SalientSpansConfig(shard_size=10)
    real = ner.salient_spans
    calls = {"n": 0}

    def crash_on_third_shard(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated crash")
        return real(*args, **kwargs)

    monkeypatch.setattr(ner, "salient_spans", crash_on_third_shard)
    with pytest.raises(KeyboardInterrupt):
        data.find_salient_spans(wh, config)
    assert query(wh, "SELECT count(*) AS n FROM salient_spans").to_pylist() == [{"n": 0}]
    failed = list_runs(wh, stage="salient-spans")[0]
    assert failed.status == "failed"

    monkeypatch.setattr(ner, "salient_spans", real)
    resumed = data.find_salient_spans(wh, config)
    assert resumed.value["resumed_shards"] == 2 and resumed.run.run_id == failed.run_id
    assert [r.status for r in list_runs(wh, stage="salient-spans")] == ["success"]
    assert data.find_salient_spans(wh, config).skipped  # the resumed run's rows are all its own
    got = query(wh, "SELECT * EXCLUDE (run_id) FROM salient_spans ORDER BY ALL").to_pylist()

    fresh = data.find_salient_spans(wh, config, force=True)
    assert fresh.value["resumed_shards"] == 0
    assert query(wh, "SELECT * EXCLUDE (run_id) FROM salient_spans ORDER BY ALL").to_pylist() == got
    assert not list(wh.tables_dir.glob("*/.staging/*")) and not list(wh.tables_dir.glob(".resume-*"))

