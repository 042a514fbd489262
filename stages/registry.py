"""Every stage by name: its config model, its function, and the work pool it belongs on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from flows import knowledge_stages, model_stages, stages
from flows.configs import (AnalyzeConfig, BaseModelConfig, EditConfig, EvaluateConfig, FinetuneConfig,
                           GenerationDataConfig, IndexConfig,
                           IngestConfig, InjectConfig, QuestionsConfig, ReportConfig, RetrieveConfig,
                           SalientSpansConfig, SampleWorldConfig, StageConfig, SurgeryConfig)
from warehouse import StageResult, Warehouse


@dataclass(frozen=True)
class Stage:
    name: str
    config: type[StageConfig]
    run: Callable[[Warehouse, StageConfig, bool], StageResult]
    pool: Literal["cpu", "gpu"] = "cpu"

    @property
    def summary(self) -> str:
        """The config's docstring up to its first blank line, on one line (help text, Prefect descriptions)."""
        return " ".join((self.config.__doc__ or "").strip().split("\n\n")[0].split())


STAGES: dict[str, Stage] = {s.name: s for s in [
    Stage("sample-world", SampleWorldConfig, stages.generate_sample_world),
    Stage("ingest", IngestConfig, stages.ingest),
    Stage("questions", QuestionsConfig, stages.load_questions),
    Stage("generation-data", GenerationDataConfig, stages.load_generation_data),
    Stage("index", IndexConfig, stages.build_index),
    Stage("retrieve", RetrieveConfig, stages.retrieve),
    Stage("salient-spans", SalientSpansConfig, stages.find_salient_spans),
    Stage("base-model", BaseModelConfig, model_stages.pretrain_base_model, pool="gpu"),
    Stage("inject", InjectConfig, model_stages.inject, pool="gpu"),
    Stage("finetune", FinetuneConfig, model_stages.finetune, pool="gpu"),
    Stage("evaluate", EvaluateConfig, model_stages.evaluate, pool="gpu"),
    Stage("report", ReportConfig, model_stages.report, pool="gpu"),
    Stage("analyze", AnalyzeConfig, knowledge_stages.analyze, pool="gpu"),
    Stage("surgery", SurgeryConfig, knowledge_stages.surgery, pool="gpu"),
    Stage("edit", EditConfig, knowledge_stages.edit, pool="gpu"),
]}
