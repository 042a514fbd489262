"""Stages over a trained NKB: `analyze` (slots as key-value memories), `surgery` (the λ sweep of the
paper's Table 8) and `edit` (change one fact and save the result as a new model version)."""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np

from flows.configs import AnalyzeConfig, EditConfig, SurgeryConfig
from flows.model_stages import _publish, _questions, find_model, model_dir, qa_pair
from nkb_model.checkpoint import INFO, hf_dir, read_info
from warehouse import StagedRun, StageResult, Warehouse, fingerprint, run_stage


def _model_inputs(source: Path) -> list[str]:
    return [str(source), read_info(source).get("built_by", "")]


def _relations(wh: Warehouse, path: str | None) -> dict[str, str]:
    """question_id -> relation, from a facts file (default: the sample world's), or {} without one."""
    from corpus.sample_world import WorldFiles
    from flows.stages import world_dir
    facts = Path(path) if path else WorldFiles.at(world_dir(wh)).root / "facts.jsonl"
    if not facts.exists():
        return {}
    rows = [json.loads(line) for line in facts.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {r["question_id"]: r["relation"] for r in rows if "question_id" in r and "relation" in r}


def _default_edit_layer(model) -> str:
    from nkb_model.nkb import mounted_layers
    names = list(mounted_layers(model))
    if not names:
        raise ValueError("the model has no NKB mounted; surgery edits NKB slots")
    decoder = [n for n in names if n.startswith("decoder")]
    return (decoder or names)[-1]


# ---- analyze --------------------------------------------------------------------------------------

def analyze(wh: Warehouse, config: AnalyzeConfig, force: bool = False) -> StageResult:
    """nkb_values (top tokens and category of every value) and nkb_keys (top questions of every key)."""
    import torch

    from nkb_model import analysis
    from nkb_model.checkpoint import load_model
    from nkb_model.nkb import mounted_layers
    from nkb_model.train import choose_device
    source = find_model(wh, config.model)
    name = read_info(source)["name"]
    questions = _questions(wh, None, config.split)
    relations = _relations(wh, config.facts)
    inputs = _model_inputs(source) + [f"{n}:{f}" for n, f in wh.lineage("salient_spans")]
    inputs += [f"{n}:{f}" for n, f in wh.lineage("questions") if n.endswith("." + config.split)]
    fp = fingerprint("analyze", config.model_dump(exclude={"device"}), inputs + [str(len(relations))])
    device = choose_device(config.device)

    def body(run: StagedRun) -> dict:
        started = time.perf_counter()
        run.run.device = device.name
        model, tokenizer, info = load_model(source)
        model.to(device.device).eval()
        layers = config.layers or (list(mounted_layers(model)) if config.kind == "nkb" else ["decoder.-1"])
        spans = wh.read("salient_spans", ["text", "label"])
        lexicon = analysis.SpanLexicon(spans.column("text").to_pylist(), spans.column("label").to_pylist())
        answer_format = info.get("answer_format", "plain")
        texts = [qa_pair(q, None, answer_format)[0] for q in questions.column("question").to_pylist()]
        qids = questions.column("question_id").to_pylist()
        values_out = {k: [] for k in ("model", "kind", "layer", "slot", "top_tokens", "top_probs", "category")}
        keys_out = {k: [] for k in ("model", "kind", "layer", "slot", "top_questions", "weights", "relation")}
        categories: Counter = Counter()
        relation_of = [relations.get(q) for q in qids]
        triggers: list[list[int]] = []
        for layer in layers:
            memory = analysis.memories(model, layer, config.kind)
            ids, probs = analysis.project_values(model, memory.values, config.top_k)
            tokens = [tokenizer.convert_ids_to_tokens(row) for row in ids.tolist()]
            cats = [lexicon.category(row[0]) for row in tokens]
            categories.update(cats)
            n = len(cats)
            for key, column in (("model", [name] * n), ("kind", [config.kind] * n), ("layer", [memory.layer] * n),
                                ("slot", list(range(n))), ("top_tokens", tokens), ("top_probs", probs.tolist()),
                                ("category", cats)):
                values_out[key] += column
            weights = analysis.first_step_weights(model, tokenizer, texts, memory.layer, config.kind)
            top = weights.T.topk(min(config.top_questions, len(texts)), dim=-1)     # (slots, k)
            for slot, (rows, w) in enumerate(zip(top.indices.tolist(), top.values.tolist())):
                fired = [r for r, x in zip(rows, w) if x > 0]     # a slot that never fires has no trigger
                triggers.append(fired)
                shared = {relation_of[r] for r in fired}
                relation = next(iter(shared)) if len(fired) >= 2 and len(shared) == 1 else None
                for key, value in (("model", name), ("kind", config.kind), ("layer", memory.layer), ("slot", slot),
                                   ("top_questions", [qids[r] for r in fired]), ("weights", w[:len(fired)]),
                                   ("relation", relation)):
                    keys_out[key].append(value)
        part = f"{name}.{config.kind}"
        run.write("nkb_values", part, values_out)
        run.write("nkb_keys", part, keys_out)
        total = sum(categories.values())
        shares = {c: 100.0 * categories[c] / total for c in ("Person", "Place", "Organisation", "Date", "Other", "None")}
        for c, share in shares.items():
            run.metric(f"value_category_share.{c}", share)
        judged = sum(len(t) >= 2 for t in triggers)
        coherence = 100.0 * analysis.coherence(triggers, relation_of) if relations and judged else None
        if coherence is not None:
            run.metric("key_coherence", coherence)
        plot = wh.files_dir / "analysis" / f"{run.run_id}-categories.png"
        title = f"{name} ({config.kind}, {', '.join(layers)}): top token of each value"
        run.publish_file(plot, lambda path: _category_plot(shares, title, path))
        return {"model": name, "kind": config.kind, "layers": layers, "slots": total,
                "categories": {c: round(s, 1) for c, s in shares.items()},
                "key_coherence": None if coherence is None else round(coherence, 1), "keys_judged": judged,
                "plot": str(plot), "seconds": time.perf_counter() - started}

    return run_stage(wh, "analyze", config.model_dump(), fp, body, force=force, device=device.name)


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

def surgery(wh: Warehouse, config: SurgeryConfig, force: bool = False) -> StageResult:
    """For questions the model gets wrong at the first token: edit the top slot toward the gold first
    token, for every λ; record success and how many other answers changed; undo each edit."""
    from nkb_model import analysis
    from nkb_model.checkpoint import load_model
    from nkb_model.train import choose_device
    source = find_model(wh, config.model)
    name = read_info(source)["name"]
    questions = _questions(wh, None, config.split)
    inputs = _model_inputs(source) + [f"{n}:{f}" for n, f in wh.lineage("questions") if n.endswith("." + config.split)]
    fp = fingerprint("surgery", config.model_dump(exclude={"device"}), inputs)
    device = choose_device(config.device)

    def body(run: StagedRun) -> dict:
        started = time.perf_counter()
        run.run.device = device.name
        model, tokenizer, info = load_model(source)
        model.to(device.device).eval()
        layer = config.layer or _default_edit_layer(model)
        answer_format = info.get("answer_format", "plain")
        texts = [qa_pair(q, None, answer_format)[0] for q in questions.column("question").to_pylist()]
        gold = [tokenizer(a[0], add_special_tokens=False)["input_ids"][0] for a in questions.column("answers").to_pylist()]
        predicted = analysis.first_token(model, tokenizer, texts)
        wrong = [i for i in range(len(texts)) if predicted[i] != gold[i]]
        rng = np.random.default_rng(config.seed)
        chosen = [int(i) for i in rng.permutation(wrong)[:config.questions]]
        qids = questions.column("question_id").to_pylist()
        out = {k: [] for k in ("model", "question_id", "layer", "slot", "lambda", "original", "target", "new",
                               "success", "change_rate")}
        for i in chosen:
            slot = analysis.top_slot(model, tokenizer, texts[i], layer)
            others = [int(j) for j in rng.choice([j for j in range(len(texts)) if j != i],
                                                 size=min(config.others, len(texts) - 1), replace=False)]
            for lam in config.lambdas:
                edit = analysis.edit_slot(model, layer, slot, gold[i], predicted[i], lam)
                after = analysis.first_token(model, tokenizer, [texts[i]] + [texts[j] for j in others])
                edit.undo(model)
                changed = sum(after[1 + n] != predicted[j] for n, j in enumerate(others)) / len(others)
                for key, value in (("model", name), ("question_id", qids[i]), ("layer", layer), ("slot", slot),
                                   ("lambda", lam), ("original", tokenizer.convert_ids_to_tokens(predicted[i])),
                                   ("target", tokenizer.convert_ids_to_tokens(gold[i])),
                                   ("new", tokenizer.convert_ids_to_tokens(after[0])),
                                   ("success", after[0] == gold[i]), ("change_rate", changed)):
                    out[key].append(value)
        run.write("edits", f"{name}.surgery", out)
        table = []
        for lam in config.lambdas:
            rows = [k for k, x in enumerate(out["lambda"]) if x == lam]
            success = 100.0 * np.mean([out["success"][k] for k in rows]) if rows else None
            change = 100.0 * np.mean([out["change_rate"][k] for k in rows]) if rows else None
            if rows:
                run.metric(f"surgery_success@{lam:g}", success)
                run.metric(f"surgery_change_rate@{lam:g}", change)
            table.append({"lambda": lam, "success": success, "change_rate": change})
        return {"model": name, "layer": layer, "questions_edited": len(chosen), "wrong_first_tokens": len(wrong),
                "sweep": table, "seconds": time.perf_counter() - started}

    return run_stage(wh, "surgery", config.model_dump(), fp, body, force=force, device=device.name)


# ---- edit: one fact, saved as a new model version ------------------------------------------------

def edit(wh: Warehouse, config: EditConfig, force: bool = False) -> StageResult:
    """Edit the top slot at each step of the wanted answer (multi-token answers: one slot per token),
    then save the NKB as a new model that shares the source's T5 weights, with the edit log."""
    from nkb_model import analysis
    from nkb_model.checkpoint import load_model, save_model
    from nkb_model.train import choose_device
    source = find_model(wh, config.model)
    source_info = read_info(source)
    # The default name is a digest of the edit, so the same edit of the same model is one version.
    digest = hashlib.sha256(json.dumps([config.question, config.answer, config.layer, config.lam]).encode()).hexdigest()
    name = config.name or f"{source_info['name']}.edit-{digest[:8]}"
    fp = fingerprint("edit", config.model_dump(exclude={"device"}) | {"name": name}, _model_inputs(source))
    target = model_dir(wh, name, fp)
    device = choose_device(config.device)

    def body(run: StagedRun) -> dict:
        started = time.perf_counter()
        run.run.device = device.name
        model, tokenizer, info = load_model(source)
        model.to(device.device).eval()
        layer = config.layer or _default_edit_layer(model)
        text = qa_pair(config.question, None, info.get("answer_format", "plain"))[0]
        old_answer = _greedy_answer(model, tokenizer, text)
        wanted = tokenizer(config.answer, add_special_tokens=False)["input_ids"]
        steps = []
        for t, token in enumerate(wanted):  # teacher-forced: step t sees the wanted answer's first t tokens
            predicted = _next_token(model, tokenizer, text, wanted[:t])
            if predicted == token:
                continue
            slot = analysis.top_slot(model, tokenizer, text, layer, prefix=wanted[:t])
            analysis.edit_slot(model, layer, slot, token, predicted, config.lam)
            steps.append({"step": t, "slot": slot, "original": tokenizer.convert_ids_to_tokens(predicted),
                          "target": tokenizer.convert_ids_to_tokens(token)})
        new_answer = _greedy_answer(model, tokenizer, text)
        log = list(source_info.get("edits", [])) + [{
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "question": config.question, "old_answer": old_answer,
            "new_answer": new_answer, "wanted": config.answer, "layer": layer, "lambda": config.lam, "steps": steps,
            "source": source_info["name"]}]
        new_info = {**{k: v for k, v in source_info.items() if k not in ("built_by", "edits")},
                    "name": name, "kind": "edited", "source": source_info["name"], "source_kind": source_info["kind"],
                    "base_dir": str(hf_dir(source)), "built_by": run.run_id, "edits": log}
        model.to("cpu")
        _publish(run, target, target.parent / f".edit-{target.name}",
                 lambda d: save_model(model, tokenizer, d, new_info, weights_changed=False))
        return {"model": name, "old_answer": old_answer, "new_answer": new_answer,
                "whole_answer": new_answer == config.answer, "slots_edited": len(steps),
                "seconds": time.perf_counter() - started}

    target.parent.mkdir(parents=True, exist_ok=True)
    return run_stage(wh, "edit", config.model_dump() | {"name": name}, fp, body, force=force, device=device.name,
                     still_valid=lambda r: (Path(r.checkpoint or "") / INFO).exists())


def _next_token(model, tokenizer, text: str, prefix: list[int]) -> int:
    import torch
    device = next(model.parameters()).device
    enc = tokenizer([text], return_tensors="pt").to(device)
    ids = torch.tensor([[model.config.decoder_start_token_id] + prefix], device=device)
    with torch.no_grad():
        return int(model(**enc, decoder_input_ids=ids).logits[0, -1].argmax())


def _greedy_answer(model, tokenizer, text: str, max_new_tokens: int = 32) -> str:
    import torch
    from nkb_model.evaluation import filled_span
    device = next(model.parameters()).device
    enc = tokenizer([text], return_tensors="pt").to(device)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1)
    return filled_span(tokenizer.decode(out[0], skip_special_tokens=False))
