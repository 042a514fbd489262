"""One config model per stage. Each is also its Prefect flow's parameter type (the UI draws a form
from it) and the set of `--set key=value` keys of `nkb run STAGE`; every field has help text."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class StageConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SampleWorldConfig(StageConfig):
    """Generate the fictional sample world: a MediaWiki dump, general text, QA files, facts, probes."""

    seed: int = Field(13, description="Random seed; the same seed gives byte-identical files.")
    people: int = Field(120, ge=5, description="People whose facts are asked about (5 facts each).")
    background_people: int = Field(120, ge=0, description="Other people, only in the general-text corpus.")
    mentions: int = Field(3, ge=1, le=4, description="Articles that state each fact, each in its own wording.")
    validation_share: float = Field(0.2, gt=0, lt=1, description="Share of facts whose questions go to validation.")


class IngestConfig(StageConfig):
    """Read a Wikipedia-like corpus into the `documents` table (one partition per corpus)."""

    path: str = Field(description="Corpus file: MediaWiki XML dump (.xml or .xml.bz2), DPR passages .tsv, or .jsonl.")
    format: Optional[Literal["mediawiki", "dpr_tsv", "jsonl"]] = Field(
        None, description="File format; inferred from the file name when not given.")
    corpus: Optional[str] = Field(None, pattern=_NAME,
                                  description="Name of the corpus (the partition it replaces); default: the file name without extensions.")
    limit: Optional[int] = Field(None, ge=1, description="Stop after this many documents (for trials).")
    workers: Optional[int] = Field(None, ge=1, description="Processes cleaning wikitext; default: one per CPU core "
                                                           "for files over 1 MB, else 1. Does not change the output.")

    def corpus_name(self) -> str:
        if self.corpus:
            return self.corpus
        name = Path(self.path).name
        while "." in name:
            name = name.rsplit(".", 1)[0]
        return name or "corpus"


class QuestionsConfig(StageConfig):
    """Read a QA dataset split into the `questions` table (one partition per dataset and split)."""

    path: str = Field(description="Question file: NQ-open .jsonl, WebQuestions .json, HEAD-QA .json, or generic .jsonl.")
    format: Literal["nq_open", "webquestions", "headqa", "jsonl"] = Field(
        description="nq_open ({question, answer[]}), webquestions ({utterance, targetValue}), "
                    "headqa (exams of {qid, qtext, ra, answers[]}), jsonl ({id?, question, answers[]}).")
    dataset: str = Field(pattern=_NAME, description="Dataset name, e.g. nq, webquestions, headqa.")
    split: str = Field(pattern=_NAME, description="Split name, e.g. train, validation, test.")
    max_answer_tokens: Optional[int] = Field(
        5, ge=1, description="Drop answers longer than this many tokens, then questions with no answer left "
                             "(the NKB paper's filter). Empty to keep all.")

    @field_validator("path")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("path is empty")
        return v
