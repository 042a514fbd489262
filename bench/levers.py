"""One lever, one training: a route of an experiment trained again under another name with some settings changed,
beside the rows the experiment already built, and measured as the report measures a row: how the lever trials
of `docs/journal.md` (qa_share, qa_order, augmented, sparse_slots, seeds) are measured.

    python -m bench.levers --home .nkb --name qa-first --set stages.inject.qa_share=0.2 \
        --set stages.inject.qa_order=before [--row base+lora-8] [--experiment experiments/sample-world-smollm2.yaml]

The route's inject and evaluate settings come from the experiment's own plan (its data, blocks, steps, asking),
`--set` changes them as `nkb pipeline --set` would; the model is written to the experiment's warehouse under
`--name`, so the experiment's own rows stay as they are. Prints JSON (EM with its 95 % interval, asked as the
experiment asks the row first, and `em_0shot` beside it where the experiment also asks with no examples (a route
other than the NKB is asked as the NKB's row is, and never routed: routing is a row of the NKB's); the probe in
unseen and seen wordings, the held-out loss against the base's, the base's known capitals kept, both routed too where
the experiment routes the NKB's row, training seconds) and records it as `metrics` rows in `bench/results/levers`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from stages.configs import FIELD_ROUTES
from stages.experiment import SAMPLE_WORLD_SMOLLM2


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", required=True, help="the warehouse the experiment built (its base, data, spans)")
    parser.add_argument("--experiment", default=str(SAMPLE_WORLD_SMOLLM2), help="the experiment file it ran")
    parser.add_argument("--row", default="base+nkb",
                        help=f"the route trained: base+nkb, {', '.join(FIELD_ROUTES)}")
    parser.add_argument("--name", required=True, help="the trained model's name in the warehouse")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an experiment setting, e.g. stages.inject.qa_share=0.2 (repeatable)")
    parser.add_argument("--measure-only", action="store_true",
                        help="measure the model already named --name (trained by an earlier run) without training")
    parser.add_argument("--results", default="bench/results/levers", help="benchmark warehouse for the figures")
    args = parser.parse_args(argv)

    import pyarrow.compute as pc

    from nkb_model.metrics import bootstrap_interval
    from nkb_model.train import choose_device
    from stages import evaluation, training
    from stages.configs import MAIN_ROW
    from warehouse import Warehouse, WarehouseError, run_stage

    try:
        wh = Warehouse(args.home, create=False)  # a mistyped --home: no warehouse there, not a new empty one
        experiment, inject, asked = route(wh, args.experiment, args.row, args.set)
    except (ValueError, WarehouseError) as exc:
        parser.error(str(exc))

    started, seconds = time.perf_counter(), None
    if not args.measure_only:
        trained = training.inject(wh, inject.model_copy(update={"name": args.name}))
        seconds = None if trained.skipped else round(time.perf_counter() - started, 1)
    from bench.recorded import commit
    result = {"row": args.row, "name": args.name, "sets": args.set, "commit": commit()}
    for i, way in enumerate(asked):  # each way the experiment asks the row: K-shot, then 0-shot where it asks so
        answered = evaluation.evaluate(wh, way.model_copy(update={"model": args.name}))
        hits = wh.read("predictions", ["exact_match"], pc.field("run_id") == answered.run.run_id,
                       [f"{answered.run.config['model_name']}.{way.split}"]).column("exact_match").to_pylist()
        key = "em" if i == 0 else f"em_{way.shots}shot"
        result |= {"questions": len(hits), key: 100.0 * sum(hits) / len(hits),
                   f"{key}_interval": bootstrap_interval([[bool(h) for h in hits]])}
    result["train_seconds"] = seconds

    device = choose_device(inject.device, inject.precision)

    def body(run):
        result.update(measured(run, wh, args.name, experiment.probes, asked[0].split, device,
                               routed=experiment.routed and args.row == MAIN_ROW.key))
        for key, value in result.items():
            if isinstance(value, (int, float)):
                run.metric(f"bench.levers.{key}", value)
    run_stage(Warehouse(args.results), "bench-levers", vars(args), "bench", body, force=True)
    print(json.dumps(result, indent=1))
    return 0


def route(wh, experiment_file: str, row: str, sets: list[str]):
    """(the experiment, the inject config that trains `row`, the evaluate configs that ask it, one per way) from the
    experiment's own plan with `sets` applied; ValueError naming what is wrong."""
    from stages.configs import MAIN_ROW, asks_zero_shot
    from stages.experiment import Experiment
    from stages.inputs import world_dir
    only = [f"rows=base,{row}"]
    if row != MAIN_ROW.key:  # another route in the NKB row's place: asked as it is, not routed (a row of the NKB's)
        zero_shot = Experiment.load(experiment_file, sets).zero_shot
        if zero_shot is not True:
            bare = [r for r in ("base", row) if asks_zero_shot(zero_shot, r)
                    or (r == row and asks_zero_shot(zero_shot, MAIN_ROW.key))]
            only.append(f"zero_shot=[{','.join(bare)}]")
        only.append("routed=false")
    experiment = Experiment.load(experiment_file, [*only, *sets]).with_world(world_dir(wh))
    plan = experiment.plan()
    inject = next((c for stage, c in plan if stage == "inject" and c.model_name() == row), None)
    asked = [c for stage, c in plan if stage == "evaluate" and c.model == row]
    if inject is None or not asked:
        raise ValueError(f"--row {row}: the experiment trains and asks no such row")
    return experiment, inject, asked


def measured(run, wh, name: str, probes_path: str | None, split: str, device, routed: bool = False) -> dict:
    """What the report measures of a row's model (`stages.report.model_checks`: the probe of the split's facts, the
    held-out loss, the base's known facts kept; its fills go to the benchmark warehouse's `predictions`), beside the
    base's held-out loss; `routed`: the held-out loss and the facts kept routed too, as the report's routed row."""
    import contextlib

    import numpy as np

    from corpus.files import iter_jsonl
    from corpus.routing import routed as combined
    from nkb_model.checkpoint import load_model, read_info
    from nkb_model.checks import heldout_loss
    from stages.models import base_dir_of, find_model
    from stages.report import facts_known_by, model_checks
    from stages.report_routing import open_router

    base, tokenizer, _ = load_model(find_model(wh, "base"))
    base.to(device.device).eval()
    facts = facts_known_by(base, tokenizer, device)
    directory = find_model(wh, name)
    # The asked split's facts only, as the report probes them: the train split's facts are those of the questions
    # qa_share trains on.
    probes = [p for _, p in iter_jsonl(probes_path)] if probes_path else []
    with open_router(wh) if routed else contextlib.nullcontext() as router:
        checks = model_checks(run, directory, True, [p for p in probes if p.get("split", split) == split], split,
                              device, facts, route=router)
        facts_to_slots = router.prompts(facts) if router else None
    result = {"probe_unseen": checks["probe_em"], "probe_seen": checks["probe_seen_em"],
              "heldout_loss": checks["heldout_loss"], "heldout_loss_unmounted": checks["heldout_loss_nkb_unmounted"],
              "heldout_loss_base": heldout_loss(base, tokenizer, np.load(base_dir_of(directory) / "held_out.npy"),
                                                device),
              "capitals_known": len(facts), "params_trained": read_info(directory).get("params_injected") or 0,
              "capitals_kept": round((checks["retained_em"] or 0.0) * len(facts) / 100)}
    if router:  # a fact routed away is asked of the base, which knows every one of them
        result |= {"heldout_loss_routed": checks["heldout_loss_routed"],
                   "capitals_kept_routed": sum(combined(facts_to_slots, checks["fact_hits"], [True] * len(facts)))}
    return result


if __name__ == "__main__":
    sys.exit(main())
