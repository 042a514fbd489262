"""Every stage by name: its config model, where its function lives, and the work pool it belongs on.

Stage functions are found by name when a stage runs, so that reading the registry (the command line's
help, the deployments) imports only the config models, never a stage body or what it needs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Literal

from stages.configs import (RUN_SETTINGS, AnalyzeConfig, AugmentConfig, BaseModelConfig, EditConfig, EvaluateConfig,
                            FinetuneConfig, GenerationDataConfig, IndexConfig, IngestConfig, InjectConfig,
                            JoinCorporaConfig, KnowledgeQuestionsConfig, PretrainingDataConfig, QuestionsConfig,
                            ReportConfig, RetrieveConfig, SalientSpansConfig, SampleWorldConfig, StageConfig,
                            SurgeryConfig)


@dataclass(frozen=True)
class Stage:
    name: str
    config: type[StageConfig]
    function: str                        # "module:function" in the stages package: stage(wh, config, force)
    pool: Literal["cpu", "gpu"] = "cpu"
    publishes_model: bool = False        # its runs publish a model folder that later stages find by name
    reads_file: bool = False             # reads one of an experiment's files, named by the file's own entry there
    writes: frozenset[str] = frozenset()  # the tables its runs write (besides its metrics); no other is let through
    settable: bool = True                # an experiment's `stages:` may set it (join-corpora's all come from the plan)
    # Raised when a change to the stage writes other rows from the same inputs and config: part of its runs'
    # fingerprint (`stages.reads.Declared`), so an upgrade reruns it and what reads it, and nothing else.
    rules: int = 0

    @property
    def entry(self) -> Callable:
        """The stage's function, imported now (only the stage that runs is imported)."""
        module, name = self.function.split(":")
        return getattr(importlib.import_module(f"stages.{module}"), name)

    @property
    def imports_torch(self) -> bool:
        """Whether running it imports torch: every model stage, and pretraining-data, which packs rows for one."""
        return self.pool == "gpu" or self.function.startswith("training:")

    @property
    def summary(self) -> str:
        """The config's docstring up to its first blank line, on one line (help text, Prefect descriptions)."""
        return " ".join((self.config.__doc__ or "").strip().split("\n\n")[0].split())


STAGES: dict[str, Stage] = {s.name: s for s in [
    Stage("sample-world", SampleWorldConfig, "data:generate_sample_world", reads_file=True),
    Stage("ingest", IngestConfig, "data:ingest", reads_file=True, writes=frozenset({"documents"})),
    Stage("questions", QuestionsConfig, "data:load_questions", reads_file=True, writes=frozenset({"questions"})),
    Stage("generation-data", GenerationDataConfig, "data:load_generation_data", reads_file=True,
          writes=frozenset({"gen_examples"})),
    Stage("join-corpora", JoinCorporaConfig, "data:join_corpora", writes=frozenset({"documents"}), settable=False),
    Stage("index", IndexConfig, "data:build_index"),
    Stage("retrieve", RetrieveConfig, "data:retrieve", writes=frozenset({"retrievals"})),
    Stage("salient-spans", SalientSpansConfig, "data:find_salient_spans",
          writes=frozenset({"segments", "salient_spans"})),
    Stage("augment", AugmentConfig, "augment:augment", pool="gpu",
          writes=frozenset({"augmented_segments", "segments", "salient_spans"})),
    Stage("knowledge-questions", KnowledgeQuestionsConfig, "data:write_knowledge_questions",
          writes=frozenset({"knowledge_questions"}), rules=2),  # 1: `where` only of places; 2: no stranded comma
    Stage("pretraining-data", PretrainingDataConfig, "training:prepare_pretraining_data",
          writes=frozenset({"segments"})),
    Stage("base-model", BaseModelConfig, "training:pretrain_base_model", pool="gpu", publishes_model=True),
    Stage("inject", InjectConfig, "training:inject", pool="gpu", publishes_model=True),
    Stage("finetune", FinetuneConfig, "training:finetune", pool="gpu", publishes_model=True),
    Stage("evaluate", EvaluateConfig, "evaluation:evaluate", pool="gpu", writes=frozenset({"predictions"})),
    Stage("report", ReportConfig, "report:report", pool="gpu",
          writes=frozenset({"predictions", "report", "report_answers", "report_generation", "report_refresh"}),
          rules=2),  # 1: every column the text report shows, in the table (intervals, forgetting, time); 2: answers, retrieval_share
    Stage("analyze", AnalyzeConfig, "knowledge:analyze", pool="gpu", writes=frozenset({"nkb_values", "nkb_keys"})),
    Stage("surgery", SurgeryConfig, "knowledge:surgery", pool="gpu", writes=frozenset({"edits"})),
    Stage("edit", EditConfig, "knowledge:edit", pool="gpu", publishes_model=True),
]}


def experiment_settings() -> dict[str, type[StageConfig]]:
    """What each key of an experiment's `stages:` sets: a stage's config (every stage but those that read one of
    its files or that the plan sets wholly), or one kind of that stage's runs over the stage's own settings (`RUN_SETTINGS`)."""
    settings: dict[str, type[StageConfig]] = {}
    for name, stage in STAGES.items():
        if stage.settable and not stage.reads_file:
            settings[name] = stage.config
            settings |= {key: stage.config for key, (over, _) in RUN_SETTINGS.items() if over == name}
    return settings


def model_of(stage: str, config: dict) -> str | None:
    """The model a run built (a training stage) or read (evaluate), by name, from its config."""
    spec = STAGES.get(stage)
    if config.get("model_name") or spec is None or not hasattr(spec.config, "model_name"):
        return config.get("model_name") or (config.get("name") if spec and spec.publishes_model else None)
    known = {k: v for k, v in config.items() if k in spec.config.model_fields}
    try:
        return spec.config.model_validate(known).model_name()
    except ValueError:  # a config from an older version of the stage
        return config.get("name")


def run_subject(stage: str, config: dict) -> str:
    """What a run was for, from its config: the model it built or read, its data and its length, e.g.
    "base+nkb.qa from base+nkb, 30 epochs" or "nq.train"."""
    spec = STAGES.get(stage)
    built = model_of(stage, config)
    source = config.get("model") or config.get("base_model")
    parts = []
    if built and source and built != source and spec is not None and spec.publishes_model:
        parts.append(f"{built} from {source}")
    elif built or source:
        parts.append(built or source)
    split = config.get("split")
    if config.get("dataset"):
        parts.append(f"{config['dataset']}.{split}")
    elif parts and split and not (spec and spec.publishes_model):
        parts.append(f"on {split}")
    elif config.get("task") and not parts:
        parts.append(config["task"] + (f".{split}" if split else ""))
    elif config.get("corpus") and not parts:
        parts.append(f"corpus {config['corpus']}" + (f" ({config['source']})" if config.get("source") else ""))
    if stage == "base-model" and config.get("source"):  # brought in, not trained: no steps
        return f"{built} from {config['source']}"
    for key, unit in (("steps", "steps"), ("epochs", "epochs")):
        if config.get(key):
            parts.append(f"{config[key]} {unit}")
    return ", ".join(parts)
