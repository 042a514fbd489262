"""Data stages: the sample world, corpora and QA datasets into tables, the BM25 index, retrieval, salient spans.

Like every stage, each is a plain function `stage(wh, config, force) -> StageResult` that declares what it reads
(`stages.reads`), from which its inputs fingerprint follows, runs atomically via `warehouse.run_stage`, and is
skipped when the same inputs already succeeded.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel

from corpus import documents as docs
from corpus import qa
from corpus import sample_world
from corpus.errors import InputFileError, require_file
from corpus.files import matching_files, repeats
from corpus.knowledge_questions import knowledge_questions
from stages import reads
from stages.configs import (GenerationDataConfig, IndexConfig, IngestConfig, JoinCorporaConfig,
                            KnowledgeQuestionsConfig, QuestionsConfig, RetrieveConfig, SalientSpansConfig,
                            SampleWorldConfig)
from stages.inputs import SEGMENTS_BY, corpora, corpus_lineage, one_corpus, span_partitions, world_dir
from stages.progress import counting, progress
from warehouse import ShardTarget, StagedRun, StageResult, Warehouse, file_digest, list_runs

# A Parquet row group of `documents`: whichever limit comes first.
BATCH_DOCS, BATCH_CHARS = 2000, 8_000_000


# ---- sample-world -----------------------------------------------------------------------------

def generate_sample_world(wh: Warehouse, config: SampleWorldConfig, force: bool = False) -> StageResult:
    """Write the sample world's files under `<home>/files/sample-world/`, replacing them atomically."""
    target = world_dir(wh)
    params = config.model_dump()
    # The generator's own code is an input: a changed generator means a different world.
    declared = reads.Declared("sample-world", config, [reads.file(sample_world.__file__)])

    def files_present(run) -> bool:
        return all(p.exists() for p in sample_world.WorldFiles.at(target).all_paths())

    def body(run: StagedRun) -> dict:
        started = time.perf_counter()
        files = run.publish_folder(target, lambda d: sample_world.generate(d, **params))
        n_facts = sum(1 for _ in open(files.facts, encoding="utf-8"))
        run.output("files", len(files.all_paths()))
        run.metric("facts", n_facts)
        return {"dir": str(target), "facts": n_facts, "seconds": time.perf_counter() - started}

    return declared.run(wh, body, force=force, still_valid=files_present)


# ---- stages that read one input file --------------------------------------------------------------

def file_input(stage: str, config, paths: Sequence[str] | None = None, **resolved) -> tuple[str, reads.Declared]:
    """(absolute path, the run declared) of a stage reading the file `config.path` (or the `paths` a pattern
    matched, recorded as `files`). `resolved`: settings the stage derived (e.g. the format from the name), recorded
    and fingerprinted too. The files' content, not their paths, identifies the input: a moved file is not read
    again."""
    if paths is None:
        require_file(config.path)
        paths = [config.path]
    path = os.path.abspath(config.path)
    files = {"files": [os.path.abspath(p) for p in paths]} if len(paths) > 1 or paths[0] != config.path else {}
    return path, reads.Declared(stage, config, [reads.mark(*(file_digest(p) for p in paths))],
                          identity=resolved | {"path": None},
                          record=config.model_dump() | resolved | {"path": path} | files)


def refuse_repeated_ids(path: str, records, what: str) -> None:
    """Stop at the first id that two records share, naming both places (`records` have `local_id`, `where`)."""
    repeated = repeats((r.local_id, r.where) for r in records)
    if repeated:
        key, places = repeated
        raise InputFileError(path, " and ".join(places), f"{what} id {key!r} occurs more than once")


# ---- ingest -------------------------------------------------------------------------------

class IngestPart(BaseModel):
    """One file of a corpus as plain values: what a Dask worker receives (paths, never data). It cleans the file into
    a part that the ingest run copies into the corpus's partition, in file order."""
    path: str
    format: str
    corpus: str
    target: dict  # ShardTarget fields


def document_rows(pages: Iterator[docs.Document], corpus: str) -> Iterator[dict[str, list]]:
    """`documents` rows a Parquet row group at a time: memory is bounded by one group's text."""
    for batch in docs.batched_documents(pages, BATCH_DOCS, BATCH_CHARS):
        yield {"doc_id": [d.doc_id for d in batch], "title": [d.title for d in batch], "text": [d.text for d in batch],
               "corpus": [corpus] * len(batch)}


def ingest_part(job: IngestPart) -> int:
    """Clean one file of a corpus into its part, in one process (a Dask worker's own); returns its documents."""
    return ShardTarget(**job.target).write(document_rows(docs.read_documents(job.path, job.format), job.corpus))


def corpus_format(paths: Sequence[str], given: Optional[str]) -> str:
    """The one format of a corpus's files: `given`, else inferred from each file, which must agree."""
    if given:
        return given
    formats = {p: docs.infer_format(p) for p in paths}
    first = formats[paths[0]]
    for path, fmt in formats.items():
        if fmt != first:
            raise InputFileError(path, None, f"reads as {fmt} where {paths[0]} reads as {first}: one corpus is one "
                                             "format (or set format=)")
    return first


def ingest(wh: Warehouse, config: IngestConfig, force: bool = False,
           map_shards: Optional[Callable[[Callable, list], list[int]]] = None) -> StageResult:
    """Stream a corpus file, or every file a pattern matches in natural order, into `documents`, partition = corpus
    name. `map_shards(ingest_part, parts)` cleans the files elsewhere, one part each (the flow passes a Dask-backed
    one when `config.dask` is set); the parts are copied into the partition in file order: the same result."""
    paths = matching_files(config.path)
    fmt = corpus_format(paths, config.format)
    corpus = config.corpus_name()
    path, declared = file_input("ingest", config, paths, format=fmt, corpus=corpus)
    return declared.run(wh, lambda run: _ingest(run, config, path, paths, fmt, corpus, map_shards), force=force)


def _ingest(run: StagedRun, config: IngestConfig, path: str, paths: list[str], fmt: str, corpus: str,
            map_shards) -> dict:
    started = time.perf_counter()
    # Worker processes cost about a second to start: worth it from roughly 10 MB of XML (1 MB of .bz2).
    size = sum(os.path.getsize(p) for p in paths)
    workers = config.workers or ((os.cpu_count() or 1) if size > 1e6 else 1)
    with run.writer("documents", corpus) as out, progress(desc=f"ingest {corpus}", unit=" pages") as bar:
        if map_shards:
            parts = [IngestPart(path=p, format=fmt, corpus=corpus,
                                target=asdict(run.part_target("documents", f"{corpus}-{i:05d}")))
                     for i, p in enumerate(paths)]
            bar.update(sum(map_shards(ingest_part, parts)))
            for part in parts:
                out.append_file(part.target["path"])
        else:
            pages = itertools.chain.from_iterable(docs.read_documents(p, fmt, workers=workers) for p in paths)
            for rows in document_rows(itertools.islice(pages, config.limit), corpus):
                out.write(rows)
                bar.update(len(rows["doc_id"]))
    if out.rows == 0:
        raise InputFileError(path, None, "no documents found (only redirects, disambiguation or other namespaces?)")
    _refuse_duplicate_documents(run, corpus, path, paths, fmt, workers)
    seconds = time.perf_counter() - started
    run.metric("documents", out.rows, dataset=corpus)
    run.metric("pages_per_second", out.rows / seconds, dataset=corpus)
    return {"corpus": corpus, "documents": out.rows, "files": len(paths), "seconds": seconds, "input_mb": size / 1e6}


def _refuse_duplicate_documents(run: StagedRun, corpus: str, path: str, paths: list[str], fmt: str,
                                workers: int) -> None:
    duplicate = run.first_duplicate("documents", corpus, "doc_id")
    if duplicate is not None:  # found out of core; read the files again to say where (this is rare)
        places = [f"{p}, {d.where}" if len(paths) > 1 else d.where
                  for p in paths for d in docs.read_documents(p, fmt, workers=workers) if d.doc_id == duplicate][:2]
        raise InputFileError(path, " and ".join(places) or None,
                             f"doc id {duplicate!r} occurs more than once in corpus {corpus!r}")


def join_corpora(wh: Warehouse, config: JoinCorporaConfig, force: bool = False) -> StageResult:
    """Several ingested corpora as one: `documents` partition `config.corpus`, their documents in order."""
    ingested = corpora(wh)
    missing = [c for c in config.corpora if c not in ingested]
    if missing:
        raise ValueError(f"no corpus {', '.join(map(repr, missing))} to join; ingested: {', '.join(ingested)}")
    declared = reads.Declared("join-corpora", config, [reads.corpus(wh, c) for c in config.corpora])
    return declared.run(wh, lambda run: _join_corpora(run, wh, config), force=force)


def _join_corpora(run: StagedRun, wh: Warehouse, config: JoinCorporaConfig) -> dict:
    counts = {}
    with run.writer("documents", config.corpus) as out, progress(desc=f"join {config.corpus}", unit=" docs") as bar:
        for name in config.corpora:
            before = out.rows
            for batch in wh.scan("documents", ["doc_id", "title", "text"], partitions=[name]):
                out.write({"doc_id": pc.binary_join_element_wise(f"{name}/", batch.column("doc_id"), ""),
                           "title": batch.column("title"), "text": batch.column("text"),
                           "corpus": pa.array([config.corpus] * batch.num_rows, pa.string())})
                bar.update(batch.num_rows)
            counts[name] = out.rows - before
            run.metric("documents", counts[name], dataset=name)
    run.metric("documents", out.rows, dataset=config.corpus)
    return {"corpus": config.corpus, "documents": out.rows, "from": counts}


# ---- questions ----------------------------------------------------------------------------

def load_questions(wh: Warehouse, config: QuestionsConfig, force: bool = False) -> StageResult:
    """Read one QA split into `questions`, partition = `<dataset>.<split>`; long answers filtered."""
    path, declared = file_input("questions", config)

    def body(run: StagedRun) -> dict:
        started = time.perf_counter()
        read = list(qa.read_questions(path, config.format))
        if not read:
            raise InputFileError(path, None, "no questions found")
        refuse_repeated_ids(path, read, "question")
        warn_of_repeated_questions(path, read)
        kept, dropped = qa.filter_long_answers(read, config.max_answer_tokens)
        run.write("questions", f"{config.dataset}.{config.split}", {
            "question_id": [qa.make_question_id(config.dataset, config.split, q.local_id) for q in kept],
            "dataset": [config.dataset] * len(kept), "split": [config.split] * len(kept),
            "question": [q.question for q in kept], "answers": [list(q.answers) for q in kept]})
        for name, value in (("questions", len(kept)), ("filtered_long_answers", dropped)):
            run.metric(name, value, dataset=config.dataset, split=config.split)
        if dropped:  # said beside the count in the log line: 413 questions (8 dropped: answers over 5 tokens)
            run.output("questions_dropped", f"{dropped} dropped: answers over {config.max_answer_tokens} tokens")
        if config.split != "train" and (margin := em_margin(len(kept))) > SMALL_SPLIT_MARGIN:
            print(f"note: {path}: {len(kept)} {config.split} questions give an EM a 95 % interval of about "
                  f"±{margin:.0f} points: a lead of {SMALL_SPLIT_MARGIN} points cannot be told from noise "
                  f"(about {questions_for(SMALL_SPLIT_MARGIN)} questions can)", file=sys.stderr)
        return {"dataset": config.dataset, "split": config.split, "questions": len(kept), "filtered": dropped,
                "seconds": time.perf_counter() - started}

    return declared.run(wh, body, force=force)


# A split whose EM interval is wider than this (half its width, in points) cannot tell a lead of this size from
# noise: `load_questions` says so.
SMALL_SPLIT_MARGIN = 10


def em_margin(questions: int, em: float = 0.5) -> float:
    """Half the width of an EM's 95 % interval over `questions` questions, in points, at the widest (an EM of 50 %)."""
    return 100 * 1.96 * math.sqrt(em * (1 - em) / max(questions, 1))


def questions_for(margin: float) -> int:
    """The fewest questions whose EM interval is at most ±`margin` points wide."""
    return math.ceil((1.96 * 50 / margin) ** 2)


def warn_of_repeated_questions(path: str, read: list[qa.Question]) -> None:
    """Say when a file asks a question more than once. The copies are kept: each is a line of the user's file and
    may be meant (two wordings that differ in case), but a copy counts twice in an EM and in a train split."""
    repeated = qa.repeated_questions(read)
    if repeated:
        question, places = next(iter(repeated.items()))
        print(f"warning: {path}: {len(repeated)} question{'s' if len(repeated) > 1 else ''} occur"
              f"{'' if len(repeated) > 1 else 's'} more than once, each copy kept and counted (e.g. {question!r} on "
              f"{', '.join(places)}); remove the copies if they are not meant", file=sys.stderr)


def load_generation_data(wh: Warehouse, config: GenerationDataConfig, force: bool = False) -> StageResult:
    """Read one summarisation or translation split into `gen_examples`, partition = `<task>.<split>`."""
    from corpus import generation_data as generation
    path, declared = file_input("generation-data", config)

    def body(run: StagedRun) -> dict:
        started = time.perf_counter()
        langs = (config.source_lang, config.target_lang)
        if config.kind == "translation" and not all(langs):
            langs = generation.translation_languages(path)
        examples = list(itertools.islice(generation.read_examples(path, config.kind, *langs), config.limit))
        if not examples:
            raise InputFileError(path, None, "no examples found")
        refuse_repeated_ids(path, examples, "example")
        ids = [e.local_id for e in examples]
        n = len(examples)
        run.write("gen_examples", f"{config.task}.{config.split}", {
            "example_id": [f"{config.task}/{config.split}/{i}" for i in ids], "task": [config.task] * n,
            "kind": [config.kind] * n, "split": [config.split] * n, "source": [e.source for e in examples],
            "target": [e.target for e in examples], "source_lang": [langs[0]] * n, "target_lang": [langs[1]] * n})
        run.metric("examples", n, dataset=config.task, split=config.split)
        return {"task": config.task, "split": config.split, "examples": n, "seconds": time.perf_counter() - started}

    return declared.run(wh, body, force=force)


# ---- index ----------------------------------------------------------------------------------

INDEX_META = "nkb-index.json"


def build_index(wh: Warehouse, config: IndexConfig, force: bool = False) -> StageResult:
    """Export a corpus to a JsonCollection and build a Lucene index under `files/indexes/`."""
    config = config.model_copy(update={"corpus": one_corpus(wh, config.corpus)})
    declared = reads.Declared("index", config, [reads.corpus(wh, config.corpus, labelled=False)])
    target = wh.files_dir / "indexes" / f"{config.corpus}-{declared.fingerprint[:12]}"

    def intact(run) -> bool:  # a damaged index is rebuilt, not skipped as unchanged
        problem = index_problem(Path(run.checkpoint or ""))
        if problem:
            print(f"index {run.checkpoint}: {problem}; building it again", file=sys.stderr)
        return problem is None

    return declared.run(wh, lambda run: _build_index(run, wh, config, declared.fingerprint[:12], target),
                        force=force, still_valid=intact)


def _build_index(run: StagedRun, wh: Warehouse, config: IndexConfig, index_id: str, target: Path) -> dict:
    from corpus import bm25
    started = time.perf_counter()
    docs = ((d, f"{t}\n{x}") for batch in wh.scan("documents", ["doc_id", "title", "text"],
                                                   filter=pc.field("corpus") == config.corpus)
            for d, t, x in zip(*(batch.column(c).to_pylist() for c in ("doc_id", "title", "text"))))
    tmp = run.scratch(target)  # the exported collection, only needed while the index is built
    with progress(desc=f"export {config.corpus}", unit=" docs") as bar:
        n = bm25.write_json_collection(counting(docs, bar), tmp / "collection")

    def fill(directory: Path) -> float:
        bm25.build_index(tmp / "collection", directory, threads=config.threads, log_path=tmp / "index.log",
                         store=config.store)
        seconds = time.perf_counter() - started
        meta = {"index_id": index_id, "corpus": config.corpus, "k1": config.k1, "b": config.b,
                "documents": n, "built_by": run.run_id, "seconds": seconds, "files": index_files(directory)}
        (directory / INDEX_META).write_text(json.dumps(meta, indent=1))
        return seconds

    seconds = run.publish_folder(target, fill)
    run.record.checkpoint = str(target)
    run.output("indexed_documents", n)
    run.metric("index_docs_per_second", n / seconds, dataset=config.corpus)
    return {"index_id": index_id, "corpus": config.corpus, "documents": n, "seconds": seconds,
            "docs_per_second": round(n / seconds, 1)}


def index_files(directory: Path) -> dict[str, list]:
    """[size, SHA-256, modification time] of each file Lucene wrote: what `index_problem` checks the index against."""
    return {f.name: [f.stat().st_size, file_digest(f), f.stat().st_mtime_ns]
            for f in sorted(directory.iterdir()) if f.is_file()}


def index_problem(directory: Path) -> str | None:
    """What is wrong with a built index's files, checked against what was recorded when it was built (before
    Lucene opens it, whose own error would be a Java stack trace), or None. A file with its recorded size and
    modification time is taken as written; any other is hashed, so that a whole-Wikipedia index is not read through
    at every skip check and retrieval (a write that damages a file moves its time; a copied index is hashed once
    per check). Indexes built before the digests were recorded are only checked for their metadata."""
    meta_path = directory / INDEX_META
    if not meta_path.exists():
        return "it is missing or incomplete"
    recorded = json.loads(meta_path.read_text()).get("files", {})
    for name, (size, digest, *mtime) in recorded.items():
        path = directory / name
        if not path.exists():
            return f"its file {name} is missing"
        stat = path.stat()
        if stat.st_size != size or ([stat.st_mtime_ns] != mtime and file_digest(path) != digest):
            return f"its file {name} differs from what was built"
    return None


def latest_index(wh: Warehouse, corpus: str) -> tuple[Path, dict]:
    """The directory and metadata of the newest successfully built index of a corpus."""
    for run in list_runs(wh, stage="index"):
        if run.status == "success" and run.config.get("corpus") == corpus and run.checkpoint:
            directory = Path(run.checkpoint)
            problem = index_problem(directory)
            if problem:
                raise ValueError(f"index {directory} (run {run.run_id}) is damaged: {problem}; rebuild it with "
                                 f"`nkb run index --set corpus={corpus} --force`")
            return directory, json.loads((directory / INDEX_META).read_text())
    raise ValueError(f"no index for corpus {corpus!r}; build one with `nkb run index --set corpus={corpus}`")


# ---- retrieve ---------------------------------------------------------------------------------

def retrieve(wh: Warehouse, config: RetrieveConfig, force: bool = False) -> StageResult:
    """Top-k BM25 documents per question, one `retrievals` partition per dataset; answer recall@k."""
    config = config.model_copy(update={"corpus": one_corpus(wh, config.corpus)})
    directory, meta = latest_index(wh, config.corpus)
    question_parts = wh.lineage("questions")
    datasets = config.datasets or sorted({name.split(".")[0] for name, _ in question_parts})
    if not datasets:
        raise ValueError("no questions loaded; run the questions stage first")
    declared = reads.Declared("retrieve", config, [reads.mark(meta["index_id"]), reads.partitions(
        (n, fp) for n, fp in question_parts if n.split(".")[0] in datasets)], identity={"datasets": datasets})
    return declared.run(wh, lambda run: _retrieve(run, wh, config, directory, meta, datasets), force=force)


def _retrieve(run: StagedRun, wh: Warehouse, config: RetrieveConfig, directory: Path, meta: dict,
              datasets: list[str]) -> dict:
    from corpus import bm25
    started = time.perf_counter()
    n_questions, search_seconds = 0, 0.0
    with bm25.Searcher(directory, k1=meta["k1"], b=meta["b"]) as searcher:
        for dataset in datasets:
            qs = wh.read("questions", ["question_id", "split", "question", "answers"],
                         filter=pc.field("dataset") == dataset)
            if qs.num_rows == 0:
                raise ValueError(f"no questions for dataset {dataset!r}")
            t = time.perf_counter()
            rows = _search(searcher, config, qs, dataset, meta["index_id"])
            search_seconds += time.perf_counter() - t
            n_questions += qs.num_rows
            run.write("retrievals", dataset, rows)
            for split, recall in _answer_recall(wh, config.corpus, qs, rows).items():
                run.metric(f"answer_recall@{config.k}", recall, dataset=dataset, split=split)
    run.metric("queries_per_second", n_questions / search_seconds)
    return {"index_id": meta["index_id"], "questions": n_questions, "seconds": time.perf_counter() - started,
            "queries_per_second": round(n_questions / search_seconds, 1)}


def _search(searcher, config: RetrieveConfig, questions, dataset: str, index_id: str) -> dict[str, list]:
    """`retrievals` rows of one dataset's questions: the top k documents of each, in batches."""
    ids, texts = questions.column("question_id").to_pylist(), questions.column("question").to_pylist()
    rows = {"question_id": [], "dataset": [], "rank": [], "doc_id": [], "score": [], "index_id": []}
    with progress(desc=f"retrieve {dataset}", unit=" q", total=len(ids)) as bar:
        for lo in range(0, len(ids), config.batch_size):
            hits = searcher.batch_search(texts[lo:lo + config.batch_size], ids[lo:lo + config.batch_size],
                                         k=config.k, threads=config.threads)
            for qid in ids[lo:lo + config.batch_size]:
                for rank, hit in enumerate(hits.get(qid, []), start=1):
                    for key, value in zip(rows, (qid, dataset, rank, hit.doc_id, hit.score, index_id)):
                        rows[key].append(value)
            bar.update(min(config.batch_size, len(ids) - lo))
    return rows


def _answer_recall(wh: Warehouse, corpus: str, questions, rows: dict) -> dict[str, float]:
    """Per split: the share of questions with a gold answer string (case-insensitive) in a retrieved document."""
    doc_ids = sorted(set(rows["doc_id"]))
    docs = wh.read("documents", ["doc_id", "title", "text"],
                   filter=(pc.field("corpus") == corpus) & pc.field("doc_id").isin(doc_ids))
    text = {d: f"{t}\n{x}".lower() for d, t, x in zip(*(docs.column(c).to_pylist() for c in ("doc_id", "title", "text")))}
    retrieved: dict[str, list[str]] = {}
    for qid, doc in zip(rows["question_id"], rows["doc_id"]):
        retrieved.setdefault(qid, []).append(text.get(doc, ""))
    hits: dict[str, list[bool]] = {}
    for qid, split, answers in zip(*(questions.column(c).to_pylist() for c in ("question_id", "split", "answers"))):
        found = any(a.lower() in t for a in answers for t in retrieved.get(qid, []))
        hits.setdefault(split, []).append(found)
    return {split: sum(v) / len(v) for split, v in hits.items()}


# ---- salient spans --------------------------------------------------------------------------

class NerShard(BaseModel):
    """One salient-spans shard as plain values: rows [start, stop) of the staged segments file in, one
    shard file out. What a Dask worker receives (paths, never data)."""
    segments: str
    start: int
    stop: int
    target: dict  # ShardTarget fields
    labels: list[str]
    batch_size: int
    n_process: int
    model: Optional[str] = None


def ner_processes(texts: Sequence[str]) -> int:
    """spaCy worker processes for NER over `texts`: one per CPU core, unless too few texts to pay ~2 s of
    start-up or too short to pay their shipping. With workers the parent serialises every Doc to a worker and
    back (~1.5 ms, mostly srsly looking up its msgpack encoders), so it hands out at most ~1,000 texts/s, and
    below ~20 words a text one process is faster. On 2 cores, 1 vs 2 processes: 13.6K vs 10.4K words/s at 11
    words a text, 14.5K vs 21.7K at 104."""
    if len(texts) <= 2000 or sum(len(t.split()) for t in texts) < 20 * len(texts):
        return 1
    return os.cpu_count() or 1


def ner_shard(job: NerShard, on_segment: Optional[Callable[[], None]] = None) -> int:
    """Run NER over one shard's segments and write its `salient_spans` shard; returns rows written."""
    import pyarrow.parquet as pq
    from corpus import ner
    segments = pq.read_table(job.segments, columns=["segment_id", "text"]).slice(job.start, job.stop - job.start)
    rows: dict[str, list] = {"segment_id": [], "start_char": [], "end_char": [], "label": [], "text": []}
    pairs = zip(segments.column("text").to_pylist(), segments.column("segment_id").to_pylist())
    for seg_id, spans in ner.salient_spans(pairs, job.labels, job.batch_size, job.n_process, job.model):
        for sp in spans:
            for key, value in zip(rows, (seg_id, sp.start_char, sp.end_char, sp.label, sp.text)):
                rows[key].append(value)
        if on_segment:
            on_segment()
    return ShardTarget(**job.target).write(rows)


def ner_shards_here(jobs: list[NerShard]) -> list[int]:
    """Run the shards one after another in this process, with a progress bar over segments."""
    with progress(desc="salient spans", unit=" seg", total=sum(j.stop - j.start for j in jobs)) as bar:
        return [ner_shard(job, lambda: bar.update(1)) for job in jobs]


def find_salient_spans(wh: Warehouse, config: SalientSpansConfig, force: bool = False,
                       map_shards: Optional[Callable[[Callable, list[NerShard]], list[int]]] = None) -> StageResult:
    """NER in resumable shards over a corpus's segments: its retrieved documents, each segmented once into the
    `segments` partition <corpus> here, or the `segments` partition <corpus>.<source> that the pretraining-data
    stage (source=pretraining) or the augment stage (source=augmented) wrote.

    `map_shards(ner_shard, shards)` runs the pending shards elsewhere and returns their row counts (the flow passes
    a Dask-backed one when `config.dask` is set); by default they run in this process. The result is the same."""
    from corpus import ner
    config = config.model_copy(update={"corpus": one_corpus(wh, config.corpus)})
    if config.source == "retrieved":
        partition = config.corpus
        upstream = wh.lineage("retrievals")
        if not upstream:
            raise ValueError("no retrievals; run the retrieve stage first")
        upstream = [("documents", corpus_lineage(wh, config.corpus))] + upstream
    else:
        partition = f"{config.corpus}.{config.source}"
        upstream = [(n, f) for n, f in wh.lineage("segments", partition) if n == partition]
        if not upstream:
            first = SEGMENTS_BY[config.source]
            raise ValueError(f"no {config.source} segments of corpus {config.corpus!r}; run the {first} stage first "
                             f"(nkb run {first} --set corpus={config.corpus})")
    declared = reads.Declared("salient-spans", config, [reads.mark(ner.model_id(config.model)),
                                                        reads.partitions(upstream)])
    return declared.run(wh, lambda run: _find_salient_spans(run, wh, config, partition, map_shards), force=force,
                        resumable=True)


def _find_salient_spans(run: StagedRun, wh: Warehouse, config: SalientSpansConfig, partition: str,
                        map_shards) -> dict:
    started = time.perf_counter()
    if config.source == "retrieved":
        n_documents, seg_texts = _segment_retrieved(wh, run, config)
        segments_file = str(run.staged_path("segments", partition))
    else:
        segments = wh.read("segments", ["text"], partitions=[partition])
        n_documents, seg_texts = None, segments.column("text").to_pylist()
        segments_file = str(wh.partition_path("segments", partition))
    n_process = config.n_process or (ner_processes(seg_texts) if not config.dask else 1)
    shards = run.shards("salient_spans", partition)
    resumed = shards.done_count()
    jobs = [NerShard(segments=segments_file, start=lo, stop=min(lo + config.shard_size, len(seg_texts)),
                     target=asdict(shards.target(index)), labels=config.labels, batch_size=config.batch_size,
                     n_process=n_process, model=config.model)
            for index, lo in enumerate(range(0, len(seg_texts), config.shard_size)) if not shards.is_done(index)]
    t = time.perf_counter()
    for rows in map_shards(ner_shard, jobs) if map_shards else ner_shards_here(jobs):
        shards.count(rows)
    if jobs:
        words = sum(len(x.split()) for job in jobs for x in seg_texts[job.start:job.stop])
        run.metric("ner_words_per_second", words / (time.perf_counter() - t))
    return {"corpus": config.corpus, "source": config.source, "documents": n_documents, "segments": len(seg_texts),
            "shards": len(jobs) + resumed, "resumed_shards": resumed, "seconds": time.perf_counter() - started}


def _segment_retrieved(wh: Warehouse, run: StagedRun, config: SalientSpansConfig) -> tuple[int, list[str]]:
    """Segment every retrieved document of the corpus once, into `segments` (partition = corpus); returns the
    number of documents and the segments' texts, in the order written."""
    from corpus.segment import segment
    doc_ids = sorted(set(wh.read("retrievals", ["doc_id"]).column("doc_id").to_pylist()))
    docs = wh.read("documents", ["doc_id", "text"],
                   filter=(pc.field("corpus") == config.corpus) & pc.field("doc_id").isin(doc_ids)).sort_by("doc_id")
    seg_ids, seg_texts, seg_docs = [], [], []
    for doc_id, text in zip(docs.column("doc_id").to_pylist(), docs.column("text").to_pylist()):
        for i, piece in enumerate(segment(text, config.max_words)):
            seg_ids.append(f"{doc_id}#{i}")
            seg_texts.append(piece)
            seg_docs.append(doc_id)
    run.write("segments", config.corpus, {"segment_id": seg_ids, "doc_id": seg_docs, "text": seg_texts})
    return docs.num_rows, seg_texts


# ---- knowledge questions ----------------------------------------------------------------------

def write_knowledge_questions(wh: Warehouse, config: KnowledgeQuestionsConfig, force: bool = False) -> StageResult:
    """`knowledge_questions` partition = corpus: each salient span of the corpus's retrieved segments that the rest
    of its sentence can ask for (`corpus.knowledge_questions`)."""
    config = config.model_copy(update={"corpus": one_corpus(wh, config.corpus)})
    declared = reads.Declared("knowledge-questions", config, [reads.spans(wh, config.corpus)])
    return declared.run(wh, lambda run: _write_knowledge_questions(run, wh, config.corpus), force=force)


def _write_knowledge_questions(run: StagedRun, wh: Warehouse, corpus: str) -> dict:
    started = time.perf_counter()
    segments, span_parts = span_partitions(wh, corpus)
    spans = wh.read("salient_spans", ["segment_id", "start_char", "end_char", "label"], partitions=span_parts)
    texts = wh.read("segments", ["segment_id", "text"], partitions=[segments])
    rows = knowledge_questions(dict(zip(texts.column("segment_id").to_pylist(), texts.column("text").to_pylist())),
                               zip(*(spans.column(c).to_pylist() for c in spans.column_names)))
    if not rows:
        raise ValueError(f"no salient span of {corpus!r} can be asked for by the rest of its sentence "
                         f"({spans.num_rows} spans)")
    asked = Counter()  # questions so far by segment: a question's id is its segment's and its number there
    ids = []
    for row in rows:
        ids.append(f"{row['segment_id']}~q{asked[row['segment_id']]}")
        asked[row["segment_id"]] += 1
    run.write("knowledge_questions", corpus, {"question_id": ids, **{c: [r[c] for r in rows] for c in
                                                                      ("segment_id", "question", "answer", "label")}})
    run.metric("knowledge_questions", len(rows), dataset=corpus)
    return {"corpus": corpus, "spans": spans.num_rows, "questions": len(rows), "seconds": time.perf_counter() - started}


def load_sample_world(wh: Warehouse, config: SampleWorldConfig, general: bool = True) -> list[StageResult]:
    """Generate a sample world and load its corpora and questions (the pipeline's first stages, in-process)."""
    results = [generate_sample_world(wh, config)]
    ingests, questions = sample_world_inputs(wh)
    results += [ingest(wh, c) for c in (ingests if general else ingests[:1])]
    results += [load_questions(wh, c) for c in questions]
    results += [load_generation_data(wh, c) for c in generation_inputs(wh)]
    return results


def sample_world_inputs(wh: Warehouse) -> tuple[list[IngestConfig], list[QuestionsConfig]]:
    """The ingest and questions configs that load a generated sample world."""
    files = sample_world.WorldFiles.at(world_dir(wh))
    ingests = [IngestConfig(path=str(files.knowledge_dump), corpus="sampleworld"),
               IngestConfig(path=str(files.general_text), corpus="general")]
    questions = [QuestionsConfig(path=str(path), format=sample_world.DATASETS[dataset], dataset=dataset, split=split)
                 for dataset, splits in files.questions.items() for split, path in splits.items()]
    return ingests, questions


def generation_inputs(wh: Warehouse) -> list[GenerationDataConfig]:
    """The configs that load a generated sample world's summarisation-like and translation-like tasks."""
    files = sample_world.WorldFiles.at(world_dir(wh))
    return [GenerationDataConfig(path=str(path), kind=sample_world.GENERATION_TASKS[task][0], task=task, split=split,
                                 source_lang=sample_world.GENERATION_TASKS[task][1],
                                 target_lang=sample_world.GENERATION_TASKS[task][2])
            for task, splits in files.generation.items() for split, path in splits.items()]
