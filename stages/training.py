"""Model stages (GPU pool): they read the warehouse, train or evaluate, and write models and results back.

The device and precision are chosen once here, at each stage's entry, and passed down.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from flows import distributed
from flows.configs import BaseModelConfig, EvaluateConfig, FinetuneConfig, InjectConfig, ReportConfig
from flows.stages import corpus_lineage, ner_processes, progress
from nkb_model.checkpoint import INFO, hf_dir, read_info
from warehouse import StagedRun, StageResult, Warehouse, fingerprint, list_runs, run_metrics, run_stage

MODEL_STAGES = ("base-model", "inject", "finetune", "edit")  # stages whose runs publish a model
GENERAL_SEQ_LEN = 128  # general-text rows for injection into a base without held-out rows (e.g. t5-base)


def _texts(wh: Warehouse, corpus: str) -> list[str]:
    texts = []
    for batch in wh.scan("documents", ["text"], filter=pc.field("corpus") == corpus):
        texts += batch.column("text").to_pylist()
    if not texts:
        raise ValueError(f"corpus {corpus!r} has no documents")
    return texts


def _model_present(run) -> bool:
    return (Path(run.checkpoint or "") / INFO).exists()


def find_model(wh: Warehouse, name: str) -> Path:
    """The directory of the newest model called `name`, or `name` itself if it is a model directory."""
    if (Path(name) / "config.json").exists():
        return Path(name)
    for run in list_runs(wh):
        if run.stage in MODEL_STAGES and run.status == "success" and _model_present(run):
            if read_info(run.checkpoint)["name"] == name:
                return Path(run.checkpoint)
    raise ValueError(f"no model named {name!r}; train it first (nkb run base-model / inject / finetune)")


def _publish(run: StagedRun, target: Path, work: Path, write) -> None:
    """Write a model that becomes `target` when the run commits; the training checkpoint `work` goes then."""
    if not run.is_leader:
        return  # torchrun ranks above 0: rank 0 publishes
    run.publish_folder(target, write, drop=work)
    run.run.checkpoint = str(target)


def _questions_lineage(wh: Warehouse, datasets: list[str], split: str) -> list[str]:
    return [f"{n}:{f}" for n, f in wh.lineage("questions") if n.split(".")[0] in datasets and n.endswith("." + split)]


def model_dir(wh: Warehouse, name: str, fp: str) -> Path:
    return wh.files_dir / "models" / f"{name}-{fp[:12]}"


def pretrain_base_model(wh: Warehouse, config: BaseModelConfig, force: bool = False) -> StageResult:
    """Tokenizer + span-corruption pretraining; saves a Hugging Face directory under `files/models/`."""
    if config.devices > 1 and not distributed.in_worker():
        return distributed.launch("base-model", wh, config, force)
    from nkb_model import base_model
    from nkb_model.train import TrainConfig, choose_device, train
    corpora = sorted(set(config.tokenizer_corpora) | {config.pretrain_corpus})
    params = config.model_dump(exclude={"device", "devices", "micro_batch_size"})
    inputs = [f"{c}:{corpus_lineage(wh, c)}" for c in corpora]
    if config.ssm_share:
        from corpus import ner
        inputs.append(ner.model_id())
    fp = fingerprint("base-model", params, inputs)
    target = model_dir(wh, config.name, fp)
    device = choose_device(config.device)

    def body(run: StagedRun) -> dict:
        started = time.perf_counter()
        run.run.device = device.name
        tokenizer = base_model.train_tokenizer(
            (t for c in config.tokenizer_corpora for t in _texts(wh, c)), config.vocab_size)
        rows = _packed_rows(wh, tokenizer, config.pretrain_corpus, config.seq_len)
        order = np.random.default_rng(config.seed).permutation(len(rows))
        n_held = int(len(rows) * config.held_out_share)
        held_out, train_rows = rows[order[:n_held]], rows[order[n_held:]]
        model = base_model.new_t5(tokenizer, config.size, config.dropout, config.seed).to(device.device)
        model.train()
        batches = base_model.SpanCorruptionBatches(train_rows, tokenizer, config.batch_size, config.seed)
        if config.ssm_share and config.steps:
            batches = base_model.Interleaved(batches, _salient_span_batches(tokenizer, train_rows, config),
                                             config.ssm_share)
        train_config = TrainConfig(steps=config.steps, batch_size=config.batch_size,
                                   micro_batch_size=config.micro_batch_size, lr=config.lr,
                                   warmup_steps=config.warmup_steps, decay=config.lr_decay,
                                   optimizer=config.optimizer)
        # The checkpoint folder is named by the inputs fingerprint, so an interrupted run resumes.
        work = target.parent / f".train-{target.name}"
        losses = train(model, batches, train_config, device, work, desc=f"pretrain {config.name}") if config.steps else []
        for step, loss in losses:
            run.metric("pretrain_loss", loss, dataset=config.pretrain_corpus, split="train", step=step)
        n_params = sum(p.numel() for p in model.parameters())
        info = {"name": config.name, "kind": "base", "size": config.size, "params": n_params,
                "vocab": len(tokenizer), "built_by": run.run_id, "final_loss": losses[-1][1] if losses else None}

        def write(directory: Path) -> None:
            model.save_pretrained(directory)
            tokenizer.save_pretrained(directory)
            np.save(directory / "held_out.npy", held_out)  # for the no-forgetting check
            (directory / INFO).write_text(json.dumps(info, indent=1))

        _publish(run, target, work, write)
        run.run.outputs["model_params"] = n_params
        run.metric("params_total", n_params)
        seconds = time.perf_counter() - started
        return {"model": str(target), "params": n_params, "final_loss": round(losses[-1][1], 4) if losses else None,
                "sequences": len(train_rows), "seconds": seconds, "device": device.name}

    target.parent.mkdir(parents=True, exist_ok=True)
    return run_stage(wh, "base-model", config.model_dump(), fp, body, force=force, device=device.name,
                     still_valid=_model_present)


def _packed_rows(wh: Warehouse, tokenizer, corpus: str, seq_len: int) -> np.ndarray:
    """A corpus's documents tokenized and packed into rows of `seq_len` tokens; the same for pretraining and for
    injection's general text, so that injection can tell the base's held-out rows apart."""
    from nkb_model.base_model import pack
    ids = tokenizer(_texts(wh, corpus), add_special_tokens=False)["input_ids"]
    return pack(ids, seq_len, tokenizer.eos_token_id)


def _salient_span_batches(tokenizer, rows: np.ndarray, config: BaseModelConfig):
    """SSM batches over the sentences of the pretraining rows (their own text: the held-out rows stay unseen),
    one entity or date masked per sentence and redrawn every epoch, like the injection corpus's."""
    import pyarrow as pa

    from corpus import ner
    from corpus.segment import segment
    from corpus.ssm import ssm_examples
    from nkb_model.batches import Seq2SeqBatches
    eos = tokenizer.eos_token
    texts = [doc for row in tokenizer.batch_decode(rows) for doc in row.split(eos)]
    ids, pieces = zip(*((f"{t}.{i}", piece) for t, text in enumerate(texts)
                        for i, piece in enumerate(segment(text, config.ssm_max_words))))
    found = ner.salient_spans(zip(pieces, ids), n_process=ner_processes(pieces))
    found = progress(iterable=found, total=len(ids), desc="pretraining salient spans", unit=" seg")
    spans = pa.Table.from_pylist(
        [{"segment_id": seg_id, "start_char": span.start_char, "end_char": span.end_char}
         for seg_id, seg_spans in found for span in seg_spans],
        schema=pa.schema([("segment_id", pa.string()), ("start_char", pa.int32()), ("end_char", pa.int32())]))
    segments = pa.table({"segment_id": list(ids), "text": list(pieces)})

    @functools.lru_cache(maxsize=1)  # epoch 0 is asked for by the check below and twice by Seq2SeqBatches
    def examples(epoch: int) -> tuple[list[str], list[str]]:
        ex = ssm_examples(segments, spans, seed=config.seed, epoch=epoch, skip_repeated=True)
        return ex.column("input").to_pylist(), ex.column("target").to_pylist()

    available = len(examples(0)[0])
    if not available:
        raise ValueError(f"ssm_share={config.ssm_share}, but spaCy found no salient span in the "
                         f"{config.pretrain_corpus!r} pretraining text")
    return Seq2SeqBatches(examples, tokenizer, min(config.ssm_batch_size, available), config.seed,
                          max_input_len=config.seq_len)


def _lineage(wh: Warehouse, table: str, partition: str) -> str:
    found = [fp for name, fp in wh.lineage(table, partition) if name == partition or name.startswith(partition + "-")]
    if not found:
        raise ValueError(f"no {table} for {partition!r}; run the salient-spans stage first")
    return ",".join(found)


def inject(wh: Warehouse, config: InjectConfig, force: bool = False) -> StageResult:
    """Mount NKB slots on a base model and train them (or everything, nkb-a) on SSM examples."""
    if config.devices > 1 and not distributed.in_worker():
        return distributed.launch("inject", wh, config, force)
    from corpus.ssm import ssm_examples
    from nkb_model.batches import Seq2SeqBatches
    from nkb_model.checkpoint import load_model, save_model
    from nkb_model.nkb import NKBConfig, mark_only_nkb_trainable, mount_nkb, mounted_layers
    from nkb_model.train import TrainConfig, choose_device, train
    base_dir = find_model(wh, config.base_model)
    name = config.model_name()
    inputs = [str(base_dir), read_info(base_dir).get("built_by", ""), _lineage(wh, "segments", config.corpus),
              _lineage(wh, "salient_spans", config.corpus)]
    if config.general_share:
        inputs.append(f"{config.general_corpus}:{corpus_lineage(wh, config.general_corpus)}")
    fp = fingerprint("inject", config.model_dump(exclude={"device", "devices", "micro_batch_size"}) | {"name": name}, inputs)
    target = model_dir(wh, name, fp)
    device = choose_device(config.device)

    def body(run: StagedRun) -> dict:
        started = time.perf_counter()
        run.run.device = device.name
        segments = wh.read("segments", ["segment_id", "text"], filter=pc.field("segment_id").isin(
            wh.read("salient_spans", ["segment_id"]).column("segment_id").unique()))
        spans = wh.read("salient_spans", ["segment_id", "start_char", "end_char"])

        def examples(epoch: int) -> tuple[list[str], list[str]]:
            ex = ssm_examples(segments, spans, seed=config.seed, epoch=epoch, skip_repeated=config.skip_repeated_spans)
            return ex.column("input").to_pylist(), ex.column("target").to_pylist()

        model, tokenizer, _ = load_model(base_dir)
        import torch
        torch.manual_seed(config.seed)
        mount_nkb(model, NKBConfig(layers=config.layers, slots=config.slots))
        model.to(device.device)
        if config.variant == "nkb":
            trainable = mark_only_nkb_trainable(model)
            model.eval()  # frozen parts run without dropout
            for layer in mounted_layers(model).values():
                layer.nkb_dropout.train()
        else:
            for p in model.parameters():
                p.requires_grad = True
            trainable = sum(p.numel() for p in model.parameters())
            model.train()
        ssm = batches = Seq2SeqBatches(examples, tokenizer, config.batch_size, config.seed, config.max_input_len)
        if config.general_share:
            from nkb_model.base_model import Interleaved
            batches = Interleaved(ssm, _general_batches(wh, tokenizer, base_dir, config), config.general_share)
        train_config = TrainConfig(steps=config.steps, batch_size=config.batch_size,
                                   micro_batch_size=config.micro_batch_size, lr=config.lr,
                                   warmup_steps=config.warmup_steps, optimizer=config.optimizer)
        work = target.parent / f".train-{target.name}"
        losses = train(model, batches, train_config, device, work, desc=f"inject {name}")
        for step, loss in losses:
            run.metric("ssm_loss", loss, dataset=config.corpus, split="train", step=step)
        model.to("cpu")
        total = sum(p.numel() for p in model.parameters())
        info = {"name": name, "kind": config.variant, "base_dir": str(hf_dir(base_dir)), "base_model": config.base_model,
                "params": total, "params_injected": trainable, "built_by": run.run_id, "final_loss": losses[-1][1],
                "layers": model.nkb_config.layers, "slots": model.nkb_config.slots}
        _publish(run, target, work, lambda d: save_model(model, tokenizer, d, info, config.variant == "nkb-a"))
        run.run.outputs["params_injected"] = trainable
        run.metric("params_total", total)
        run.metric("params_injected", trainable)
        return {"model": name, "params_total": total, "params_injected": trainable,
                "final_loss": round(losses[-1][1], 4), "examples_per_epoch": ssm.per_epoch * config.batch_size,
                "seconds": time.perf_counter() - started, "device": device.name}

    target.parent.mkdir(parents=True, exist_ok=True)
    return run_stage(wh, "inject", config.model_dump(), fp, body, force=force, device=device.name,
                     still_valid=_model_present)


def _general_batches(wh: Warehouse, tokenizer, base_dir: Path, config: InjectConfig):
    """Span-corruption batches of the general corpus packed as the base's pretraining packed it, without the
    base's held-out rows: the no-forgetting check's text stays unseen by the slots."""
    from nkb_model.base_model import SpanCorruptionBatches
    held_path = base_dir / "held_out.npy"
    held = np.load(held_path) if held_path.exists() else np.zeros((0, GENERAL_SEQ_LEN), dtype=np.int64)
    rows = _packed_rows(wh, tokenizer, config.general_corpus, held.shape[1])
    held_set = {row.tobytes() for row in held}
    rows = rows[[row.tobytes() not in held_set for row in rows]]
    if not len(rows):
        raise ValueError(f"general_share={config.general_share}, but corpus {config.general_corpus!r} has no text "
                         f"beyond the base's held-out rows")
    return SpanCorruptionBatches(rows, tokenizer, min(config.general_batch_size, len(rows)), config.seed)


# ---- closed-book QA -----------------------------------------------------------------------------

def _questions(wh: Warehouse, datasets: list[str] | None, split: str):
    table = wh.read("questions", ["question_id", "dataset", "split", "question", "answers"],
                    filter=pc.field("split") == split)
    if datasets:
        table = table.filter(pc.field("dataset").isin(datasets))
    if table.num_rows == 0:
        raise ValueError(f"no {split!r} questions{' for ' + ', '.join(datasets) if datasets else ''}; "
                         "run the questions stage first")
    return table.sort_by("question_id")


def qa_pair(question: str, answer: str | None, answer_format: str) -> tuple[str, str | None]:
    """Model input and target for a question. `plain` is the paper's (`question: …` → answer); `sentinel`
    asks for the answer the way salient span masking asks for a span (`… answer: <extra_id_0>` →
    `<extra_id_0> answer <extra_id_1>`), so fine-tuning starts from the path the NKB was trained on."""
    if answer_format == "sentinel":
        return f"question: {question} answer: <extra_id_0>", None if answer is None else f"<extra_id_0> {answer} <extra_id_1>"
    return f"question: {question}", answer


def retrieved_documents(wh: Warehouse, question_ids: list[str], docs: int | None) -> list[list[str]]:
    """The texts of each question's retrieved documents in rank order (the top `docs`, or all)."""
    wanted = pc.field("question_id").isin(question_ids)
    hits = wh.read("retrievals", ["question_id", "rank", "doc_id"],
                   filter=wanted if docs is None else wanted & (pc.field("rank") <= docs))
    if hits.num_rows == 0:
        raise ValueError("no retrievals for these questions; run the retrieve stage first")
    documents = wh.read("documents", ["doc_id", "text"], filter=pc.field("doc_id").isin(hits.column("doc_id").unique()))
    text_of = dict(zip(documents.column("doc_id").to_pylist(), documents.column("text").to_pylist()))
    by_question: dict[str, list[tuple[int, str]]] = {}
    for q, rank, doc in zip(*(hits.column(c).to_pylist() for c in ("question_id", "rank", "doc_id"))):
        by_question.setdefault(q, []).append((rank, text_of.get(doc, "")))
    return [[text for _, text in sorted(by_question.get(q, []))] for q in question_ids]


def qa_inputs(wh: Warehouse, questions, tokenizer, info: dict):
    """Model inputs for `questions` the way the model was fine-tuned (`info`): the texts, and for Kformer the
    documents' token ids. Concat appends the documents after the question, so truncation cuts documents."""
    texts = [qa_pair(q, None, info.get("answer_format", "plain"))[0] for q in questions.column("question").to_pylist()]
    mode = info.get("knowledge", "none")
    if mode == "none":
        return texts, None
    ranked = mode == "kformer" and info.get("kformer_rank", False)
    documents = retrieved_documents(wh, questions.column("question_id").to_pylist(),
                                    None if ranked else info["knowledge_docs"])
    if mode == "concat":
        return [f"{t} context: {' '.join(d)}" for t, d in zip(texts, documents)], None
    from nkb_model.kformer import encode_documents
    return texts, encode_documents(tokenizer, documents, info["kformer_doc_tokens"])


def gen_examples(wh: Warehouse, task: str, split: str):
    """A general-generation task's split from `gen_examples`, in id order."""
    table = wh.read("gen_examples", filter=(pc.field("task") == task) & (pc.field("split") == split))
    if table.num_rows == 0:
        tasks = sorted({n for n, _ in wh.lineage("gen_examples")})
        raise ValueError(f"no {split!r} examples of task {task!r} (loaded: {', '.join(tasks) or 'none'}); "
                         "run the generation-data stage first")
    return table.sort_by("example_id")


def _gen_lineage(wh: Warehouse, task: str, split: str) -> list[str]:
    return [f"{n}:{f}" for n, f in wh.lineage("gen_examples") if n == f"{task}.{split}"]


def gen_inputs(table) -> list[str]:
    from corpus.generation import model_input
    return [model_input(k, s, a, b) for k, s, a, b in zip(*(table.column(c).to_pylist() for c in
                                                             ("kind", "source", "source_lang", "target_lang")))]


def finetune(wh: Warehouse, config: FinetuneConfig, force: bool = False) -> StageResult:
    """All parameters (optionally not the NKB) trained on `question: …` → first answer."""
    if config.devices > 1 and not distributed.in_worker():
        return distributed.launch("finetune", wh, config, force)
    from nkb_model.batches import Seq2SeqBatches
    from nkb_model.checkpoint import load_model, save_model
    from nkb_model.nkb import mounted_layers
    from nkb_model.train import TrainConfig, choose_device, train
    source = find_model(wh, config.model)
    name = config.model_name()
    if config.task:
        questions = gen_examples(wh, config.task, config.split)
        datasets = [config.task]
        lineage = _gen_lineage(wh, config.task, config.split)
    else:
        questions = _questions(wh, config.datasets, config.split)
        datasets = sorted(set(questions.column("dataset").to_pylist()))
        lineage = _questions_lineage(wh, datasets, config.split)
    inputs = [str(source), read_info(source).get("built_by", "")] + lineage
    if config.knowledge != "none":
        inputs += [f"{n}:{f}" for n, f in wh.lineage("retrievals") if n in datasets]
    fp = fingerprint("finetune", config.model_dump(exclude={"device", "devices", "micro_batch_size"}) | {"name": name}, inputs)
    target = model_dir(wh, name, fp)
    device = choose_device(config.device)

    def body(run: StagedRun) -> dict:
        started = time.perf_counter()
        run.run.device = device.name
        knowledge = {"knowledge": config.knowledge, "knowledge_docs": config.knowledge_docs,
                     "kformer_doc_tokens": config.kformer_doc_tokens, "kformer_rank": config.kformer_rank,
                     "answer_format": config.answer_format, "max_input_len": config.max_input_len, "task": config.task}
        model, tokenizer, source_info = load_model(source)
        if config.task:
            texts, knowledge_ids, answers = gen_inputs(questions), None, questions.column("target").to_pylist()
        else:
            answers = [qa_pair(q, a[0], config.answer_format)[1] for q, a in
                       zip(questions.column("question").to_pylist(), questions.column("answers").to_pylist())]
            texts, knowledge_ids = qa_inputs(wh, questions, tokenizer, knowledge)
        if config.knowledge == "kformer":
            import torch

            from nkb_model.kformer import KformerConfig, mount_kformer
            torch.manual_seed(config.seed)
            mount_kformer(model, KformerConfig(layers=config.kformer_layers, docs=config.knowledge_docs,
                                               doc_tokens=config.kformer_doc_tokens, rank_by_question=config.kformer_rank))
        model.to(device.device)
        for param_name, param in model.named_parameters():
            param.requires_grad = not (config.freeze_nkb and ".nkb_" in param_name)
        model.train()
        if config.freeze_nkb:  # fixed slots also keep their weights' dropout off
            for layer in mounted_layers(model).values():
                layer.nkb_dropout.eval()
        batches = Seq2SeqBatches(lambda epoch: (texts, answers), tokenizer, min(config.batch_size, len(texts)),
                                 config.seed, config.max_input_len, max_target_len=128 if config.task else 64,
                                 knowledge_ids=knowledge_ids)
        steps = config.epochs * batches.per_epoch
        train_config = TrainConfig(steps=steps, batch_size=batches.batch_size, micro_batch_size=config.micro_batch_size,
                                   lr=config.lr, decay=config.lr_decay, optimizer=config.optimizer)
        work = target.parent / f".train-{target.name}"
        losses = train(model, batches, train_config, device, work, desc=f"finetune {name}")
        for step, loss in losses:
            run.metric(f"{config.task}_loss" if config.task else "qa_loss", loss, split=config.split, step=step)
        model.to("cpu")
        info = {**{k: v for k, v in source_info.items() if k in ("params_injected", "layers", "slots", "base_model")},
                "name": name, "kind": "finetuned", "source": config.model, "source_kind": source_info["kind"],
                "params": sum(p.numel() for p in model.parameters()), "built_by": run.run_id,
                "final_loss": losses[-1][1], "datasets": datasets, **knowledge}
        _publish(run, target, work, lambda d: save_model(model, tokenizer, d, info, weights_changed=True))
        run.run.outputs["steps"] = steps
        return {"model": name, "questions": len(texts), "steps": steps, "final_loss": round(losses[-1][1], 4),
                "seconds": time.perf_counter() - started, "device": device.name}

    target.parent.mkdir(parents=True, exist_ok=True)
    return run_stage(wh, "finetune", config.model_dump(), fp, body, force=force, device=device.name,
                     still_valid=_model_present)


def evaluate(wh: Warehouse, config: EvaluateConfig, force: bool = False) -> StageResult:
    """QA: greedy answers for every question of the split, EM (SQuAD normalisation, max over gold answers).
    A generation task: beam search, ROUGE-L (summarisation) or SacreBLEU (translation)."""
    from nkb_model.checkpoint import load_model
    from nkb_model.metrics import bleu, exact_match, rouge_l
    from nkb_model.train import choose_device
    source = find_model(wh, config.model)
    source_info = read_info(source)
    name, task = source_info["name"], config.task or source_info.get("task")
    if task:
        examples = gen_examples(wh, task, config.split)
        groups = [task]
        lineage = _gen_lineage(wh, task, config.split)
    else:
        examples = _questions(wh, config.datasets, config.split)
        groups = sorted(set(examples.column("dataset").to_pylist()))
        lineage = _questions_lineage(wh, groups, config.split)
        if source_info.get("knowledge", "none") != "none":
            lineage += [f"{n}:{f}" for n, f in wh.lineage("retrievals") if n in groups]
    num_beams = config.num_beams or (4 if task else 1)
    max_new_tokens = config.max_new_tokens or (64 if task else 24)
    fp = fingerprint("evaluate", config.model_dump(exclude={"device", "batch_size"}) | {"task": task},
                     [str(source), source_info.get("built_by", "")] + lineage)
    device = choose_device(config.device)

    def body(run: StagedRun) -> dict:
        started = time.perf_counter()
        run.run.device = device.name
        model, tokenizer, info = load_model(source)
        model.to(device.device).eval()
        if task:
            texts, knowledge_ids = gen_inputs(examples), None
        else:
            texts, knowledge_ids = qa_inputs(wh, examples, tokenizer, info)
        outputs = _generate(model, tokenizer, texts, knowledge_ids, device, config.batch_size,
                            info.get("max_input_len", 256), max_new_tokens, num_beams)
        if task:
            ids, ds = examples.column("example_id").to_pylist(), [task] * examples.num_rows
            references = examples.column("target").to_pylist()
            correct = [p.strip() == r.strip() for p, r in zip(outputs, references)]
            kind = examples.column("kind")[0].as_py()
            metric, score = ("rougeL", rouge_l(outputs, references)) if kind == "summarization" else \
                ("bleu", bleu(outputs, references))
            run.metric(metric, score, dataset=task, split=config.split)
            scores = {metric: score}
        else:
            ids, ds = examples.column("question_id").to_pylist(), examples.column("dataset").to_pylist()
            correct = [exact_match(p, g) for p, g in zip(outputs, examples.column("answers").to_pylist())]
            scores = {}
            for dataset in groups:
                hits = [c for c, d in zip(correct, ds) if d == dataset]
                scores[dataset] = 100.0 * sum(hits) / len(hits)
                run.metric("em", scores[dataset], dataset=dataset, split=config.split)
        run.write("predictions", f"{name}.{config.split}", {
            "question_id": ids, "dataset": ds, "split": [config.split] * len(ds), "prediction": outputs,
            "exact_match": correct})
        return {"model": name, "questions": len(texts), ("scores" if task else "em"): {k: round(v, 2) for k, v in scores.items()},
                "seconds": time.perf_counter() - started, "device": device.name}

    return run_stage(wh, "evaluate", config.model_dump() | {"model_name": name, "task": task}, fp, body, force=force,
                     device=device.name)


def _generate(model, tokenizer, texts: list[str], knowledge_ids, device, batch_size: int, max_input_len: int,
              max_new_tokens: int, num_beams: int) -> list[str]:
    """Decoded outputs, batch by batch: for sentinel-format QA the span after `<extra_id_0>`, else the text."""
    import torch

    from nkb_model.evaluation import filled_span
    outputs = []
    for lo in range(0, len(texts), batch_size):
        enc = tokenizer(texts[lo:lo + batch_size], return_tensors="pt", padding=True, truncation=True,
                        max_length=max_input_len).to(device.device)
        with contextlib.ExitStack() as stack, torch.no_grad():
            stack.enter_context(device.autocast())
            if knowledge_ids is not None:
                from nkb_model.kformer import knowledge
                stack.enter_context(knowledge(model, knowledge_ids[lo:lo + batch_size].to(device.device),
                                              enc["input_ids"]))
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, num_beams=num_beams)
        outputs += [filled_span(t) for t in tokenizer.batch_decode(out, skip_special_tokens=False)]
    return outputs


# ---- the report (the paper's Table 3) ---------------------------------------------------------

def _latest_metrics(wh: Warehouse, model_name: str, split: str) -> list[dict]:
    """The metrics rows of the newest successful evaluation of a model."""
    for run in list_runs(wh, stage="evaluate"):
        if run.status == "success" and run.config.get("model_name") == model_name and run.config.get("split") == split:
            return run_metrics(wh, run.run_id)
    return []


def _latest_scores(wh: Warehouse, model_name: str, split: str) -> dict[str, float]:
    """{dataset: EM} of the newest successful evaluation of a model."""
    return {r["dataset"]: r["value"] for r in _latest_metrics(wh, model_name, split) if r["metric"] == "em"}


GENERATION_METRICS = ("rougeL", "bleu")


def _generation_scores(wh: Warehouse, available, config: ReportConfig) -> dict[str, list]:
    """The general-generation check: each pre-fine-tuning row's `<model>.<task>` scores."""
    out = {k: [] for k in ("model", "task", "split", "metric", "score")}
    for label, name, _, finetuned in available:
        if finetuned == name or label not in ("base", "base+NKB", "base+NKB-a"):
            continue
        for task in config.generation_tasks:
            for r in _latest_metrics(wh, f"{name}.{task}", config.split):
                if r["metric"] in GENERATION_METRICS:
                    for key, value in zip(out, (label, task, config.split, r["metric"], r["value"])):
                        out[key].append(value)
    return out


def _probe(run: StagedRun, name: str, model, tokenizer, probes: list[dict], split: str, device) -> list[float | None]:
    """EM of the probe in unseen and in seen (article) wording. Every fill goes to `predictions`, so that a
    low probe can be read fact by fact: question_id `<model>/<fact_id>/<probe>`, dataset `probe-<wording>`."""
    from nkb_model.evaluation import probe
    ems, out = [], {"question_id": [], "dataset": [], "split": [], "prediction": [], "exact_match": []}
    for wording in ("unseen", "seen"):
        mine = [p for p in probes if p.get("wording", "unseen") == wording]
        if not mine:
            ems.append(None)
            continue
        fills, hits = probe(model, tokenizer, [p["prompt"] for p in mine], [p["answer"] for p in mine], device)
        ems.append(100.0 * sum(hits) / len(hits))
        out["question_id"] += [f"{name}/{p['fact_id']}/{p['probe']}" for p in mine]
        out["dataset"] += [f"probe-{wording}"] * len(mine)
        out["split"] += [split] * len(mine)
        out["prediction"] += fills
        out["exact_match"] += hits
    if out["question_id"]:
        run.write("predictions", f"{name}.probe.{split}", out)
    return ems


def _base_dir_of(directory: Path) -> Path:
    info = read_info(directory)
    return directory if info["kind"] == "base" else Path(info["base_dir"])


def report(wh: Warehouse, config: ReportConfig, force: bool = False) -> StageResult:
    """Collect EM of each row's fine-tuned model; probe and held-out loss of each row's model before fine-tuning."""
    from corpus.sample_world import WorldFiles
    from flows.stages import world_dir
    from nkb_model.checkpoint import load_model
    from nkb_model.evaluation import heldout_loss
    from nkb_model.nkb import unmount_nkb
    from nkb_model.train import choose_device
    # (label, model before fine-tuning, its fine-tuned model); Kformer and concat exist only fine-tuned: they
    # have no probe or held-out loss of their own (their model before fine-tuning is the base).
    suffix = config.finetuned_suffix
    rows_spec = [("Transformer", config.transformer, None), ("base", config.base, None), ("base+NKB", config.nkb, None),
                 ("base+NKB-a", config.nkb_a, None), ("large", config.large, None),
                 ("Kformer", config.kformer, config.kformer), ("concat", config.concat, config.concat)]
    available = []
    for label, name, finetuned in rows_spec:
        if name:
            try:
                available.append((label, name, find_model(wh, name), finetuned or name + suffix))
            except ValueError:
                continue
    if not available:
        raise ValueError("no model of the report exists yet; run base-model, inject, finetune and evaluate first")
    probes_path = Path(config.probes) if config.probes else WorldFiles.at(world_dir(wh)).probes
    probes = [json.loads(line) for line in open(probes_path, encoding="utf-8")] if probes_path.exists() else []
    probes = [p for p in probes if p.get("split", config.split) == config.split]
    inputs = [f"{label}:{read_info(d).get('built_by', '')}" for label, _, d, _ in available]
    inputs += [f"{finetuned}:{json.dumps(_latest_scores(wh, finetuned, config.split), sort_keys=True)}"
               for _, _, _, finetuned in available]
    generation = _generation_scores(wh, available, config)
    inputs.append(json.dumps(generation, sort_keys=True))
    fp = fingerprint("report", config.model_dump(exclude={"device"}), inputs + [str(len(probes))])
    device = choose_device(config.device)

    def body(run: StagedRun) -> dict:
        run.run.device = device.name
        out = {k: [] for k in ("model", "dataset", "split", "em", "params_total", "params_injected", "probe_em",
                               "probe_seen_em", "heldout_loss")}
        summary = []
        for label, name, directory, finetuned in available:
            info = read_info(directory)
            model, tokenizer, _ = load_model(directory)
            model.to(device.device)
            probe_em = probe_seen_em = loss = None
            if finetuned != name:
                probe_em, probe_seen_em = _probe(run, info["name"], model, tokenizer, probes, config.split, device)
                held_path = _base_dir_of(directory) / "held_out.npy"
                loss = heldout_loss(model, tokenizer, np.load(held_path), device) if held_path.exists() else None
            if info["kind"] in ("nkb", "nkb-a") and loss is not None:
                unmount_nkb(model)
                run.metric("heldout_loss_nkb_unmounted", heldout_loss(model, tokenizer, np.load(held_path), device),
                           dataset=label)
            ems = _latest_scores(wh, finetuned, config.split)
            total = info.get("params") or sum(p.numel() for p in model.parameters())
            injected = info.get("params_injected", 0)
            # A row whose fine-tuned model has not been evaluated still shows its probe and held-out loss.
            em_rows = sorted(ems.items()) + [("average", float(np.mean(list(ems.values()))) if ems else None)]
            for dataset, em in em_rows:
                for key, value in zip(out, (label, dataset, config.split, em, total, injected, probe_em, probe_seen_em,
                                            loss)):
                    out[key].append(value)
            for metric, value in (("probe_em", probe_em), ("probe_seen_em", probe_seen_em)):
                if value is not None:
                    run.metric(metric, value, dataset=label, split=config.split)
            if loss is not None:
                run.metric("heldout_loss", loss, dataset=label)
            summary.append({"model": label, "em": ems, "probe_em": probe_em, "probe_seen_em": probe_seen_em,
                            "heldout_loss": loss})
        run.write("report", "latest", out)
        run.write("report_generation", "latest", generation)
        return {"rows": summary, "generation": [dict(zip(generation, r)) for r in zip(*generation.values())]}

    return run_stage(wh, "report", config.model_dump(), fp, body, force=force, device=device.name)
