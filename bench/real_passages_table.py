"""The real-passage table from what its runs left: each row's trainings (its seeds) read from the experiment's
warehouse (their answers, as evaluate filed them) and from `bench.levers`' figures (held-out loss, capitals kept,
training seconds), against the base on the same questions; with `--record`, kept as a run of docs/real-passages.md's
record.

    python -m bench.real_passages_table --home real-nq/.nkb --label "600 questions, 598 passages (seed 0)" \
        --setting "600 of the file's questions ..." --row "base+NKB=nkb-seed0,nkb-seed1" \
        --row "base+LoRA=lora-seed0,lora-seed1" [--note TEXT] [--record]

The base row and retrieval's (the base with the top 3 passages in its prompt) come from the experiment's own
evaluations; a trained row's mean over its seeds and its lead over the base carry 95 % bootstrap intervals over the
questions (`bench.seeds.compared`).
"""

from __future__ import annotations

import argparse
import json
import sys

from bench.real_passages import RECORDS  # noqa: F401  (the record this table is kept in: docs/real-passages.md's)
from bench.recorded import record_if_asked, record_option, this_cpu

RAG_ROW = "RAG (top 3 passages in the prompt)"
LEVERS = "bench-levers"  # the run stage under which bench.levers records a training's figures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", required=True, help="the real-passage experiment's warehouse")
    parser.add_argument("--label", required=True, help="what was measured, as the page's heading names it")
    parser.add_argument("--setting", required=True, help="the draw and the training settings, in a sentence or two")
    parser.add_argument("--row", action="append", default=[], metavar="LABEL=MODEL[,MODEL...]",
                        help="a trained row: its label and its trainings' model names, one per seed (repeatable)")
    parser.add_argument("--shots", type=int, default=5, help="the few-shot way the rows were asked")
    parser.add_argument("--split", default="validation", help="the questions' split")
    parser.add_argument("--levers", default="bench/results/levers",
                        help="the benchmark warehouse bench.levers recorded the trainings' figures in")
    parser.add_argument("--note", action="append", default=[], help="a line under the table (repeatable)")
    record_option(parser)
    args = parser.parse_args(argv)

    from warehouse import Warehouse, WarehouseError
    try:
        rows = dict(_row_spec(spec) for spec in args.row)
        wh = Warehouse(args.home, create=False)
        result = table(wh, Warehouse(args.levers, create=False), rows, args.shots, args.split)
    except (ValueError, WarehouseError) as exc:
        parser.error(str(exc))
    result = {"label": args.label, "setting": args.setting, **result, "notes": args.note}
    print(json.dumps(result, indent=1))
    record_if_asked(args, __name__, result, argv)
    return 0


def _row_spec(spec: str) -> tuple[str, list[str]]:
    label, _, models = spec.partition("=")
    names = [m.strip() for m in models.split(",") if m.strip()]
    if not label.strip() or not names:
        raise ValueError(f"--row {spec!r}: give LABEL=MODEL[,MODEL...]")
    return label.strip(), names


def table(wh, levers, rows: dict[str, list[str]], shots: int, split: str) -> dict:
    """{heldout_loss_base, capitals_known, rows: {label: figures}}: the base, retrieval, then each trained row."""
    from bench.seeds import verdicts
    base = verdicts(wh, "base", shots, split)
    figures = {name: levers_figures(levers, name) for names in rows.values() for name in names}
    first = next(iter(figures.values()), {})
    known = int(first.get("capitals_known", 0))
    out = {"base": {**asked(base, {"base": base}, shots), **asked_zero_shot(wh, ["base"], split),
                    "capitals_kept": [known], "params_trained": 0},
           RAG_ROW: {**asked(base, {"base": verdicts(wh, "base", shots, split, 3)}, shots),
                     "capitals_kept": [known], "params_trained": 0, "lead": None}}
    out["base"].pop("lead")
    for label, names in rows.items():
        trainings = {name: verdicts(wh, name, shots, split) for name in names}
        row = {**asked(base, trainings, shots), **asked_zero_shot(wh, names, split),
               "heldout_change": [round(100 * (figures[n]["heldout_loss"] / figures[n]["heldout_loss_base"] - 1), 1)
                                  for n in names],
               "capitals_kept": [int(figures[n]["capitals_kept"]) for n in names],
               "params_trained": int(figures[names[0]]["params_trained"]),
               "train_seconds": [round(figures[n]["train_seconds"]) for n in names if "train_seconds" in figures[n]]}
        if all("capitals_kept_routed" in figures[n] for n in names):
            row["capitals_routed"] = [int(figures[n]["capitals_kept_routed"]) for n in names]
        out[label] = row
    return {"heldout_loss_base": round(first["heldout_loss_base"], 4) if first else None, "capitals_known": known,
            "rows": out}


def asked(reference: dict, trainings: dict, shots: int) -> dict:
    """One way of asking's figures: each training's EM, their mean with its interval, the mean lead over
    `reference` with its paired interval."""
    from bench.seeds import compared
    found = compared(trainings, reference)
    key = f"em_{shots}shot"
    return {key: [t["em"] for t in found["trainings"]], f"{key}_mean": [found["mean_em"], *found["mean_interval"]],
            "lead": [found["mean_lead"], *found["lead_interval"]]}


def asked_zero_shot(wh, names: list[str], split: str) -> dict:
    """The 0-shot figures where every training was also asked with no examples, else nothing (the lead is the
    few-shot way's)."""
    from bench.seeds import verdicts
    try:
        trainings = {name: verdicts(wh, name, 0, split) for name in names}
    except ValueError:
        return {}
    figures = asked(next(iter(trainings.values())), trainings, 0)
    figures.pop("lead")
    return figures


def levers_figures(levers, name: str) -> dict[str, float]:
    """The figures (metrics, by their short names) of the newest successful bench.levers run that measured the
    training `name`; ValueError where none did, or where it predates the parameters' count."""
    from warehouse import list_runs, run_metrics
    run = next((r for r in list_runs(levers, LEVERS) if r.status == "success" and r.config.get("name") == name), None)
    found = {m["metric"].removeprefix("bench.levers."): m["value"]
             for m in run_metrics(levers, run.run_id)} if run else {}
    if "params_trained" not in found:
        raise ValueError(f"{name}: no bench.levers figures of it in {levers.home}"
                         f"{' with its parameters trained' if run else ''}: python -m bench.levers --name {name} "
                         "--measure-only (with the experiment's --experiment) measures it")
    return found


def kind_of(result: dict) -> dict:
    return this_cpu(result)


def label(result: dict) -> str:
    return result["label"]


if __name__ == "__main__":
    sys.exit(main())
