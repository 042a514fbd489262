"""A real Lucene index built in a temp dir; expected ids and scores are kept in data/bm25_tiny.json."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from corpus import bm25

pytestmark = pytest.mark.slow  # every test starts Lucene's JVM or builds an index

DATA = json.loads((Path(__file__).parent / "data" / "bm25_tiny.json").read_text())


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory):
    root = tmp_path_factory.mktemp("bm25")
    bm25.write_json_collection(DATA["documents"], root / "collection")
    bm25.build_index(root / "collection", root / "index", threads=1)
    return root / "index"


def test_exact_top_docs_and_scores(tiny_index):
    with bm25.Searcher(tiny_index, k1=DATA["k1"], b=DATA["b"]) as searcher:
        assert searcher.num_docs == len(DATA["documents"])
        for qid, query in DATA["queries"].items():
            got = [[h.doc_id, h.score] for h in searcher.search(query, DATA["k"])]
            expected = DATA["expected"][qid]
            assert [d for d, _ in got] == [d for d, _ in expected], qid
            assert [s for _, s in got] == pytest.approx([s for _, s in expected], abs=1e-4), qid


def test_searching_prints_no_lucene_version_warning(tiny_index):
    # A fresh process: the warning comes once per JVM, when Lucene first opens an index.
    script = (f"from corpus import bm25\nwith bm25.Searcher({str(tiny_index)!r}) as s:\n"
              f"    print(s.search({next(iter(DATA['queries'].values()))!r}, 1)[0].doc_id)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == DATA["expected"][next(iter(DATA["queries"]))][0][0]
    assert "Apache Lucene" not in out.stderr and "WARNING" not in out.stderr, out.stderr


def test_batch_search_equals_one_by_one(tiny_index):
    with bm25.Searcher(tiny_index) as searcher:
        qids, queries = list(DATA["queries"]), list(DATA["queries"].values())
        batch = searcher.batch_search(queries, qids, k=3, threads=2)
        for qid, query in zip(qids, queries):
            assert batch.get(qid, []) == searcher.search(query, 3)


def test_stored_extras_change_the_size_not_the_ranking(tiny_index, tmp_path):
    """The index keeps BM25's postings only (the fixture's); positions, document vectors and raw text are opt-in."""
    bm25.build_index(tiny_index.parent / "collection", tmp_path / "full", threads=1, store=list(bm25.STORED))
    size = {name: sum(f.stat().st_size for f in d.rglob("*")) for name, d in (("lean", tiny_index),
                                                                              ("full", tmp_path / "full"))}
    assert size["full"] > 1.5 * size["lean"]
    with bm25.Searcher(tiny_index) as lean, bm25.Searcher(tmp_path / "full") as full:
        for query in DATA["queries"].values():
            assert lean.search(query, 5) == full.search(query, 5)


def test_scores_follow_the_bm25_formula(tmp_path):
    """Lucene's BM25 (no k1+1 factor) recomputed by hand for a one-term query on short documents."""
    docs = [("a", "velmora harbour velmora"), ("b", "velmora city"), ("c", "orvel works harbour"),
            ("d", "quint painter velmora born"), ("e", "zixthalkel")]
    bm25.write_json_collection(docs, tmp_path / "c")
    bm25.build_index(tmp_path / "c", tmp_path / "i", threads=1)
    k1, b = 1.2, 0.75
    avgdl = sum(len(t.split()) for _, t in docs) / len(docs)
    n = sum("velmora" in t.split() for _, t in docs)
    idf = math.log(1 + (len(docs) - n + 0.5) / (n + 0.5))
    expected = {d: idf * t.split().count("velmora") / (t.split().count("velmora") + k1 * (1 - b + b * len(t.split()) / avgdl))
                for d, t in docs if "velmora" in t.split()}
    with bm25.Searcher(tmp_path / "i", k1=k1, b=b) as searcher:
        got = {h.doc_id: h.score for h in searcher.search("velmora", 10)}
    assert got == pytest.approx(expected, abs=1e-4)


def test_missing_index_directory(tmp_path):
    with pytest.raises(bm25.LuceneIndexError, match="no such index directory"):
        bm25.Searcher(tmp_path / "nope")


def test_directory_that_is_not_an_index(tmp_path):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file.txt").write_text("x")
    with pytest.raises(bm25.LuceneIndexError, match="not a Lucene index"):
        bm25.Searcher(tmp_path / "junk")


def test_corrupt_index(tiny_index, tmp_path):
    import shutil
    broken = tmp_path / "broken"
    shutil.copytree(tiny_index, broken)
    for f in broken.iterdir():
        if f.name.startswith("segments_"):
            f.write_bytes(b"garbage")
    with pytest.raises(bm25.LuceneIndexError, match="cannot open the Lucene index"):
        bm25.Searcher(broken)
