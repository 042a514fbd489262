"""Routing by retrieval (`corpus.routing`): each model of a warehouse asked only where a text matches the knowledge,
the base elsewhere, beside the same model asked everywhere: EM, the probe, the base's capitals kept, the held-out loss.

    python -m bench.routed --home .nkb base+nkb own01 [--fraction 1.0] [--probes PATH]

A text goes to the slots when its best BM25 match in the experiment's knowledge index (the one its retrieve stage
searched) scores at least `--fraction` of the lowest train question's best score, as in the report's `routed` rows
(`stages.report_routing`), which route the demo's own model; this measures any injected model a warehouse holds.
Unmounted slots leave exactly the base (the report checks it on every injected model), so a routed model's answer
to a text routed away is the base's answer: each routed figure combines the model's and the base's answers text by
text, from the warehouse's `predictions` for the validation questions and from asking both models for the probes,
the capitals and the held-out rows. Prints JSON (each model's figures both ways, and the share of each kind of text
routed to the slots) and records it as `metrics` rows in `bench/results/routed`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    from bench import model_bench_parser, warehouse_models
    from corpus.routing import ROUTE_FRACTION
    parser = model_bench_parser(__doc__, "bench/results/routed")
    parser.add_argument("--fraction", type=float, default=ROUTE_FRACTION,
                        help="the threshold's share of the lowest train question's best BM25 score")
    parser.add_argument("--probes", help="the experiment's probe file; default the sample world's in the warehouse")
    parser.add_argument("--split", default="validation", help="the split whose questions and probes are scored")
    args = parser.parse_args(argv)

    import numpy as np

    from corpus.routing import routed
    from nkb_model.checkpoint import load_model
    from nkb_model.checks import heldout_row_losses, probe
    from nkb_model.metrics import bootstrap_interval
    from nkb_model.train import choose_device
    from stages.models import base_dir_of
    from stages.report import PROBE_WORDINGS, ask_facts, facts_known_by, probes_worded
    from stages.report_routing import open_router, route_texts, routed_answers, routed_loss
    from warehouse import Warehouse, run_stage

    wh, folders = warehouse_models(parser, args.home, args.models)
    probes_path = Path(args.probes or wh.files_dir / "sample-world" / "probes.jsonl")
    if args.probes and not probes_path.exists():
        parser.error(f"{probes_path}: no such probe file")
    probes = ([json.loads(line) for line in probes_path.read_text().splitlines() if line.strip()]
              if probes_path.exists() else [])  # real passages come without probes
    worded = {w: probes_worded([p for p in probes if p.get("split", args.split) == args.split], w)
              for w in PROBE_WORDINGS}

    device = choose_device("auto", args.precision)
    base_dir = base_dir_of(next(iter(folders.values())))
    base, tokenizer, _ = load_model(base_dir)
    base.to(device.device)
    facts = facts_known_by(base, tokenizer, device)
    held = np.load(base_dir / "held_out.npy")
    try:
        with open_router(wh, args.fraction) as router:  # the report's routing (`routed`), at --fraction
            threshold = router.threshold
            routes = route_texts(wh, router, args.split, worded, facts)
            held_routes = router(tokenizer.batch_decode(held, skip_special_tokens=True))
    except ValueError as exc:
        parser.error(f"{args.home}: {exc}")

    def asked_both(model) -> dict:
        fills = {w: probe(model, tokenizer, [p["prompt"] for p in items], [p["answer"] for p in items], device)[1]
                 if items else [] for w, items in worded.items()}
        return {"facts": ask_facts(model, tokenizer, facts, device)[1], "probes": fills}

    def rate(hits) -> float:
        return round(100.0 * sum(hits) / len(hits), 1) if len(hits) else None

    evaluated = {Path(p).stem for p in wh.partition_files("predictions")}  # the partitions `evaluate` wrote

    base_asked = asked_both(base)
    base_rows = heldout_row_losses(base, tokenizer, held, device)
    base_loss = base_rows.mean()
    counted = routes.by_kind() | {"held_out": held_routes}
    result = {"threshold": round(threshold, 3), "fraction": args.fraction,
              "to_slots": {k: f"{int(v.sum())} of {len(v)}" for k, v in counted.items()},
              "base": {"heldout_loss": round(base_loss, 4), "facts_known": len(facts)}, "models": {}}
    for name, folder in folders.items():
        model, _, _ = load_model(folder)
        model.to(device.device)
        mine = asked_both(model)
        row = {"everywhere": {}, "routed": {}}
        for suffix, way in (("", "0-shot"), (".5shot", "5-shot")):
            slots, alone = f"{name}{suffix}", f"base{suffix}"
            if not {f"{slots}.{args.split}", f"{alone}.{args.split}"} <= evaluated:
                continue
            _, answered = routed_answers(wh, routes, slots, alone, args.split)
            everywhere = wh.read("predictions", ["exact_match"], partitions=[f"{slots}.{args.split}"]).column(
                "exact_match").to_pylist()
            for label, hits in (("everywhere", everywhere), ("routed", answered["exact_match"])):
                low, high = bootstrap_interval([hits])
                row[label][f"em_{way}"] = f"{rate(hits)} ({low:.1f}-{high:.1f})"
        rows = heldout_row_losses(model, tokenizer, held, device)
        losses = {"everywhere": rows.mean(), "routed": routed_loss(held_routes, rows, base_rows)}
        for label in ("everywhere", "routed"):
            def kept(hits, to_slots, theirs):
                return hits if label == "everywhere" else routed(to_slots, hits, theirs)
            facts_hits = kept(mine["facts"], routes.facts, base_asked["facts"])
            probe_ems = {w: rate(kept(mine["probes"][w], routes.probes[w], base_asked["probes"][w]))
                         for w in PROBE_WORDINGS}
            row[label].update({
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
