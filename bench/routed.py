"""Routing by retrieval (`corpus.routing`): each model of a warehouse asked only where a text matches the knowledge,
the base elsewhere, beside the same model asked everywhere: EM, the probe, the base's capitals kept, the held-out loss.

    python -m bench.routed --home .nkb base+nkb own01 [--fraction 1.0] [--probes PATH]

A text goes to the slots when its best BM25 match in the experiment's knowledge index (the one its retrieve stage
searched) scores at least `--fraction` of the lowest train question's best score, as in the report's `routed` rows
(`stages.report_routing`), which route the demo's own model; this measures any injected model a warehouse holds. Unmounted slots leave exactly the
base (the report checks it on every injected model), so a routed model's answer to a text routed away is the
base's answer: each routed figure combines the model's and the base's answers text by text, from the warehouse's
`predictions` for the validation questions and from asking both models for the probes, the capitals and the
held-out rows. Prints JSON (each model's figures both ways, and the share of each kind of text routed to the
slots) and records it as `metrics` rows in `bench/results/routed`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    from corpus.routing import ROUTE_FRACTION
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", required=True, help="the warehouse the experiment built (its index, questions)")
    parser.add_argument("models", nargs="+", help="injected models in the warehouse, each evaluated already")
    parser.add_argument("--fraction", type=float, default=ROUTE_FRACTION,
                        help="the threshold's share of the lowest train question's best BM25 score")
    parser.add_argument("--probes", help="the experiment's probe file; default the sample world's in the warehouse")
    parser.add_argument("--split", default="validation", help="the split whose questions and probes are scored")
    parser.add_argument("--precision", default="bf16", choices=["auto", "bf16", "fp32"],
                        help="as the stages' precision setting")
    parser.add_argument("--results", default="bench/results/routed", help="benchmark warehouse for the figures")
    args = parser.parse_args(argv)

    import numpy as np

    from corpus.routing import routed
    from nkb_model.checkpoint import load_model
    from nkb_model.checks import heldout_loss, probe
    from nkb_model.metrics import bootstrap_interval
    from nkb_model.train import choose_device
    from stages.models import base_dir_of, find_model
    from stages.report import PROBE_WORDINGS, ask_facts, facts_known_by, probes_worded
    from stages.report_routing import mixed_loss, open_router, rows_loss
    from warehouse import Warehouse, WarehouseError, query, run_stage

    try:
        wh = Warehouse(args.home, create=False)
        folders = {name: find_model(wh, name) for name in args.models}
    except (ValueError, WarehouseError) as exc:
        parser.error(str(exc))
    probes_path = Path(args.probes or wh.files_dir / "sample-world" / "probes.jsonl")
    if args.probes and not probes_path.exists():
        parser.error(f"{probes_path}: no such probe file")
    probes = ([json.loads(line) for line in probes_path.read_text().splitlines() if line.strip()]
              if probes_path.exists() else [])  # real passages come without probes
    probes = [p for p in probes if p.get("split", args.split) == args.split]
    asked = query(wh, f"SELECT question_id, question FROM questions WHERE split = '{args.split}'").to_pylist()

    device = choose_device("auto", args.precision)
    base_dir = base_dir_of(next(iter(folders.values())))
    base, tokenizer, _ = load_model(base_dir)
    base.to(device.device)
    facts = facts_known_by(base, tokenizer, device)
    held = np.load(base_dir / "held_out.npy")
    try:
        with open_router(wh, args.fraction) as router:  # the report's routing (`routed`), at --fraction
            threshold = router.threshold
            routes = {"questions": router([q["question"] for q in asked]), "probes": router.prompts(probes),
                      "facts": router.prompts(facts),
                      "held_out": router(tokenizer.batch_decode(held, skip_special_tokens=True))}
    except ValueError as exc:
        parser.error(f"{args.home}: {exc}")
    to_slots = dict(zip((q["question_id"] for q in asked), routes["questions"]))

    def asked_both(model) -> dict:
        fills = {w: probe(model, tokenizer, [p["prompt"] for p in probes_worded(probes, w)],
                          [p["answer"] for p in probes_worded(probes, w)], device)[1] if probes else []
                 for w in PROBE_WORDINGS}
        return {"facts": ask_facts(model, tokenizer, facts, device)[1], "probes": fills}

    def rate(hits) -> float:
        return round(100.0 * sum(hits) / len(hits), 1) if len(hits) else None

    base_asked = asked_both(base)
    base_loss = heldout_loss(base, tokenizer, held, device)
    base_off = rows_loss(base, tokenizer, held, ~routes["held_out"], base_loss, device)
    wording = np.array([p.get("wording", "unseen") for p in probes])  # as `probes_worded` reads it
    result = {"threshold": round(threshold, 3), "fraction": args.fraction,
              "to_slots": {k: f"{int(v.sum())} of {len(v)}" for k, v in routes.items()},
              "base": {"heldout_loss": round(base_loss, 4), "facts_known": len(facts)}, "models": {}}
    for name, folder in folders.items():
        model, _, _ = load_model(folder)
        model.to(device.device)
        mine = asked_both(model)
        row = {}
        for suffix, way in (("", "0-shot"), (".5shot", "5-shot")):
            answers = {"slots": {}, "base": {}}
            for who, model_name in (("slots", name), ("base", "base")):
                part = f"{model_name}{suffix}.{args.split}"
                if part in {Path(p).stem for p in wh.partition_files("predictions")}:
                    got = wh.read("predictions", ["question_id", "exact_match"], partitions=[part]).to_pydict()
                    answers[who] = dict(zip(got["question_id"], got["exact_match"]))
            if not answers["slots"] or not answers["base"]:
                continue
            ids = list(to_slots)
            for label, hits in (("everywhere", [answers["slots"][q] for q in ids]),
                                ("routed", routed([to_slots[q] for q in ids], [answers["slots"][q] for q in ids],
                                                  [answers["base"][q] for q in ids]))):
                low, high = bootstrap_interval([hits])
                row.setdefault(label, {})[f"em_{way}"] = f"{rate(hits)} ({low:.1f}-{high:.1f})"
        loss = heldout_loss(model, tokenizer, held, device)
        losses = {"everywhere": loss, "routed": mixed_loss(routes["held_out"], rows_loss(
            model, tokenizer, held, routes["held_out"], loss, device), base_off)}
        for label in ("everywhere", "routed"):
            facts_hits = (mine["facts"] if label == "everywhere"
                          else routed(routes["facts"], mine["facts"], base_asked["facts"]))
            probe_ems = {}
            for w in PROBE_WORDINGS:
                mask = routes["probes"][wording == w]
                probe_ems[w] = rate(mine["probes"][w] if label == "everywhere"
                                    else routed(mask, mine["probes"][w], base_asked["probes"][w]))
            row.setdefault(label, {}).update({
                "probe_unseen": probe_ems["unseen"], "probe_seen": probe_ems["seen"],
                "facts_kept": f"{sum(facts_hits)} of {len(facts)}",
                "heldout_change_pct": round(100 * (losses[label] / base_loss - 1), 2)})
        result["models"][name] = row

    def body(run):
        run.metric("bench.routed.threshold", threshold)
        for name, row in result["models"].items():
            for label, figures in row.items():
                for key, value in figures.items():
                    if value is not None:  # "30.0 (21.0-39.0)" and "47 of 47" are recorded as their first number
                        run.metric(f"bench.routed.{name}.{label}.{key}", float(str(value).split()[0]))
    run_stage(Warehouse(args.results), "bench-routed", vars(args), "bench", body, force=True)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
