"""Training stages: pretraining data, the base model, NKB injection, fine-tuning.

The device and precision are chosen once, at each stage's entry, and passed down; the training loop is
`nkb_model.train.train`, with the settings of the stage's `TrainingConfig`.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nkb_model.architectures import DEFAULT_ARCH
from nkb_model.families import Family, family, family_of, new_base, qa_pair
from nkb_model.injection import Injection, InjectionData
from nkb_model.methods import METHODS, variants
from stages import reads
from stages.configs import AskingStageConfig, BaseModelConfig, FinetuneConfig, InjectConfig, PretrainingDataConfig
from stages.inputs import (AUGMENTED, PRETRAINING, corpora, corpus_texts, gen_examples, gen_inputs, one_corpus,
                           packed_rows, qa_inputs, read_questions, retrieved_documents, segments_with_spans)
from stages.models import (SourceModel, base_dir_of, model_at, model_dir, model_present, publish_model,
                           resumable_dir, source_model)
from stages.progress import progress
from stages.sources import HUB, resolve_source
from warehouse import StagedRun, StageResult, Warehouse, file_digest, fingerprint, list_runs

GENERAL_SEQ_LEN = 128  # general-text rows for injection into a base without held-out rows (e.g. t5-base)
PRETRAINING_META = "nkb-pretraining.json"
# qa_teacher's passage for a train question: what the RAG row reads, cut as the rows' prompts cut a document
TEACHER_DOCUMENTS, TEACHER_WORDS = METHODS["rag"].documents, AskingStageConfig.model_fields["document_words"].default


# ---- pretraining data ----------------------------------------------------------------------------

def prepare_pretraining_data(wh: Warehouse, config: PretrainingDataConfig, force: bool = False) -> StageResult:
    """Tokenizer, packed rows and held-out rows under `files/pretraining/`; the training rows' sentences as the
    `segments` partition <corpus>.pretraining (replacing its salient spans, which described other sentences)."""
    config = config.model_copy(update={"corpus": one_corpus(wh, config.corpus),
                                       "tokenizer_corpora": config.tokenizer_corpora or corpora(wh)})
    read = sorted(set(config.tokenizer_corpora) | {config.corpus})
    declared = reads.Declared("pretraining-data", config, [reads.corpus(wh, c) for c in read])
    target = wh.files_dir / "pretraining" / f"{config.corpus}-{declared.fingerprint[:12]}"
    return declared.run(wh, lambda run: _prepare_pretraining_data(run, wh, config, target), force=force,
                        still_valid=lambda run: (Path(run.checkpoint or "") / PRETRAINING_META).exists())


def _prepare_pretraining_data(run: StagedRun, wh: Warehouse, config: PretrainingDataConfig, target: Path) -> dict:
    from nkb_model import base_model
    started = time.perf_counter()
    tokenizer = base_model.train_tokenizer(
        (t for c in config.tokenizer_corpora for t in corpus_texts(wh, c)), config.vocab_size)
    rows = packed_rows(wh, tokenizer, config.corpus, config.seq_len)
    order = np.random.default_rng(config.seed).permutation(len(rows))
    n_held = base_model.held_out_count(len(rows), config.held_out_share)
    held_out, train_rows = rows[order[:n_held]], rows[order[n_held:]]
    sentences = _write_pretraining_sentences(run, tokenizer, train_rows, config)
    meta = {"corpus": config.corpus, "vocab": len(tokenizer), "sequences": len(train_rows),
            "held_out": len(held_out), "seq_len": config.seq_len, "built_by": run.run_id}

    def write(directory: Path) -> None:
        tokenizer.save_pretrained(directory)
        np.save(directory / "train_rows.npy", train_rows)
        np.save(directory / "held_out.npy", held_out)
        (directory / PRETRAINING_META).write_text(json.dumps(meta, indent=1))

    run.publish_folder(target, write)
    run.record.checkpoint = str(target)
    return meta | {"sentences": sentences, "seconds": time.perf_counter() - started}


def _write_pretraining_sentences(run: StagedRun, tokenizer, train_rows, config: PretrainingDataConfig) -> int:
    """The training rows' own text, cut at documents and sentences, as the `segments` partition <corpus>.pretraining:
    salient span masking asks for what the model reads, and the held-out rows stay unseen. Ids sort in the order
    the pieces come. Returns how many."""
    from corpus.segment import segment
    partition = f"{config.corpus}.{PRETRAINING}"
    texts = [doc for row in tokenizer.batch_decode(train_rows) for doc in row.split(tokenizer.eos_token)]
    pieces = [(t, i, piece) for t, text in enumerate(texts) for i, piece in enumerate(segment(text, config.max_words))]
    run.write("segments", partition, {"segment_id": [f"{PRETRAINING}/{t}.{i}" for t, i, _ in pieces],
                                      "doc_id": [f"{PRETRAINING}/{t}" for t, _, _ in pieces],
                                      "text": [piece for _, _, piece in pieces]})
    run.replace_partitions("salient_spans", partition + "-")
    return len(pieces)


def latest_pretraining_data(wh: Warehouse, corpus: str) -> Path:
    """The folder of the newest pretraining data of `corpus`."""
    for run in list_runs(wh, stage="pretraining-data"):
        if run.status == "success" and run.config.get("corpus") == corpus:
            if not (Path(run.checkpoint or "") / PRETRAINING_META).exists():
                raise ValueError(f"pretraining data {run.checkpoint} (run {run.run_id}) is missing; rebuild it "
                                 f"with `nkb run pretraining-data --set corpus={corpus} --force`")
            return Path(run.checkpoint)
    raise ValueError(f"no pretraining data for corpus {corpus!r}; run `nkb run pretraining-data --set corpus={corpus}`")


# ---- base model ----------------------------------------------------------------------------------

def pretrain_base_model(wh: Warehouse, config: BaseModelConfig, force: bool = False) -> StageResult:
    """Span-corruption (a decoder-only arch: next-token) and salient span masking pretraining; saves a Hugging Face
    directory under `files/models/`. With `source`, a Hugging Face model is brought in as this base instead
    (`import_base_model`)."""
    from nkb_model.train import choose_device
    if config.source:
        return import_base_model(wh, config, force)
    config = config.model_copy(update={"pretrain_corpus": one_corpus(wh, config.pretrain_corpus, "pretrain_corpus")})
    data = latest_pretraining_data(wh, config.pretrain_corpus)
    data_meta = json.loads((data / PRETRAINING_META).read_text())
    declared = reads.Declared("base-model", config, [
        reads.mark(data.name, data_meta["built_by"]),  # not its path: a moved or copied warehouse skips the base
        reads.spans(wh, config.pretrain_corpus, source=PRETRAINING) if config.ssm_share else reads.NOTHING])
    target = model_dir(wh, config.name, declared.fingerprint)
    device = choose_device(config.device, config.precision)
    return declared.run(wh, lambda run: _pretrain(run, wh, config, data, data_meta["seq_len"], target, device),
                        force=force, device=device.name, still_valid=model_present)


def _pretrain(run: StagedRun, wh: Warehouse, config: BaseModelConfig, data: Path, seq_len: int, target: Path,
              device) -> dict:
    from transformers import AutoTokenizer

    from nkb_model import base_model
    from nkb_model.train import train
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(data)
    train_rows, held_out = np.load(data / "train_rows.npy"), np.load(data / "held_out.npy")
    model, kind = new_base(config.arch, tokenizer, config.size, config.dropout, config.seed), family_of(config.arch)
    batches = base_model.Named(kind.text_batches(train_rows, tokenizer, config.batch_size, config.seed),
                               "pretrain_loss")
    model.to(device.device).train()
    if config.ssm_share and config.steps:
        ssm = pretraining_ssm_batches(wh, tokenizer, config, seq_len, kind)
        batches = base_model.Interleaved(batches, base_model.Named(ssm, "pretrain_ssm_loss"), config.ssm_share)
    losses = train(model, batches, config.train_config(config.steps), device, resumable_dir(run, target),
                   f"pretrain {config.name}", progress) if config.steps else []
    for step, loss in losses:
        run.metric(base_model.metric_at(batches, step - 1), loss, dataset=config.pretrain_corpus, split="train",
                   step=step)
    n_params = sum(p.numel() for p in model.parameters())
    info = {"name": config.name, "kind": "base", "arch": config.arch, "size": config.size, "params": n_params,
            "vocab": len(tokenizer), "built_by": run.run_id, "final_loss": losses[-1][1] if losses else None}
    _publish_base(run, target, model, tokenizer, info, held_out)
    return {"model": str(target), "params": n_params, "final_loss": round(losses[-1][1], 4) if losses else None,
            "sequences": len(train_rows), "seconds": time.perf_counter() - started, "device": device.name}


def _publish_base(run: StagedRun, target: Path, model, tokenizer, info: dict, held_out) -> None:
    """A base's folder: the model, its tokenizer, its info and its held-out rows (for the no-forgetting check)."""
    from nkb_model.checkpoint import INFO

    def write(directory: Path) -> None:
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        if held_out is not None:
            np.save(directory / "held_out.npy", held_out)
        (directory / INFO).write_text(json.dumps(info, indent=1))

    publish_model(run, target, write)
    run.output("model_params", info["params"])
    run.metric("params_total", info["params"])


def import_base_model(wh: Warehouse, config: BaseModelConfig, force: bool = False) -> StageResult:
    """A Hugging Face T5 or causal LM (a local directory, or a hub name on a machine that has it) published as this
    base, with held-out rows of the general corpus (`pretrain_corpus`, when given) for the no-forgetting check."""
    source = resolve_source(config.source)
    gguf = source.is_file() and source.suffix == ".gguf"
    local = source.is_dir() or gguf
    if not local and source.exists():
        raise ValueError(f"base model source {config.source}: neither a Hugging Face folder nor a .gguf file")
    files = [source] if gguf else sorted(f for f in source.rglob("*") if f.is_file()) if local else []
    declared = reads.Declared("base-model", config, [
        reads.mark(*(f"{f.relative_to(source.parent if gguf else source)}:{file_digest(f)}" for f in files))
        if local else reads.mark(config.source),
        reads.corpus(wh, config.pretrain_corpus) if config.pretrain_corpus else reads.NOTHING],
        identity={"source": config.source if not local else None})
    target = model_dir(wh, config.name, declared.fingerprint)
    return declared.run(wh, lambda run: _import_base(run, wh, config, source, gguf, target), force=force,
                        still_valid=model_present)


def _import_base(run: StagedRun, wh: Warehouse, config: BaseModelConfig, source: Path, gguf: bool,
                 target: Path) -> dict:
    from nkb_model import base_model
    from nkb_model.mounting import architecture_of, block_names, ffn_maps, get_ffn
    started = time.perf_counter()
    model, tokenizer, origin = load_brought_model(config, source, gguf)
    ffn_maps(get_ffn(model, block_names(model)[0]))  # an unsupported family or FFN fails here, by its class
    held_out = None
    if config.pretrain_corpus:
        rows = packed_rows(wh, tokenizer, config.pretrain_corpus, GENERAL_SEQ_LEN)
        order = np.random.default_rng(config.seed).permutation(len(rows))
        held_out = rows[order[:base_model.held_out_count(len(rows), 0.05)]]
    n_params = sum(p.numel() for p in model.parameters())
    info = {"name": config.name, "kind": "base", "arch": architecture_of(model).name, "source": config.source,
            "params": n_params, "vocab": len(tokenizer), "built_by": run.run_id, **origin}
    _publish_base(run, target, model, tokenizer, info, held_out)
    return {"model": str(target), "source": config.source, "params": n_params,
            "held_out": 0 if held_out is None else len(held_out), "seconds": time.perf_counter() - started}


def load_brought_model(config: BaseModelConfig, source: Path, gguf: bool):
    """(model, tokenizer, what to record of its origin) of a model brought in: a GGUF file dequantised, or a
    Hugging Face folder or cached hub name (read from the local cache only unless named `hub:`)."""
    from nkb_model.checkpoint import load_gguf, load_tokenizer, model_class
    if gguf:
        model, tokenizer, meta = load_gguf(source)
        return model, tokenizer, {"source_format": "gguf", "source_sha256": file_digest(source), "original": meta}
    offline = not config.source.startswith(HUB)  # a bare name: the local cache only, never the network
    try:
        model = model_class(str(source), offline).from_pretrained(str(source), local_files_only=offline)
        return model, load_tokenizer(str(source), offline), {}
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot load base model {config.source!r} as a Hugging Face T5 or causal LM: "
                         f"{str(exc).splitlines()[0]}") from None


def pretraining_ssm_batches(wh: Warehouse, tokenizer, config: BaseModelConfig, max_input_len: int, kind: Family):
    """SSM batches over the pretraining rows' sentences (salient-spans with source=pretraining found their
    entities and dates), one masked per sentence and redrawn every epoch, like the injection corpus's."""
    from corpus.ssm import ssm_examples
    segments, spans = segments_with_spans(wh, config.pretrain_corpus, source=PRETRAINING)

    @functools.lru_cache(maxsize=1)  # epoch 0 is asked for by the check below and twice by PairBatches
    def examples(epoch: int) -> tuple[list[str], list[str]]:
        ex = ssm_examples(segments, spans, seed=config.seed, epoch=epoch, skip_repeated=True,
                          **kind.ssm_form(and_rest=False, cued=False))
        return ex.column("input").to_pylist(), ex.column("target").to_pylist()

    available = len(examples(0)[0])
    if not available:
        raise ValueError(f"ssm_share={config.ssm_share}, but spaCy found no salient span in the "
                         f"{config.pretrain_corpus!r} pretraining text")
    return kind.pair_batches(examples, tokenizer, min(config.ssm_batch_size, available), config.seed,
                             max_input_len=max_input_len, target_eos=False, group_by_length=config.group_by_length)


# ---- injection -----------------------------------------------------------------------------------

def inject(wh: Warehouse, config: InjectConfig, force: bool = False) -> StageResult:
    """Mount what the variant's method trains (NKB slots; for comparison, the field's routes on the same blocks:
    `nkb_model.methods`) on a base model and train it on SSM examples."""
    from nkb_model.train import choose_device
    config = config.model_copy(update={"corpus": one_corpus(wh, config.corpus)})
    for setting in ("general_share", "sparse_slots"):  # both read general text
        if getattr(config, setting) and not config.general_corpus:
            raise ValueError(f"{setting}={getattr(config, setting)} needs general_corpus= (corpora: "
                             f"{', '.join(corpora(wh))})")
    if config.sparse_slots and not variants()[config.variant].sparse_slots:
        raise ValueError(f"sparse_slots updates some of the NKB's slots; variant {config.variant} has no frozen base "
                         f"with slots beside it ({', '.join(v for v, m in variants().items() if m.sparse_slots)} "
                         "does)")
    base = source_model(wh, config.base_model)
    has_encoder = family_of(base.info.get("arch", DEFAULT_ARCH)).has_encoder
    if config.qa_teacher and not config.qa_share:
        raise ValueError(f"qa_teacher={config.qa_teacher} teaches the QA steps; set qa_share= to have some")
    for setting in ("own_text_weight", "own_text_kl", "qa_teacher"):
        if getattr(config, setting) and has_encoder:
            raise ValueError(f"{setting}={getattr(config, setting)} needs a decoder-only base (one that writes text "
                             f"from its start token); {config.base_model} has an encoder")
    name = config.model_name()
    knowledge = reads.spans(wh, config.corpus)
    knowledge_digest = fingerprint("knowledge", {}, knowledge.lineage)
    previous = previous_injection(wh, name, knowledge_digest) if config.start == "previous" else None
    declared = reads.Declared("inject", config, [
        reads.model(base), knowledge, reads.mark(f"start:{previous.info['built_by']}") if previous else reads.NOTHING,
        reads.corpus(wh, config.general_corpus) if config.general_share or config.sparse_slots else reads.NOTHING,
        reads.questions(wh, None, "train") if config.qa_share else reads.NOTHING,
        reads.retrievals(wh) if config.qa_share and config.qa_teacher else reads.NOTHING,
        reads.knowledge_questions(wh, config.corpus) if config.knowledge_questions else reads.NOTHING,
        reads.spans(wh, config.corpus, AUGMENTED) if config.augmented else reads.NOTHING], identity={"name": name})
    target = model_dir(wh, name, declared.fingerprint)
    device = choose_device(config.device, config.precision)
    return declared.run(wh, lambda run: _inject(run, wh, config, base, previous, knowledge_digest, target, device),
                        force=force, device=device.name, still_valid=model_present)


def _inject(run: StagedRun, wh: Warehouse, config: InjectConfig, base: SourceModel, previous: SourceModel | None,
            knowledge_digest: str, target: Path, device) -> dict:
    from nkb_model.base_model import metric_at
    from nkb_model.checkpoint import hf_dir, relative_base
    from nkb_model.mounting import resolve_layers
    from nkb_model.train import train
    started = time.perf_counter()
    model, tokenizer, _ = base.load()
    prepared = Injection(config, injection_data(wh, config, model, tokenizer, base), device, progress).prepare(
        model, tokenizer, previous.directory / "nkb" if previous else None)
    made, batches = prepared.mounted, prepared.batches
    losses = train(prepared.module, batches, config.train_config(config.steps), device, resumable_dir(run, target),
                   f"inject {config.model_name()}", progress, after_step=prepared.after_step)
    for step, loss in losses:
        run.metric(metric_at(batches, step - 1), loss, dataset=config.corpus, split="train", step=step)
    model.to("cpu")
    seconds = time.perf_counter() - started
    # The model as it is loaded and exported: LoRA's adapters merged into the maps they adapt.
    total = sum(p.numel() for name, p in model.named_parameters() if "lora_" not in name)
    info = {"name": config.model_name(), "kind": config.variant, "arch": base.info.get("arch", DEFAULT_ARCH),
            "base_folder": relative_base(hf_dir(base.directory), target), "base_model": config.base_model,
            "params": total, "params_injected": made.count, "built_by": run.run_id, "final_loss": losses[-1][1],
            "knowledge_digest": knowledge_digest, "started_from": previous.info["built_by"] if previous else None,
            "layers": resolve_layers(model, config.layers),
            "slots": model.nkb_config.slots if hasattr(model, "nkb_config") else None}
    publish_model(run, target, lambda d: made.save(model, tokenizer, d, info))
    run.output("params_injected", made.count)
    run.metric("params_total", total)
    run.metric("params_injected", made.count)
    return {"model": info["name"], "started_from": info["started_from"], "params_total": total,
            "params_injected": made.count, "final_loss": round(losses[-1][1], 4),
            "examples_per_epoch": prepared.ssm.per_epoch * config.batch_size, "seconds": seconds, "device": device.name}


def knowledge_segments(wh: Warehouse, config: InjectConfig) -> tuple[pa.Table, pa.Table]:
    """(segments, their salient spans) that inject trains on: the corpus's retrieved segments, and their other
    wordings of the `augmented` methods."""
    segments, spans = segments_with_spans(wh, config.corpus)
    if not config.augmented:
        return segments, spans
    more, more_spans = segments_with_spans(wh, config.corpus, AUGMENTED)
    methods = pc.replace_substring_regex(more.column("segment_id"), r"^.*~|\d+$", "")  # <segment>~<method><k>
    if missing := sorted(set(config.augmented) - set(methods.unique().to_pylist())):
        raise ValueError(f"augmented: the corpus {config.corpus!r} has no augmented segments by "
                         f"{', '.join(missing)}; run augment --set methods={','.join(config.augmented)}")
    more = more.filter(pc.is_in(methods, pa.array(config.augmented)))
    more_spans = more_spans.filter(pc.is_in(more_spans.column("segment_id"), more.column("segment_id")))
    return pa.concat_tables([segments, more]), pa.concat_tables([spans, more_spans])


def injection_data(wh: Warehouse, config: InjectConfig, model, tokenizer, base: SourceModel) -> InjectionData:
    """What the injection trains on, read from the warehouse: the knowledge's segments with their salient spans
    masked anew each epoch in the family's form, the QA steps' questions (qa_share), the general text (general_share,
    sparse_slots)."""
    segments, spans = knowledge_segments(wh, config)
    return InjectionData(segments.column("segment_id").to_pylist(), segments.column("text").to_pylist(),
                         ssm_draws(segments, spans, config, family(model)),
                         qa_pairs(wh, config) if config.qa_share else None,
                         general_rows(wh, tokenizer, base.directory, config)
                         if config.general_share or config.sparse_slots else None,
                         qa_passages(wh, config, segments) if config.qa_share and config.qa_teacher else None)


def ssm_draws(segments: pa.Table, spans: pa.Table, config: InjectConfig, kind: Family):
    """epoch -> that epoch's SSM examples of `segments` (a span of each masked anew), in the family `kind`'s form."""
    from corpus.ssm import ssm_examples
    form = kind.ssm_form(and_rest=config.span_target == "span_and_rest", cued=config.cued_spans)

    @functools.lru_cache(maxsize=2)
    def drawn(epoch: int):
        return ssm_examples(segments, spans, seed=config.seed, epoch=epoch, skip_repeated=config.skip_repeated_spans,
                            **form)
    return drawn


def qa_pairs(wh: Warehouse, config: InjectConfig) -> tuple[list[str], list[str]]:
    """(questions, first answers) of injection's QA steps: the train split's (and, with `knowledge_questions`, the
    questions written from the corpus's own facts). The train split alone: no validation question or wording is
    ever read here."""
    questions = read_questions(wh, None, "train")
    asked = questions.column("question").to_pylist()
    answers = [a[0] for a in questions.column("answers").to_pylist()]
    if config.knowledge_questions:
        more = wh.read("knowledge_questions", ["question", "answer"], partitions=[config.corpus])
        asked += more.column("question").to_pylist()
        answers += more.column("answer").to_pylist()
    return asked, answers


def qa_passages(wh: Warehouse, config: InjectConfig, segments: pa.Table) -> list[list[str]]:
    """Each QA step's question's passage, in `qa_pairs`' order, for the base to read as its teacher (qa_teacher): a
    train question's top retrieved documents cut as the RAG row's, a knowledge question's own segment."""
    ids = read_questions(wh, None, "train").column("question_id").to_pylist()
    passages = [[" ".join(d.split()[:TEACHER_WORDS]) for d in docs]
                for docs in retrieved_documents(wh, ids, TEACHER_DOCUMENTS)]
    if config.knowledge_questions:
        text_of = dict(zip(segments.column("segment_id").to_pylist(), segments.column("text").to_pylist()))
        asked = wh.read("knowledge_questions", ["segment_id"], partitions=[config.corpus])
        passages += [[text_of[s]] if s in text_of else [] for s in asked.column("segment_id").to_pylist()]
    return passages


def previous_injection(wh: Warehouse, name: str, knowledge_digest: str) -> SourceModel | None:
    """The newest model `name` injected from other knowledge than `knowledge_digest` (the slots a knowledge refresh
    starts from), or None. Models injected from the current knowledge are passed over, so that rerunning a
    refresh finds the same start and is skipped."""
    for run in list_runs(wh, stage="inject"):
        if run.status != "success" or not run.checkpoint or not model_present(run):
            continue
        candidate = model_at(Path(run.checkpoint))
        digest = candidate.info.get("knowledge_digest", candidate.info.get("knowledge"))  # the key's older name
        if candidate.info.get("name") == name and digest != knowledge_digest:
            return candidate
    return None


def general_rows(wh: Warehouse, tokenizer, base_dir: Path, config: InjectConfig) -> np.ndarray:
    """The general corpus packed as the base's pretraining packed it, without the base's held-out rows: the
    no-forgetting check's text stays unseen by the slots."""
    held_path = base_dir / "held_out.npy"
    held = np.load(held_path) if held_path.exists() else np.zeros((0, GENERAL_SEQ_LEN), dtype=np.int64)
    rows = packed_rows(wh, tokenizer, config.general_corpus, held.shape[1])
    held_set = {row.tobytes() for row in held}
    rows = rows[[row.tobytes() not in held_set for row in rows]]
    if not len(rows):
        raise ValueError(f"general_share={config.general_share}, but corpus {config.general_corpus!r} has no text "
                         f"beyond the base's held-out rows")
    return rows


# ---- fine-tuning ---------------------------------------------------------------------------------

def finetune(wh: Warehouse, config: FinetuneConfig, force: bool = False) -> StageResult:
    """All parameters (optionally not the NKB) trained on `question: …` → first answer, or on a generation task."""
    from nkb_model.train import choose_device
    source = source_model(wh, config.model)
    config = finetune_defaults(source, config)
    name = config.model_name()
    if config.task:
        examples, datasets = gen_examples(wh, config.task, config.split), [config.task]
        data = reads.task_examples(wh, config.task, config.split)
    else:
        examples = read_questions(wh, config.datasets, config.split)
        datasets = sorted(set(examples.column("dataset").to_pylist()))
        data = reads.questions(wh, datasets, config.split)
    declared = reads.Declared("finetune", config, [
        reads.model(source), data, reads.retrievals(wh, datasets) if config.knowledge != "none" else reads.NOTHING],
        identity={"name": name})
    target = model_dir(wh, name, declared.fingerprint)
    device = choose_device(config.device, config.precision)
    return declared.run(wh, lambda run: _finetune(run, wh, config, source, examples, datasets, target, device),
                        force=force, device=device.name, still_valid=model_present)


def _finetune(run: StagedRun, wh: Warehouse, config: FinetuneConfig, source: SourceModel, examples,
              datasets: list[str], target: Path, device) -> dict:
    from nkb_model.checkpoint import save_model
    from nkb_model.train import train
    started = time.perf_counter()
    name = config.model_name()
    model, tokenizer, source_info = source.load()
    kind = family(model)
    knowledge = {"knowledge": config.knowledge, "knowledge_docs": config.knowledge_docs,
                 "kformer_doc_tokens": config.kformer_doc_tokens, "kformer_rank": config.kformer_rank,
                 "answer_format": kind.answer_format(config.answer_format, config.knowledge, config.model),
                 "max_input_len": config.max_input_len, "task": config.task}
    texts, knowledge_ids, answers = training_pairs(wh, examples, tokenizer, config, knowledge)
    prepare_finetuning(model, config, device)
    batches = kind.pair_batches(lambda epoch: (texts, answers), tokenizer, min(config.batch_size, len(texts)),
                                config.seed, config.max_input_len, max_target_len=128 if config.task else 64,
                                knowledge_ids=knowledge_ids, group_by_length=config.group_by_length)
    steps = config.epochs * batches.per_epoch
    losses = train(model, batches, config.train_config(steps, batches.batch_size), device, resumable_dir(run, target),
                   f"finetune {name}", progress)
    for step, loss in losses:
        run.metric(f"{config.task}_loss" if config.task else "qa_loss", loss, split=config.split, step=step)
    model.to("cpu")
    kept = ("arch", "params_injected", "layers", "slots", "base_model")
    info = {**{k: v for k, v in source_info.items() if k in kept},
            "name": name, "kind": "finetuned", "source": config.model, "source_kind": source_info["kind"],
            "params": sum(p.numel() for p in model.parameters()), "built_by": run.run_id,
            "final_loss": losses[-1][1], "datasets": datasets, **knowledge}
    publish_model(run, target, lambda d: save_model(model, tokenizer, d, info, weights_changed=True))
    run.output("steps", steps)
    return {"model": name, "questions": len(texts), "steps": steps, "final_loss": round(losses[-1][1], 4),
            "seconds": time.perf_counter() - started, "device": device.name}


# Fine-tuning's learning rate and epochs when none are given, by where the base came from (and what trains). The
# paper's 1e-3 and 30 epochs suit the small bases pretrained here. On a pretrained model brought in (SmolLM2-135M,
# 8 sample-world QA pairs, Adafactor, 3 steps; loss on another 8 pairs): every parameter at 1e-3 sets it back
# (7.10 → 5.21 → 8.14 → 7.80), at 3e-5 it learns steadily (→ 6.11 → 5.40 → 5.16); its top 2 blocks alone learn at
# 1e-3 (→ 5.82 → 5.21 → 5.17) and barely move at 3e-5 (→ 6.94 after 3 steps). Its top blocks fine-tuned on 100
# train questions answer best after 3 epochs and worse after more (four runs: 2, 9 or 19 blocks, on a CPU and a
# GPU), 30 learn them by heart; 3 is also transformers' Trainer's default. docs/decisions.md.
FINETUNE_LR = {("built here", "everything"): 1e-3, ("built here", "top blocks"): 1e-3,
               ("brought in", "everything"): 3e-5, ("brought in", "top blocks"): 1e-3}
FINETUNE_EPOCHS = {"built here": 30, "brought in": 3}


def finetune_defaults(source: SourceModel, config: FinetuneConfig) -> FinetuneConfig:
    """`config` with its learning rate and epochs, where not given, chosen for `source` (FINETUNE_LR,
    FINETUNE_EPOCHS): its base was pretrained by the base-model stage (its info has a size) or brought in (a Hugging
    Face folder, a GGUF file, a package)."""
    from nkb_model.checkpoint import read_info
    origin = "built here" if "size" in read_info(base_dir_of(source.directory)) else "brought in"
    trains = "everything" if config.train_blocks is None else "top blocks"
    return config.model_copy(update={"lr": config.lr or FINETUNE_LR[origin, trains],
                                     "epochs": config.epochs or FINETUNE_EPOCHS[origin]})


def training_pairs(wh: Warehouse, examples, tokenizer, config: FinetuneConfig, knowledge: dict):
    """(inputs, retrieved documents' ids for Kformer or None, targets) to fine-tune on: a generation task's
    examples as they are, or questions (with their retrieved documents, as `knowledge` says) and first answers."""
    if config.task:
        return gen_inputs(examples), None, examples.column("target").to_pylist()
    answers = [qa_pair(q, a[0], knowledge["answer_format"])[1] for q, a in
               zip(examples.column("question").to_pylist(), examples.column("answers").to_pylist())]
    texts, knowledge_ids = qa_inputs(wh, examples, tokenizer, knowledge)
    return texts, knowledge_ids, answers


def prepare_finetuning(model, config: FinetuneConfig, device) -> None:
    """Mount Kformer when asked, move the model to the device, and set what trains: everything, or the top
    `train_blocks` blocks, the NKB slots left out with `freeze_nkb` (their dropout off too)."""
    import torch
    from nkb_model.nkb import mounted_layers
    if config.knowledge == "kformer":
        from nkb_model.kformer import KformerConfig, mount_kformer
        torch.manual_seed(config.seed)
        mount_kformer(model, KformerConfig(layers=config.kformer_layers, docs=config.knowledge_docs,
                                           doc_tokens=config.kformer_doc_tokens, rank_by_question=config.kformer_rank))
    model.to(device.device)
    top = top_block_parameters(model, config.train_blocks)
    for param_name, param in model.named_parameters():
        param.requires_grad = not (config.freeze_nkb and ".nkb_" in param_name) and (top is None or param in top)
    model.train()
    if config.freeze_nkb:
        for layer in mounted_layers(model).values():
            layer.nkb_dropout.eval()


def top_block_parameters(model, blocks: int | None):
    """The parameters of the decoder's top `blocks` blocks (a set by identity), or None for every parameter."""
    if blocks is None:
        return None
    from nkb_model.mounting import block_stack
    stack = list(block_stack(model, "decoder"))
    if blocks > len(stack):
        raise ValueError(f"train_blocks={blocks} but the model's decoder has {len(stack)} blocks")
    return {p for block in stack[-blocks:] for p in block.parameters()}
