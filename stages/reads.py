"""What a stage reads, declared once, and the run derived from it.

A stage declares its run (`Declared`): its config, what it reads (`Read`s: a corpus, questions, retrievals, spans, a
model, a file) and what it adds to its config's identity (a model's name, the datasets it found). The declaration
gives the inputs fingerprint (the config's identity, the stage's rules version from the registry, and what stands
for each read's data: the runs that wrote its partitions, a file's digest, a model folder and the run that built
it), and runs the body atomically through `warehouse.run_stage`, writing only the tables the registry says the
stage writes. A stage body is then read → compute → write, with no lineage of its own to build; and what a stage
reads is said the same way everywhere, so two stages that read the same thing fingerprint it the same way.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from stages.configs import StageConfig
from stages.inputs import AUGMENTED, PRETRAINING, corpus_lineage, partition_family, span_partitions
from stages.registry import STAGES, model_of
from warehouse import StagedRun, StageResult, Warehouse, file_digest, fingerprint, reusable_run, run_stage


@dataclass(frozen=True)
class Read:
    """One thing a stage reads, as its fingerprint sees it."""
    lineage: tuple[str, ...]


NOTHING = Read(())  # what a stage reads only in some of its runs, in the others


def partitions(pairs: Iterable[tuple[str, str]]) -> Read:
    """Table partitions, each by its name and the fingerprint of the run that wrote it."""
    return Read(tuple(f"{name}:{fp}" for name, fp in pairs))


def corpus(wh: Warehouse, name: str, labelled: bool = True) -> Read:
    """A corpus's documents, by the run that ingested them (labelled with the corpus's name)."""
    fp = corpus_lineage(wh, name)
    return Read((f"{name}:{fp}",) if labelled else (fp,))


def questions(wh: Warehouse, datasets: list[str] | None, split: str) -> Read:
    """A split's questions of `datasets` (None: of every dataset)."""
    return partitions((n, f) for n, f in wh.lineage("questions")
                      if (datasets is None or n.split(".")[0] in datasets) and n.endswith("." + split))


def shots(wh: Warehouse, count: int) -> Read:
    """The train split the few-shot examples are drawn from, when questions are asked `count`-shot."""
    return questions(wh, None, "train") if count else NOTHING


def task_examples(wh: Warehouse, task: str, split: str) -> Read:
    """A general-generation task's examples of a split."""
    return partitions((n, f) for n, f in wh.lineage("gen_examples") if n == f"{task}.{split}")


def retrievals(wh: Warehouse, datasets: list[str] | None = None) -> Read:
    """The retrieved documents of `datasets`' questions (None: of every dataset)."""
    return partitions((n, f) for n, f in wh.lineage("retrievals") if datasets is None or n in datasets)


def spans(wh: Warehouse, corpus_name: str, source: str = "retrieved") -> Read:
    """A corpus's segments and their salient spans (of its retrieved documents, or of its pretraining text)."""
    segments, _ = span_partitions(wh, corpus_name, source)
    return partitions(pair for table in ("segments", "salient_spans") for pair in partition_family(wh, table, segments))


def knowledge_questions(wh: Warehouse, corpus_name: str) -> Read:
    """The questions the knowledge-questions stage wrote about a corpus's facts; ValueError, saying what to run, when
    there are none."""
    found = [(n, f) for n, f in wh.lineage("knowledge_questions") if n == corpus_name]
    if not found:
        raise ValueError(f"knowledge_questions: no questions about {corpus_name!r} yet; run knowledge-questions "
                         f"--set corpus={corpus_name}")
    return partitions(found)


def retrieved_span_partitions(wh: Warehouse) -> list[tuple[str, str]]:
    """(name, lineage) of the salient spans of every corpus's retrieved documents (not of pretraining text, nor of
    augmented segments)."""
    return [(n, f) for n, f in wh.lineage("salient_spans")
            if f".{PRETRAINING}-" not in n and f".{AUGMENTED}-" not in n]


def file(path: str | None) -> Read:
    """A file by its content (an empty mark when there is none)."""
    return Read((file_digest(path) if path else "",))


def model(source) -> Read:
    """A model (`stages.models.SourceModel`) by its folder and the run that built it."""
    return Read(tuple(source.lineage))


def mark(*values: str) -> Read:
    """What else stands for an input: an index's id, a NER model's, a run the stage starts from."""
    return Read(values)


class Planned(Exception):
    """What a stage's run would be, raised by `Declared.run` under `planning()` in place of running it."""

    def __init__(self, declared: Declared, reused):
        super().__init__(declared.stage)
        self.declared, self.reused = declared, reused  # reused: the earlier run it would be skipped for, or None


_planning = contextvars.ContextVar("planning", default=False)


@contextlib.contextmanager
def planning():
    """Stage functions called inside declare their run and raise `Planned`: nothing runs and nothing is written (a
    plan before a pipeline, `nkb pipeline FILE --plan`)."""
    token = _planning.set(True)
    try:
        yield
    finally:
        _planning.reset(token)


@dataclass
class Declared:
    """A stage run as declared: its config, what it reads, and what it adds to its config's identity."""
    stage: str
    config: StageConfig
    reads: list[Read]
    identity: dict[str, Any] = field(default_factory=dict)
    record: dict[str, Any] | None = None  # the config as the run row records it; default the config's fields

    @property
    def recorded(self) -> dict[str, Any]:
        """The config as the run row records it."""
        return self.config.model_dump() if self.record is None else self.record

    @property
    def lineage(self) -> list[str]:
        """What stands for each thing the run reads, in order."""
        return [part for read in self.reads for part in read.lineage]

    @functools.cached_property
    def fingerprint(self) -> str:
        rules = STAGES[self.stage].rules
        return fingerprint(self.stage, self.config.identity() | self.identity | ({"rules": rules} if rules else {}),
                           self.lineage)

    def run(self, wh: Warehouse, body: Callable[[StagedRun], Any], force: bool = False, **options) -> StageResult:
        """`body` run atomically as this stage, or skipped when the same inputs already succeeded
        (`warehouse.run_stage`'s `options`: device, still_valid, resumable)."""
        if _planning.get():
            raise Planned(self, None if force else reusable_run(wh, self.stage, self.fingerprint,
                                                                options.get("still_valid")))
        result = run_stage(wh, self.stage, self.recorded, self.fingerprint, body, force=force,
                           writes=STAGES[self.stage].writes, model=model_of(self.stage, self.recorded), **options)
        if STAGES[self.stage].publishes_model and result.run.checkpoint:
            from stages.models import select_model  # what later stages read by this model's name
            select_model(wh, result.run)
        return result
