"""The stages: plain functions `stage(wh, config, force) -> StageResult` that join a corpus/model
function to the warehouse. The Prefect flows and the CLI both call these, and nothing else.

Each stage computes its inputs fingerprint (config + digests of what it reads), runs atomically via
`warehouse.run_stage`, and is skipped when the same inputs already succeeded.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

from tqdm import tqdm

from corpus import documents as docs
from corpus import qa
from corpus import sample_world
from corpus.errors import InputFileError, require_file
from flows.configs import IngestConfig, QuestionsConfig, SampleWorldConfig, StageConfig
from warehouse import StagedRun, StageResult, Warehouse, file_digest, fingerprint, run_stage

BATCH_ROWS = 2000


def _progress(**kwargs) -> tqdm:
    """Progress bars on stderr; off when NKB_PROGRESS=0 (tests, logs)."""
    return tqdm(disable=os.environ.get("NKB_PROGRESS", "1") == "0", mininterval=0.5, **kwargs)


def _batched(items, n: int):
    it = iter(items)
    while batch := list(itertools.islice(it, n)):
        yield batch


# ---- sample-world -----------------------------------------------------------------------------

def world_dir(wh: Warehouse) -> Path:
    return wh.files_dir / "sample-world"


def generate_sample_world(wh: Warehouse, config: SampleWorldConfig, force: bool = False) -> StageResult:
    """Write the sample world's files under `<home>/files/sample-world/`, replacing them atomically."""
    target = world_dir(wh)
    params = config.model_dump()
    # The generator's own code is an input: a changed generator means a different world.
    fp = fingerprint("sample-world", params, [file_digest(sample_world.__file__)])

    def files_present(run) -> bool:
        return all(p.exists() for p in sample_world.WorldFiles.at(target).all_paths())

    def body(run: StagedRun) -> dict:
        started = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(prefix=".sample-world-", dir=wh.files_dir))
        try:
            files = sample_world.generate(tmp, **params)
            old = target.with_name(f".sample-world-old-{run.run_id}")
            if target.exists():
                target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        n_facts = sum(1 for _ in open(target / files.facts.name, encoding="utf-8"))
        run.run.outputs["files"] = len(files.all_paths())
        run.metric("facts", n_facts)
        return {"dir": str(target), "facts": n_facts, "seconds": time.perf_counter() - started}

    return run_stage(wh, "sample-world", params, fp, body, force=force, still_valid=files_present)


# ---- ingest -------------------------------------------------------------------------------

def ingest(wh: Warehouse, config: IngestConfig, force: bool = False) -> StageResult:
    """Stream a corpus file into `documents`, partition = corpus name."""
    require_file(config.path)
    fmt = config.format or docs.infer_format(config.path)
    corpus = config.corpus_name()
    path = os.path.abspath(config.path)
    params = config.model_dump() | {"format": fmt, "corpus": corpus, "path": path}
    # The file's content, not its path, identifies the input: a moved file is not ingested again.
    fp = fingerprint("ingest", params | {"path": None, "workers": None}, [file_digest(path)])
    # Worker processes cost about a second to start: worth it from roughly 10 MB of XML (1 MB of .bz2).
    workers = config.workers or ((os.cpu_count() or 1) if os.path.getsize(path) > 1e6 else 1)

    def body(run: StagedRun) -> dict:
        started = time.perf_counter()
        size = os.path.getsize(path)
        pages = docs.read_documents(path, fmt, workers=workers)
        if config.limit:
            pages = itertools.islice(pages, config.limit)
        rows = 0
        with run.writer("documents", corpus) as out, _progress(desc=f"ingest {corpus}", unit=" pages") as bar:
            for batch in _batched(pages, BATCH_ROWS):
                out.write({"doc_id": [d.doc_id for d in batch], "title": [d.title for d in batch],
                           "text": [d.text for d in batch], "corpus": [corpus] * len(batch)})
                rows += len(batch)
                bar.update(len(batch))
        if rows == 0:
            raise InputFileError(path, None, "no documents found (only redirects, disambiguation or other namespaces?)")
        duplicate = run.first_duplicate("documents", corpus, "doc_id")
        if duplicate is not None:
            raise InputFileError(path, None, f"doc id {duplicate!r} occurs more than once in corpus {corpus!r}")
        seconds = time.perf_counter() - started
        run.metric("documents", rows, dataset=corpus)
        run.metric("pages_per_second", rows / seconds, dataset=corpus)
        return {"corpus": corpus, "documents": rows, "seconds": seconds, "input_mb": size / 1e6}

    return run_stage(wh, "ingest", params, fp, body, force=force)


# ---- questions ----------------------------------------------------------------------------

def load_questions(wh: Warehouse, config: QuestionsConfig, force: bool = False) -> StageResult:
    """Read one QA split into `questions`, partition = `<dataset>.<split>`; long answers filtered."""
    require_file(config.path)
    path = os.path.abspath(config.path)
    params = config.model_dump() | {"path": path}
    fp = fingerprint("questions", params | {"path": None}, [file_digest(path)])

    def body(run: StagedRun) -> dict:
        started = time.perf_counter()
        read = list(qa.read_questions(path, config.format))
        if not read:
            raise InputFileError(path, None, "no questions found")
        kept, dropped = qa.filter_long_answers(read, config.max_answer_tokens)
        seen = set()
        for q in read:
            if q.local_id in seen:
                raise InputFileError(path, None, f"question id {q.local_id!r} occurs more than once")
            seen.add(q.local_id)
        run.write("questions", f"{config.dataset}.{config.split}", {
            "question_id": [qa.make_question_id(config.dataset, config.split, q.local_id) for q in kept],
            "dataset": [config.dataset] * len(kept), "split": [config.split] * len(kept),
            "question": [q.question for q in kept], "answers": [list(q.answers) for q in kept]})
        for name, value in (("questions", len(kept)), ("filtered_long_answers", dropped)):
            run.metric(name, value, dataset=config.dataset, split=config.split)
        return {"dataset": config.dataset, "split": config.split, "questions": len(kept), "filtered": dropped,
                "seconds": time.perf_counter() - started}

    return run_stage(wh, "questions", params, fp, body, force=force)


def summarize(stage: str, result: StageResult, seconds: float) -> dict[str, Any]:
    """One row describing a stage run: what it wrote, how long it took, how fast."""
    run = result.run
    value = result.value if isinstance(result.value, dict) else {}
    row: dict[str, Any] = {"stage": stage, "run_id": run.run_id, "skipped": result.skipped,
                           "rows_written": sum(v for v in run.outputs.values() if isinstance(v, int)),
                           "written": ", ".join(f"{v} {k}" for k, v in run.outputs.items()),
                           "seconds": round(seconds, 3)}
    row.update({k: v for k, v in value.items() if k not in row and not isinstance(v, (list, dict))})
    if not result.skipped and row["rows_written"] and seconds > 0:
        row["rows_per_second"] = round(row["rows_written"] / seconds, 1)
    return row


# ---- registry -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Stage:
    name: str
    config: type[StageConfig]
    run: Callable[[Warehouse, StageConfig, bool], StageResult]
    pool: Literal["cpu", "gpu"] = "cpu"

    @property
    def summary(self) -> str:
        return (self.config.__doc__ or "").strip().splitlines()[0]


STAGES: dict[str, Stage] = {s.name: s for s in [
    Stage("sample-world", SampleWorldConfig, generate_sample_world),
    Stage("ingest", IngestConfig, ingest),
    Stage("questions", QuestionsConfig, load_questions),
]}


def sample_world_inputs(wh: Warehouse) -> tuple[list[IngestConfig], list[QuestionsConfig]]:
    """The ingest and questions configs that load a generated sample world."""
    files = sample_world.WorldFiles.at(world_dir(wh))
    ingests = [IngestConfig(path=str(files.knowledge_dump), corpus="sampleworld"),
               IngestConfig(path=str(files.general_text), corpus="general")]
    questions = [QuestionsConfig(path=str(path), format=sample_world.DATASETS[dataset], dataset=dataset, split=split)
                 for dataset, splits in files.questions.items() for split, path in splits.items()]
    return ingests, questions
