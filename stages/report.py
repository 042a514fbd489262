"""The report stage (the paper's Table 3, and Table 4's general-generation check), and the report as tables.

Each row's EM comes from the newest evaluation of its fine-tuned model; its knowledge probe and held-out
loss are measured here, on the model before fine-tuning.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from corpus.files import iter_jsonl
from corpus.world_facts import source_version
from nkb_model.methods import METHODS
from stages import reads
from stages.configs import MAIN_ROW, REPORT_ROWS, ReportConfig, asks_zero_shot
from stages.names import evaluated_name, way_of_asking
from stages.report_routing import open_router, route_texts, routed_answers, routed_checks, routed_label, routed_loss
from warehouse import StagedRun, StageResult, Warehouse, get_run, list_runs, query, run_metrics
from warehouse.schemas import PARQUET_TABLES

GENERATION_METRICS = ("rougeL", "bleu")
GENERATION_ROWS = {r.label for r in REPORT_ROWS if r.generation}  # rows fine-tuned on the generation tasks


def latest_evaluation(wh: Warehouse, model_name: str, split: str):
    """The newest successful evaluate run whose answers are filed under `model_name` on `split`, or None."""
    return next((run for run in list_runs(wh, stage="evaluate") if run.status == "success"
                 and run.config.get("model_name") == model_name and run.config.get("split") == split), None)


def latest_metrics(wh: Warehouse, model_name: str, split: str) -> list[dict]:
    """The metrics rows of the newest successful evaluation of a model."""
    run = latest_evaluation(wh, model_name, split)
    return run_metrics(wh, run.run_id) if run else []


def latest_scores(wh: Warehouse, model_name: str, split: str) -> dict[str, float]:
    """{dataset: EM} of the newest successful evaluation of a model."""
    return {r["dataset"]: r["value"] for r in latest_metrics(wh, model_name, split) if r["metric"] == "em"}


def _generation_scores(wh: Warehouse, available, config: ReportConfig) -> dict[str, list]:
    """The general-generation check: each pre-fine-tuning row's `<model>.<task>` scores."""
    out = {k: [] for k in ("model", "task", "split", "metric", "score")}
    for label, name, _, finetuned in available:
        if finetuned == name or label not in GENERATION_ROWS:
            continue
        for task in config.generation_tasks:
            for r in latest_metrics(wh, f"{name}.{task}", config.split):
                if r["metric"] in GENERATION_METRICS:
                    for key, value in zip(out, (label, task, config.split, r["metric"], r["value"])):
                        out[key].append(value)
    return out


PROBE_WORDINGS = ("unseen", "seen")


def probes_worded(probes: list[dict], wording: str) -> list[dict]:
    return [p for p in probes if p.get("wording", "unseen") == wording]


def _probe(run: StagedRun, name: str, model, tokenizer, probes: list[dict], split: str,
           device) -> tuple[list[float | None], dict[str, list[bool]]]:
    """EM of the probe in unseen and in seen (article) wording, and each probe's hit by wording. Every fill goes to
    `predictions`, so that a low probe can be read fact by fact: question_id `<model>/<fact_id>/<probe>`, dataset
    `probe-<wording>`."""
    from nkb_model.checks import probe
    ems, out = [], {"model": [], "question_id": [], "dataset": [], "split": [], "prediction": [], "exact_match": []}
    by_wording = {}
    for wording in PROBE_WORDINGS:
        mine = probes_worded(probes, wording)
        if not mine:
            ems.append(None)
            continue
        fills, hits = probe(model, tokenizer, [p["prompt"] for p in mine], [p["answer"] for p in mine], device)
        ems.append(100.0 * sum(hits) / len(hits))
        by_wording[wording] = hits
        out["model"] += [name] * len(mine)
        out["question_id"] += [f"{name}/{p['fact_id']}/{p['probe']}" for p in mine]
        out["dataset"] += [f"probe-{wording}"] * len(mine)
        out["split"] += [split] * len(mine)
        out["prediction"] += fills
        out["exact_match"] += hits
    if out["question_id"]:
        run.write("predictions", f"{name}.probe.{split}", out)
    return ems, by_wording


HELD_OUT_EMPTY = ("not measured: the base holds no held-out rows (its general corpus packed into too few sequences "
                  "for held_out_share to keep one); rerun pretraining-data and base-model --force on more text")


FACT_TOKENS = 10  # a capital's name is at most 4 words: more tokens would only cost time


def ask_facts(model, tokenizer, facts: list[dict], device) -> tuple[list[str], list[bool]]:
    from nkb_model.checks import probe
    return probe(model, tokenizer, [f["prompt"] for f in facts], [f["answer"] for f in facts], device,
                 max_new_tokens=FACT_TOKENS)


def known_facts(directory: Path, device) -> list[dict]:
    """The real-world facts (`corpus.world_facts`) the base at `directory` completes right before any training."""
    from nkb_model.checkpoint import load_model
    model, tokenizer, _ = load_model(directory)
    return facts_known_by(model.to(device.device), tokenizer, device)


def facts_known_by(model, tokenizer, device) -> list[dict]:
    """The real-world facts a loaded model completes right."""
    from corpus.world_facts import capital_facts
    facts = capital_facts()
    _, hits = ask_facts(model, tokenizer, facts, device)
    return [f for f, hit in zip(facts, hits) if hit]


def _retained(run: StagedRun, name: str, model, tokenizer, facts: list[dict], split: str, device) -> list[bool]:
    """Whether the model still completes each of the base's known facts right; its fills go to `predictions`
    (dataset `retained`, question_id `<model>/<fact_id>`)."""
    if not facts:
        return []
    fills, hits = ask_facts(model, tokenizer, facts, device)
    run.write("predictions", f"{name}.retained.{split}", {
        "model": [name] * len(facts), "question_id": [f"{name}/{f['fact_id']}" for f in facts],
        "dataset": ["retained"] * len(facts),
        "split": [split] * len(facts), "prediction": fills, "exact_match": hits})
    return hits


def share(hits: list[bool]) -> float | None:
    """The share of hits in %, None for none asked."""
    return 100.0 * sum(hits) / len(hits) if len(hits) else None


def model_checks(run: StagedRun, directory, own_model: bool, probes: list[dict], split: str, device,
                 facts: list[dict] = (), route: Callable[[list[str]], np.ndarray] | None = None) -> dict:
    """A row's measurements on its own model (before fine-tuning; a row that exists only fine-tuned has none): the
    knowledge probe in unseen and seen wordings, the held-out loss and, for an injected model, the held-out loss with
    its slots unmounted (it must equal the base's), the share of the base's known `facts` it retained; with the
    model's parameter counts, training time and the run that built it. With `route` (which held-out texts go to the
    slots), an injected model's held-out loss routed too (`stages.report_routing`); the probes' and facts' hits
    are kept for it."""
    from nkb_model.checkpoint import load_model, read_info
    from nkb_model.checks import heldout_row_losses
    from nkb_model.nkb import unmount_nkb
    info = read_info(directory)
    model, tokenizer, _ = load_model(directory)
    model.to(device.device)
    probe_em = probe_seen_em = loss = routed = None
    probe_hits, fact_hits = {}, []
    if own_model:
        (probe_em, probe_seen_em), probe_hits = _probe(run, info["name"], model, tokenizer, probes, split, device)
        fact_hits = _retained(run, info["name"], model, tokenizer, list(facts), split, device)
        held = held_out_rows(run, directory)
        losses = heldout_row_losses(model, tokenizer, held, device) if held is not None else None
        loss = losses.mean() if losses is not None else None
    unmounted = to_slots = None
    if getattr(METHODS.get(info["kind"]), "slots", False) and loss is not None:
        unmount_nkb(model)
        base_losses = heldout_row_losses(model, tokenizer, held, device)
        unmounted = base_losses.mean()
        if route:
            to_slots = route(tokenizer.batch_decode(held, skip_special_tokens=True))
            routed = routed_loss(to_slots, losses, base_losses)
    return {"probe_em": probe_em, "probe_seen_em": probe_seen_em, "heldout_loss": loss,
            "heldout_loss_nkb_unmounted": unmounted, "retained_em": share(fact_hits), "probe_hits": probe_hits,
            "fact_hits": fact_hits, "heldout_loss_routed": routed, "heldout_to_slots": to_slots,
            "params_total": info.get("params") or sum(p.numel() for p in model.parameters()),
            "params_injected": info.get("params_injected", 0), "model_run": info.get("built_by"),
            "train_seconds": training_seconds(run.wh, info)}


def held_out_rows(run: StagedRun, directory) -> np.ndarray | None:
    """The held-out rows of the base the model at `directory` was built on; None where it holds none (said in the
    run's outputs)."""
    from stages.models import base_dir_of
    path = base_dir_of(directory) / "held_out.npy"
    held = np.load(path) if path.exists() else None
    if held is not None and not len(held):  # pretraining data made before a tiny corpus kept one row
        run.output("heldout_loss", HELD_OUT_EMPTY)
        return None
    return held


def training_seconds(wh: Warehouse, info: dict) -> float | None:
    """How long the run that trained a model took (None for a base: brought in or pretrained apart)."""
    built = get_run(wh, info["built_by"]) if info.get("kind") != "base" and info.get("built_by") else None
    return built.seconds if built else None


@dataclass(frozen=True)
class Reported:
    """One row as the report shows it: its label (with its way of asking, when a row is asked two ways), the row's
    own label, its model before fine-tuning and that model's folder, and the model whose answers are scored."""
    shown: str
    label: str
    model: str
    directory: Path
    evaluated: str
    way: tuple[int, bool] = (0, False)  # (K examples, asked in the prompt with none): how `evaluated` was asked
    asked: str = "fine-tuned"  # that way as the report says it (a row with documents is never fine-tuned: 0-shot)


def reported_rows(wh: Warehouse, config: ReportConfig) -> list[Reported]:
    """The report's rows whose models exist: a row asked two ways is reported twice. Kformer and concat exist only
    fine-tuned: they have no probe or held-out loss of their own (their model before fine-tuning is the base)."""
    from stages.models import find_model  # here: `nkb report` only reads tables
    available = []
    labelled = len(config.asked) + bool(config.zero_shot) > 1  # a row's label names its way when rows have two
    for row in REPORT_ROWS:
        name = getattr(config, row.field)
        if not name:
            continue
        try:
            directory = find_model(wh, name)
        except ValueError:
            continue
        if row.finetuned:
            available.append(Reported(row.label, row.label, name, directory, name))
            continue
        ways = [(shots, False) for shots in config.asked] + (  # (K, prompted)
            [(0, True)] if asks_zero_shot(config.zero_shot, row.key) else [])
        # a row with documents is never fine-tuned: its `fine-tuned` way and its zero-shot one are the same asking
        asked = {(way_of_asking(shots, row.documents, prompted),
                  evaluated_name(name, shots, row.documents, prompted)): (shots, prompted) for shots, prompted in ways}
        available += [Reported(f"{row.label} ({way})" if labelled else row.label, row.label, name, directory,
                               evaluated, how, way) for (way, evaluated), how in asked.items()]
    if not available:
        raise ValueError("no model of the report exists yet; run base-model, inject, finetune and evaluate first")
    return available


def report(wh: Warehouse, config: ReportConfig, force: bool = False) -> StageResult:
    """Collect EM of each row's fine-tuned model; probe and held-out loss of each row's model before fine-tuning."""
    from nkb_model.checkpoint import read_info
    from nkb_model.train import choose_device
    available = reported_rows(wh, config)
    probes = [obj for _, obj in iter_jsonl(config.probes)] if config.probes else []
    probes = [p for p in probes if p.get("split", config.split) == config.split]
    one_per_model: dict[str, tuple] = {}  # the first row of each model (a RAG row reads the base's model)
    for r in available:
        one_per_model.setdefault(r.model, (r.label, r.model, r.directory, r.evaluated))
    generation = _generation_scores(wh, one_per_model.values(), config)
    declared = reads.Declared("report", config, [
        reads.mark(*(f"{r.shown}:{read_info(r.directory).get('built_by', '')}" for r in available)),
        reads.mark(*(f"{r.evaluated}:{json.dumps(latest_scores(wh, r.evaluated, config.split), sort_keys=True)}"
                     for r in available)),
        reads.mark(json.dumps(generation, sort_keys=True)), reads.file(config.probes),
        reads.mark(source_version()) if config.retained else reads.NOTHING])
    device = choose_device(config.device, config.precision)
    return declared.run(wh, lambda run: _report(run, wh, config, available, probes, generation, device), force=force,
                        device=device.name)


# What each column of the report means: `nkb report` in every format, the `report` table, `nkb report --help` and
# docs/report.md all show these columns, in this order (a test holds them to the table's schema).
REPORT_GLOSSARY = {
    "model": "The row: its recipe (base, base+NKB, RAG, base+LoRA, ...) and, when a row is asked two ways, how.",
    "asked": "How its questions were asked: `5-shot` (five solved train questions before each), `0-shot` (the "
             "same prompt with none), or `fine-tuned` (the model fine-tuned on the train split, then asked alone).",
    "answers": "The name its answers are filed under, as `predictions`, `metrics` and `nkb runs` call that "
               "evaluation (base+nkb.5shot, base+nkb.qa): join the report to the answers on it. A routed row's: the "
               "slots' answers it routes among.",
    "dataset": "The QA dataset, or `average`: the mean of the datasets' EM, each weighed equally.",
    "split": "The split the questions come from (validation unless the report was told otherwise).",
    "em": "Exact match in %: answers equal to a gold answer after SQuAD's normalisation, the best over gold answers.",
    "em_low": "The low end of EM's 95 % bootstrap interval (the questions resampled 2,000 times; the average's, "
              "each dataset resampled on its own).",
    "em_high": "The high end of EM's 95 % bootstrap interval.",
    "retrieval_share": "The share of retrieval's gain the row keeps in its weights: (EM - base) / (RAG - base), the "
                       "base and RAG asked as the row is (RAG's own way where it is asked only one); 1 answers as "
                       "much as the documents in the prompt. Empty for the base and RAG, and where RAG gains nothing.",
    "retrieval_share_low": "The low end of its 95 % paired bootstrap interval (the three rows' answers to the same "
                           "questions resampled together); empty where retrieval's gain is itself in doubt.",
    "retrieval_share_high": "The high end of that interval.",
    "probe_em": "Knowledge probe in %: cloze prompts of the validation facts in wordings the knowledge never uses, "
                "asked of the model before fine-tuning; empty without a probes file.",
    "probe_seen_em": "The same probe in the knowledge's own wording: recall of the text itself.",
    "heldout_loss": "Next-token (T5: span-corruption) loss on held-out general text, the model before fine-tuning: "
                    "what it forgot of ordinary prose.",
    "heldout_loss_change": "heldout_loss against the base's, in %: negative is better than the base, positive "
                           "forgot.",
    "heldout_loss_unmounted": "The held-out loss with the slots taken off: equal to the base's when the base was "
                              "left untouched (the NKB's claim); empty for routes without slots.",
    "facts_retained": "Of the real-world facts the base completes right (capitals of countries), the share in % the "
                      "row still completes; empty where not measured.",
    "params_total": "Parameters of the row's model.",
    "params_trained": "Parameters trained to add the knowledge (the slots, LoRA's matrices, the FFN maps); 0 for "
                      "the base.",
    "train_seconds": "Seconds spent training the knowledge in (the injection's run, or the route's).",
    "model_run": "The run that built the row's model (`nkb runs`); the report's own run is `run_id`.",
}
REPORT_COLUMNS = tuple(REPORT_GLOSSARY)
REPORT_TYPES = {f.name: f.type for f in PARQUET_TABLES["report"]}


def _report(run: StagedRun, wh: Warehouse, config: ReportConfig, available: list[Reported], probes: list[dict],
            generation: dict, device) -> dict:
    previous = wh.read("report").to_pylist(), wh.read("report_answers").to_pylist()
    out = {k: [] for k in REPORT_COLUMNS}
    answers = {k: [] for k in ("model", "dataset", "question_id", "exact_match")}
    summary, checked = [], {}  # a model asked two ways is checked once
    facts = []
    if config.retained:
        facts = known_facts(next(r.directory for r in available if r.label == "base"), device)
        run.output("retained_facts", f"the base completes {len(facts)} facts right ({source_version()})")
    # routed: base+NKB's rows asked as the model is (few-shot, 0-shot); a fine-tuned row's slots unmounted are not
    # the fine-tuned base
    ways = {r.way for r in available if r.label == "base"}  # a routed row reads the base asked its way
    main_rows = [r for r in available if r.label == MAIN_ROW.label and r.way != (0, False) and r.way in ways]
    with open_router(wh) if config.routed and main_rows else contextlib.nullcontext() as router:
        for row in available:
            if row.model not in checked:
                checked[row.model] = model_checks(run, row.directory, row.evaluated != row.model, probes,
                                                  config.split, device, facts, router if row in main_rows else None)
            summary.append(_report_row(run, wh, config, row, checked[row.model], out, answers))
        if router:
            summary += _routed_rows(run, wh, config, router, available, main_rows, checked, probes, facts, out,
                                    answers)
    labels = {r.shown: r.label for r in available} | {routed_label(r.shown): r.label for r in main_rows}
    out["retrieval_share"], out["retrieval_share_low"], out["retrieval_share_high"] = \
        retrieval_shares(out, answers, labels)
    base = next((r for r in available if r.label == "base"), None)
    base_loss = checked[base.model]["heldout_loss"] if base else None
    out["heldout_loss_change"] = [100 * (loss - base_loss) / base_loss if loss is not None and base_loss else None
                                  for loss in out["heldout_loss"]]
    run.write("report", "latest", out)
    run.write("report_answers", "latest", answers)
    run.write("report_generation", "latest", generation)
    refreshed = refresh_rows(*previous, _rows(out), _rows(answers))
    if refreshed:  # else the last comparison stays: nothing was rebuilt since
        run.write("report_refresh", "latest", {k: [r[k] for r in refreshed] for k in refreshed[0]})
    return {"rows": summary, "generation": [dict(zip(generation, r)) for r in zip(*generation.values())],
            "refreshed": sorted({r["model"] for r in refreshed})}


RAG_LABEL = next(r.label for r in REPORT_ROWS if r.documents)


def retrieval_shares(out: dict, answers: dict, labels: dict[str, str]) -> tuple[list, list, list]:
    """Each report line's share of retrieval's gain with its interval (`nkb_model.metrics.retrieval_share`), None
    for the base, RAG, and a line without both beside it: the base asked the same way, and RAG so (or its one way)."""
    from nkb_model.metrics import retrieval_share
    hits: dict[tuple[str, str], dict[str, bool]] = {}
    for model, dataset, question, right in zip(*(answers[k] for k in ("model", "dataset", "question_id",
                                                                       "exact_match"))):
        hits.setdefault((model, dataset), {})[question] = bool(right)
    lines = list(zip(out["model"], out["asked"], out["dataset"]))

    def shown(label: str, asked: str, or_any: bool = False) -> str | None:
        """The line of row `label` asked `asked`; with `or_any`, its first line where none was asked so."""
        mine = [m for m, a, _ in lines if labels.get(m) == label]
        same = [m for m, a, _ in lines if labels.get(m) == label and a == asked]
        return same[0] if same else mine[0] if mine and or_any else None
    shares = []
    for model, asked, dataset in lines:
        base, rag = shown("base", asked), shown(RAG_LABEL, asked, or_any=True)
        if labels.get(model) in ("base", RAG_LABEL) or base is None or rag is None:
            shares.append((None, None, None))
            continue
        datasets = [d for m, _, d in lines if m == model and d != "average"] if dataset == "average" else [dataset]
        groups = []
        for d in datasets:
            answered = [hits.get((m, d), {}) for m in (model, base, rag)]
            common = sorted(set(answered[0]) & set(answered[1]) & set(answered[2]))
            if common:
                groups.append([[a[q] for q in common] for a in answered])
        shares.append(retrieval_share(*map(list, zip(*groups))) if groups else (None, None, None))
    return tuple(list(column) for column in zip(*shares)) if shares else ([], [], [])


def _routed_rows(run: StagedRun, wh: Warehouse, config: ReportConfig, router, available: list[Reported],
                 main_rows: list[Reported], checked: dict, probes: list[dict], facts: list[dict], out: dict,
                 answers: dict) -> list[dict]:
    """base+NKB routed, once per way base+NKB is asked (`stages.report_routing`), after the other rows."""
    routes = route_texts(wh, router, config.split, {w: probes_worded(probes, w) for w in PROBE_WORDINGS}, facts)
    run.output("routing", routes.summary(router, checked[main_rows[0].model]["heldout_to_slots"]))
    summary = []
    for row in main_rows:
        base = next(r for r in available if r.label == "base" and r.way == row.way)
        checks = routed_checks(routes, checked[row.model], checked[base.model])
        scored = routed_answers(wh, routes, row.evaluated, base.evaluated, config.split) \
            if latest_scores(wh, row.evaluated, config.split) and latest_scores(wh, base.evaluated, config.split) \
            else ({}, None)
        shown = replace(row, shown=routed_label(row.shown))
        summary.append(_report_row(run, wh, config, shown, checks, out, answers, scored))
    return summary


def _report_row(run: StagedRun, wh: Warehouse, config: ReportConfig, row: Reported, checks: dict, out: dict,
                answers: dict, scored: tuple[dict, dict | None] | None = None) -> dict:
    """One row's lines of `report` (one per dataset and their average) and its answers, added to `out` and
    `answers`; its checks recorded as metrics. A row whose fine-tuned model has not been evaluated still shows its
    probe and held-out loss. `scored`: the row's EM per dataset and answers where they come from no evaluation of
    its own (a routed row)."""
    ems = scored[0] if scored else latest_scores(wh, row.evaluated, config.split)
    em_rows = sorted(ems.items()) + [("average", float(np.mean(list(ems.values()))) if ems else None)]
    intervals = {}
    if ems:
        mine = scored[1] if scored else wh.read("predictions", ["dataset", "question_id", "exact_match"],
                                                partitions=[f"{row.evaluated}.{config.split}"]).to_pydict()
        answers["model"] += [row.shown] * len(mine["question_id"])
        for key in ("dataset", "question_id", "exact_match"):
            answers[key] += mine[key]
        intervals = em_intervals_of(mine)
    for dataset, em in em_rows:
        low, high = intervals.get(dataset, (None, None))
        values = {"model": row.shown, "asked": row.asked, "answers": row.evaluated, "dataset": dataset,
                  "split": config.split, "em": em, "em_low": low, "em_high": high,
                  "heldout_loss_change": None,  # against the base's, once every row is measured
                  "retrieval_share": None, "retrieval_share_low": None, "retrieval_share_high": None,  # the same
                  "heldout_loss_unmounted": checks["heldout_loss_nkb_unmounted"],
                  "facts_retained": checks["retained_em"], "params_trained": checks["params_injected"]}
        for key in out:
            out[key].append(values[key] if key in values else checks[key])
    for metric, split in (("probe_em", config.split), ("probe_seen_em", config.split), ("heldout_loss", None),
                          ("heldout_loss_nkb_unmounted", None), ("train_seconds", None), ("retained_em", None)):
        if checks[metric] is not None:
            run.metric(metric, checks[metric], dataset=row.shown, split=split, model=row.shown)
    return {"model": row.shown, "em": ems, "probe_em": checks["probe_em"], "probe_seen_em": checks["probe_seen_em"],
            "heldout_loss": checks["heldout_loss"]}


def _rows(columns: dict[str, list]) -> list[dict]:
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


def refresh_rows(before: list[dict], answers_before: list[dict], after: list[dict],
                 answers_after: list[dict]) -> list[dict]:
    """`report_refresh`'s rows: for each report row whose model was rebuilt since the report `before` (a knowledge
    refresh re-injects, then re-fine-tunes and re-evaluates), its EM per dataset and its probe then and now, and
    the questions it newly answers right and newly gets wrong. Rows in `report`/`report_answers` form."""
    built = {r["model"]: (r.get("model_run"), r["run_id"]) for r in before if r.get("model_run")}
    now = {r["model"]: r["model_run"] for r in after}
    rebuilt = [m for m in dict.fromkeys(now) if m in built and built[m][0] != now[m]]

    def right(rows, model):
        return {(a["dataset"], a["question_id"]): bool(a["exact_match"]) for a in rows if a["model"] == model}

    out = []
    for model in rebuilt:
        then, then_em = right(answers_before, model), {r["dataset"]: r for r in before if r["model"] == model}
        now_right, now_em = right(answers_after, model), {r["dataset"]: r for r in after if r["model"] == model}
        first_then, first_now = next(iter(then_em.values())), next(iter(now_em.values()))
        scores = [(d, then_em.get(d, {}).get("em"), now_em.get(d, {}).get("em"))
                  for d in dict.fromkeys([*now_em, *then_em])]
        scores.append(("probe", first_then.get("probe_em"), first_now.get("probe_em")))
        for dataset, em_before, em_after in scores:
            both = [q for q in now_right if q in then and (dataset == "average" or q[0] == dataset)]
            counted = dataset != "probe" and bool(both)
            out.append({"model": model, "dataset": dataset, "em_before": em_before, "em_after": em_after,
                        "newly_right": sum(now_right[q] and not then[q] for q in both) if counted else None,
                        "newly_wrong": sum(then[q] and not now_right[q] for q in both) if counted else None,
                        "model_run_before": built[model][0], "model_run_after": now[model],
                        "report_before": built[model][1]})
    return out


# ---- the report as tables (for `nkb report`) -----------------------------------------------------

def report_rows(wh: Warehouse) -> list[dict]:
    """The latest report's rows (one per model and dataset, plus each model's average)."""
    return query(wh, "SELECT * FROM report").to_pylist()


def rows_to_read(rows: list[dict]) -> list[dict]:
    """The rows a person reads: a model's average of a single dataset, which repeats that dataset's row, left out
    (CSV and JSON keep every row)."""
    lines = Counter(r["model"] for r in rows)  # a model's datasets and its average
    return [r for r in rows if r["dataset"] != "average" or lines[r["model"]] > 2]


def report_table(rows: list[dict], digits: bool = False) -> pa.Table:
    """The report's rows in its one schema, `REPORT_COLUMNS` (a report written before a column was added has it
    empty); `digits`: rounded as a person reads them (EM and seconds to 0.1, losses to 4 places)."""
    def shown(column, value):
        if not digits or not isinstance(value, float):
            return value
        return round(value, 4 if column in ("heldout_loss", "heldout_loss_unmounted") else 1)

    return pa.table({c: pa.array([shown(c, r.get(c)) for r in rows], REPORT_TYPES[c]) for c in REPORT_COLUMNS})


def by_model(rows: list[dict]) -> dict[str, dict]:
    """Each model's `average` row (its datasets' mean EM and its other columns), by the model's label."""
    return {r["model"]: r for r in rows if r["dataset"] == "average"}


def em_intervals_of(answers: dict[str, list]) -> dict[str, tuple[float, float]]:
    """{dataset or "average": 95 % bootstrap interval of EM} of one row's answers (`dataset`, `exact_match`)."""
    from nkb_model.metrics import bootstrap_interval
    hits: dict[str, list[bool]] = {}
    for dataset, right in zip(answers["dataset"], answers["exact_match"]):
        hits.setdefault(dataset, []).append(bool(right))
    out = {dataset: bootstrap_interval([values]) for dataset, values in hits.items()}
    if hits:
        out["average"] = bootstrap_interval(list(hits.values()))
    return out


def em_intervals(rows: list[dict]) -> dict[tuple[str, str], tuple[float, float]]:
    """{(model, dataset or "average"): 95 % bootstrap interval of its EM}, as the report recorded them."""
    return {(r["model"], r["dataset"]): (r["em_low"], r["em_high"]) for r in rows if r.get("em_low") is not None}


def generation_table(wh: Warehouse) -> pa.Table | None:
    """The general-generation scores, one row per model and a column per task (None without any)."""
    if not wh.partition_files("report_generation"):
        return None
    scores = query(wh, "SELECT model, task, metric, round(score, 1) AS score FROM report_generation "
                       "ORDER BY task, model").to_pylist()
    if not scores:
        return None
    tasks = list(dict.fromkeys(f"{g['task']} ({g['metric']})" for g in scores))
    models = list(dict.fromkeys(g["model"] for g in scores))
    return pa.table({"model": models} | {t: [next((g["score"] for g in scores if g["model"] == m
                                                   and f"{g['task']} ({g['metric']})" == t), None) for m in models]
                                         for t in tasks})


def refresh_table(wh: Warehouse) -> tuple[str, pa.Table] | None:
    """The last refresh beside the report before it, one row per model and dataset (None before any refresh)."""
    if not wh.partition_files("report_refresh"):
        return None
    table = query(wh, "SELECT model, dataset, round(em_before, 1) AS before, round(em_after, 1) AS after, "
                      "round(em_after - em_before, 1) AS change, newly_right, newly_wrong, report_before "
                      "FROM report_refresh ORDER BY model, dataset = 'probe', dataset = 'average', dataset")
    before = table.column("report_before")[0].as_py() if table.num_rows else None
    return before, table.drop_columns(["report_before"])


def surgery_table(wh: Warehouse) -> pa.Table | None:
    """The newest surgery sweep (the paper's Table 8): per strength (or the paper's λ), the mean λ applied, success
    and change rate in %; None before any."""
    runs = [r for r in list_runs(wh, stage="surgery") if r.status == "success"]
    if not runs or not wh.partition_files("edits"):
        return None
    # `questions`: edits asked for; `edited`: those with a slot firing above its usual to edit (the others fail).
    return query(wh, "SELECT strength, round(avg(\"lambda\"), 3) AS mean_lambda, round(100 * avg(success::INT), 1) "
                     "AS success, round(100 * avg(change_rate), 1) AS change_rate, count(*) AS questions, "
                     "count(slot) AS edited FROM edits "
                     f"WHERE run_id = '{runs[0].run_id}' "
                     "GROUP BY strength, CASE WHEN strength IS NULL THEN \"lambda\" END ORDER BY strength, mean_lambda")


def edits_summary(wh: Warehouse) -> dict | None:
    """The newest batch edit (`nkb edit --edits`): its model and success, generalization and locality in %."""
    for run in list_runs(wh, stage="edit"):
        metrics = {m["metric"]: m["value"] for m in run_metrics(wh, run.run_id)} if run.status == "success" else {}
        if "edit_locality" in metrics:
            return {"model": run.config.get("name") or run.run_id, "edits": int(metrics.get("edit_count", 0)),
                    **{k: metrics.get(f"edit_{k}") for k in ("success", "generalization", "locality")}}
    return None
