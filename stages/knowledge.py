"""Stages over a trained NKB: `analyze` (slots as key-value memories), `surgery` (the strength sweep of the
paper's Table 8) and `edit` (change facts and save the result as a new model version)."""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np

from corpus.errors import InputFileError
from corpus.files import iter_jsonl
from nkb_model.families import answer_frame, qa_pair
from stages import reads
from stages.configs import AnalyzeConfig, Asking, EditConfig, SlotEditConfig, SurgeryConfig
from stages.inputs import asked_in_prompt, model_inputs, read_questions
from stages.models import model_dir, model_present, publish_model, source_model
from warehouse import StagedRun, StageResult, Warehouse, file_digest


def _relations(path: str | None) -> dict[str, str]:
    """question_id -> relation, from a facts file, or {} without one."""
    rows = [obj for _, obj in iter_jsonl(path)] if path else []
    return {r["question_id"]: r["relation"] for r in rows if "question_id" in r and "relation" in r}


def _model_texts(wh: Warehouse, questions, model, tokenizer, info: dict, asking: Asking | None = None) -> list[str]:
    """The texts the model reads for the questions, asked as `asking` says (`model_inputs`)."""
    return model_inputs(wh, questions, model, tokenizer, info, asking)[0]


# ---- analyze --------------------------------------------------------------------------------------

def analyze(wh: Warehouse, config: AnalyzeConfig, force: bool = False) -> StageResult:
    """nkb_values (top tokens and category of every value) and nkb_keys (top questions of every key)."""
    from nkb_model.train import choose_device
    source = source_model(wh, config.model)
    span_parts = reads.retrieved_span_partitions(wh)
    declared = reads.Declared("analyze", config, [reads.model(source), reads.partitions(span_parts),
                                            reads.questions(wh, None, config.split), reads.shots(wh, config.shots),
                                            reads.file(config.facts)])
    device = choose_device(config.device, config.precision)
    questions, relations = read_questions(wh, None, config.split), _relations(config.facts)
    return declared.run(wh, lambda run: _analyze(run, wh, config, source, questions, relations,
                                                 [n for n, _ in span_parts], device), force=force, device=device.name)


def _analyze(run: StagedRun, wh: Warehouse, config: AnalyzeConfig, source, questions, relations: dict[str, str],
             span_partitions: list[str], device) -> dict:
    from nkb_model import analysis
    from nkb_model.nkb import mounted_layers
    started = time.perf_counter()
    model, tokenizer, info = source.load(device)
    layers = config.layers or (list(mounted_layers(model)) if config.kind == "nkb" else ["decoder.-1"])
    spans = wh.read("salient_spans", ["text", "label"], partitions=span_partitions)
    lexicon = analysis.SpanLexicon(spans.column("text").to_pylist(), spans.column("label").to_pylist())
    texts = _model_texts(wh, questions, model, tokenizer, info, config.asking)
    qids = questions.column("question_id").to_pylist()
    relation_of = [relations.get(q) for q in qids]
    with device.autocast():  # every layer's slots read in one pass over the questions
        weights = analysis.first_step_weights(model, tokenizer, texts, layers, config.kind)
        read = [memory_rows(model, tokenizer, layer, weights[layer], config, qids, relation_of, lexicon,
                            source.name) for layer in layers]
    values_out, keys_out, triggers = {}, {}, []
    for values, keys, fired in read:
        for out, rows in ((values_out, values), (keys_out, keys)):
            for key, column in rows.items():
                out.setdefault(key, []).extend(column)
        triggers += fired
    part = f"{source.name}.{config.kind}"
    run.write("nkb_values", part, values_out)
    run.write("nkb_keys", part, keys_out)
    judged = sum(len(t) >= 2 for t in triggers)
    coherence = 100.0 * analysis.coherence(triggers, relation_of) if relations and judged else None
    return {"model": source.name, "kind": config.kind, "layers": layers, "slots": len(values_out.get("slot", [])),
            **_record_categories(run, wh, values_out, coherence, f"{source.name} ({config.kind}, {', '.join(layers)})"),
            "keys_judged": judged, "seconds": time.perf_counter() - started}


def _record_categories(run: StagedRun, wh: Warehouse, values: dict, coherence: float | None, what: str) -> dict:
    """The share of each kind of span among the values' top tokens, and the keys' coherence, as metrics and a plot."""
    categories = Counter(values.get("category", []))
    total = sum(categories.values())
    shares = {c: 100.0 * categories[c] / total for c in ("Person", "Place", "Organisation", "Date", "Other", "None")}
    for c, share in shares.items():
        run.metric(f"value_category_share.{c}", share)
    if coherence is not None:
        run.metric("key_coherence", coherence)
    plot = wh.files_dir / "analysis" / f"{run.run_id}-categories.png"
    run.publish_file(plot, lambda path: _category_plot(shares, f"{what}: top token of each value", path))
    return {"categories": {c: round(s, 1) for c, s in shares.items()},
            "key_coherence": None if coherence is None else round(coherence, 1), "plot": str(plot)}


def memory_rows(model, tokenizer, layer: str, weights, config: AnalyzeConfig, qids: list[str],
                relation_of: list, lexicon, model_name: str) -> tuple[dict, dict, list[list[int]]]:
    """One block's slots (or FFN neurons) read as memories: its `nkb_values` rows (each value's top tokens on the
    vocabulary, and the kind of span the first names), its `nkb_keys` rows (the questions that make each slot fire
    most, and the relation they all share, if one), and each slot's firing questions. weights: how strongly each
    slot fired on each question, (questions, slots) (`analysis.first_step_weights`)."""
    from nkb_model import analysis
    memory = analysis.memories(model, layer, config.kind)
    ids, probs = analysis.project_values(model, memory.values, config.top_k)
    tokens = [tokenizer.convert_ids_to_tokens(row) for row in ids.tolist()]
    n = len(tokens)
    values = {"model": [model_name] * n, "kind": [config.kind] * n, "layer": [memory.layer] * n, "slot": list(range(n)),
              "top_tokens": tokens, "top_probs": probs.tolist(),
              "category": [lexicon.category(analysis.piece_text(tokenizer, t[0])) for t in tokens]}
    top = weights.T.topk(min(config.top_questions, len(qids)), dim=-1)     # (slots, k)
    keys: dict[str, list] = {k: [] for k in ("model", "kind", "layer", "slot", "top_questions", "weights", "relation")}
    triggers = []
    for slot, (rows, w) in enumerate(zip(top.indices.tolist(), top.values.tolist())):
        fired = [r for r, x in zip(rows, w) if x > 0]     # a slot that never fires has no trigger
        triggers.append(fired)
        shared = {relation_of[r] for r in fired}
        relation = next(iter(shared)) if len(fired) >= 2 and len(shared) == 1 else None
        for key, value in (("model", model_name), ("kind", config.kind), ("layer", memory.layer), ("slot", slot),
                           ("top_questions", [qids[r] for r in fired]), ("weights", w[:len(fired)]),
                           ("relation", relation)):
            keys[key].append(value)
    return values, keys, triggers


def _category_plot(shares: dict[str, float], title: str, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.bar(list(shares), list(shares.values()), color="#4878a8")
    for i, v in enumerate(shares.values()):
        ax.text(i, v + 0.5, f"{v:.1f}", ha="center", fontsize=8)
    ax.set(ylabel="% of values", title=title)
    ax.title.set_fontsize(9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- surgery -------------------------------------------------------------------------------------

def _site(wh: Warehouse, config: SlotEditConfig, model, tokenizer, info: dict, asking: Asking | None = None):
    """Where a surgery or an edit goes: the configured block (default the last decoder NKB), the decoder ids before
    the model's answers, and for slot=specific each slot's usual activation on the reference questions (asked as
    `asking` says: few-shot, their answers end with the line, not with EOS)."""
    from nkb_model import slot_edits
    layer = config.layer or slot_edits.default_layer(model)
    prefix, end = answer_frame(tokenizer, info.get("answer_format", "plain"))
    end = None if asking is not None and asked_in_prompt(info, asking.shots) else end
    typical = None
    if config.slot == "specific":
        reference = read_questions(wh, None, config.reference)
        answers = [a[0] for a in reference.column("answers").to_pylist()]
        texts = _model_texts(wh, reference, model, tokenizer, info, asking)
        typical = slot_edits.slot_profile(model, tokenizer, texts, answers, layer, prefix, end)
    return slot_edits.Site(layer, tuple(prefix), typical)


def _site_read(wh: Warehouse, config: SlotEditConfig) -> reads.Read:
    """The reference questions whose activations pick a specific slot."""
    return reads.questions(wh, None, config.reference) if config.slot == "specific" else reads.NOTHING


def surgery(wh: Warehouse, config: SurgeryConfig, force: bool = False) -> StageResult:
    """For questions the model gets wrong at the first answer token: edit a slot toward the gold first token, at
    every strength; record success and how many other answers changed; undo each edit."""
    from nkb_model.train import choose_device
    source = source_model(wh, config.model)
    declared = reads.Declared("surgery", config, [reads.model(source), reads.questions(wh, None, config.split),
                                            _site_read(wh, config), reads.shots(wh, config.shots)])
    device = choose_device(config.device, config.precision)
    questions = read_questions(wh, None, config.split)
    return declared.run(wh, lambda run: _surgery(run, wh, config, source, questions, device), force=force,
                        device=device.name)


def _surgery(run: StagedRun, wh: Warehouse, config: SurgeryConfig, source, questions, device) -> dict:
    from nkb_model import slot_edits
    started = time.perf_counter()
    absolute = config.lambdas is not None
    grid = config.lambdas if absolute else config.strengths
    model, tokenizer, info = source.load(device)
    gold = [a[0] for a in questions.column("answers").to_pylist()]
    texts = _model_texts(wh, questions, model, tokenizer, info, config.asking)
    with device.autocast():
        site = _site(wh, config, model, tokenizer, info, config.asking)
        rows, wrong = slot_edits.sweep(model, tokenizer, texts, gold, site, grid,
                                       config.questions, config.others, config.seed, absolute)
    qids = questions.column("question_id").to_pylist()
    run.write("edits", f"{source.name}.surgery", {
        "model": [source.name] * len(rows), "question_id": [qids[r["question"]] for r in rows],
        "layer": [site.layer] * len(rows),
        "strength": [None if absolute else r["strength"] for r in rows],
        **{k: [r[k] for r in rows] for k in ("slot", "lambda", "original", "target", "new", "success",
                                             "change_rate")}})
    return {"model": source.name, "layer": site.layer, "slot": config.slot,
            "questions_edited": len({r["question"] for r in rows}), "wrong_first_tokens": wrong,
            "sweep": [_sweep_point(run, rows, value, absolute) for value in grid],
            "seconds": time.perf_counter() - started}


def _sweep_point(run: StagedRun, rows: list[dict], value: float, absolute: bool) -> dict:
    """One strength's (or λ's) success and change rate over its edits, recorded as metrics."""
    mine = [r for r in rows if r["strength"] == value]
    success = 100.0 * np.mean([r["success"] for r in mine]) if mine else None
    rates = [r["change_rate"] for r in mine if r["change_rate"] is not None]
    change = 100.0 * np.mean(rates) if rates else None
    key = f"lambda={value:g}" if absolute else f"{value:g}"
    if mine:
        run.metric(f"surgery_success@{key}", success)
    if rates:
        run.metric(f"surgery_change_rate@{key}", change)
    applied = [r["lambda"] for r in mine if r["lambda"] is not None]  # None: no slot held the step
    mean = {"mean_lambda": float(np.mean(applied))} if applied and not absolute else {}
    return {"lambda" if absolute else "strength": value, "success": success, "change_rate": change,
            "edited": len(applied), **mean}


# ---- edit: facts changed, saved as a new model version -------------------------------------------

def read_edits(path: str) -> list[dict]:
    """The edits of a JSONL file: {question, answer, paraphrases} each, checked line by line."""
    edits = []
    for line, obj in iter_jsonl(path):
        for key in ("question", "answer"):
            if not isinstance(obj.get(key), str) or not obj[key].strip():
                raise InputFileError(path, f"line {line}", f"`{key}` must be a non-empty string")
        paraphrases = obj.get("paraphrases", [])
        if not isinstance(paraphrases, list) or not all(isinstance(p, str) and p.strip() for p in paraphrases):
            raise InputFileError(path, f"line {line}", "`paraphrases` must be a list of non-empty strings")
        edits.append({"question": obj["question"], "answer": obj["answer"], "paraphrases": paraphrases})
    if not edits:
        raise InputFileError(path, None, "no edits in the file")
    return edits


def edit(wh: Warehouse, config: EditConfig, force: bool = False) -> StageResult:
    """Edit a slot (the site's choice) at each step of each wanted answer (multi-token answers: one slot per
    token), then save the NKB as a new model that shares the source's T5 weights, with the edit log. A batch of edits is measured
    for success, generalisation (paraphrases) and locality (unedited validation questions)."""
    from nkb_model.train import choose_device
    batch = read_edits(config.edits) if config.edits else None
    source = source_model(wh, config.model)
    requests = batch or [{"question": config.question, "answer": config.answer, "paraphrases": []}]
    # The default name is a digest of the edits, so the same edits of the same model are one version.
    identity = [config.layer, config.slot, config.strength, config.lam, requests]
    name = config.name or f"{source.name}.edit-{hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:8]}"
    declared = reads.Declared("edit", config, [
        reads.model(source), reads.mark(f"edits:{file_digest(config.edits)}") if batch else reads.NOTHING,
        _site_read(wh, config), reads.questions(wh, None, config.split) if batch else reads.NOTHING],
        identity={"name": name}, record=config.model_dump() | {"name": name})
    target = model_dir(wh, name, declared.fingerprint)
    device = choose_device(config.device, config.precision)
    return declared.run(wh, lambda run: _edit(run, wh, config, source, requests, bool(batch), name, target, device),
                        force=force, device=device.name, still_valid=model_present)


def _edit(run: StagedRun, wh: Warehouse, config: EditConfig, source, requests: list[dict], batch: bool, name: str,
          target: Path, device) -> dict:
    from nkb_model import slot_edits
    from nkb_model.checkpoint import hf_dir, relative_base, save_model
    started = time.perf_counter()
    model, tokenizer, info = source.load(device)
    with device.autocast():
        site = _site(wh, config, model, tokenizer, info)
    answer_format = info.get("answer_format", "plain")
    _, end = answer_frame(tokenizer, answer_format)

    def text(question: str) -> str:
        return qa_pair(question, None, answer_format)[0]
    asked = [slot_edits.Request(text(r["question"]), r["answer"], [text(p) for p in r["paraphrases"]])
             for r in requests]
    strength, absolute = (config.lam, True) if config.lam else (config.strength, False)
    locality = _locality_texts(wh, config, requests, model, tokenizer, info) if batch else []
    with device.autocast():
        done = slot_edits.edit_many(model, tokenizer, asked, locality, site, strength, device, absolute, end)
    new_info = {**{k: v for k, v in source.info.items() if k not in ("built_by", "edits")},
                "name": name, "kind": "edited", "source": source.name, "source_kind": source.info["kind"],
                "base_folder": relative_base(hf_dir(source.directory), target), "built_by": run.run_id,
                "edits": _edit_log(config, source, requests, done, site.layer)}
    model.to("cpu")
    publish_model(run, target, lambda d: save_model(model, tokenizer, d, new_info, weights_changed=False))
    return {"model": name, "edits": len(requests), **_record_edit_rates(run, requests, done),
            **({} if batch else {"old_answer": done["edits"][0]["old_answer"],
                                 "new_answer": done["edits"][0]["new_answer"],
                                 "whole_answer": done["edits"][0]["success"]}),
            "seconds": time.perf_counter() - started}


def _edit_log(config: EditConfig, source, requests: list[dict], done: dict, layer: str) -> list[dict]:
    """The source's edit log with these edits added: what was asked, what the model said before and after."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return list(source.info.get("edits", [])) + [
        {"time": stamp, "question": r["question"], "old_answer": d["old_answer"], "new_answer": d["new_answer"],
         "wanted": r["answer"], "layer": layer, "slot_choice": config.slot,
         "strength": None if config.lam else config.strength,
         "lambda": [s["lambda"] for s in d["steps"]], "steps": d["steps"], "source": source.name}
        for r, d in zip(requests, done["edits"])]


def _record_edit_rates(run: StagedRun, requests: list[dict], done: dict) -> dict:
    """Success, generalisation and locality in %, and the slots edited, as metrics and outputs."""
    rates = {k: None if done[k] is None else round(100 * done[k], 1) for k in ("success", "generalization", "locality")}
    run.metric("edit_count", len(requests))
    slots_edited = sum(s["slot"] is not None for d in done["edits"] for s in d["steps"])
    run.output("slots_edited", slots_edited)
    for key, value in rates.items():
        if value is not None:
            run.metric(f"edit_{key}", value)
    return {**rates, "slots_edited": slots_edited}


def _locality_texts(wh: Warehouse, config: EditConfig, requests: list[dict], model, tokenizer,
                    info: dict) -> list[str]:
    """Model inputs of up to `config.locality` questions of the split that no edit asks (in any wording)."""
    questions = read_questions(wh, None, config.split)
    asked = {q for r in requests for q in [r["question"], *r["paraphrases"]]}
    keep = [i for i, q in enumerate(questions.column("question").to_pylist()) if q not in asked]
    chosen = sorted(np.random.default_rng(config.seed).permutation(keep)[:config.locality].tolist())
    return _model_texts(wh, questions.take(chosen), model, tokenizer, info)
