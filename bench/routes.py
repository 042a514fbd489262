"""The routes beside the NKB on the demo, recorded per CPU kind: each route a `bench.levers` training of the demo's
experiment (the same knowledge, blocks, batches, steps and asking), its figures kept as its CPU kind's record and
docs/routes.md written from the records.

    python -m bench.levers --home H --row base+dora --name base+dora > dora.json    # train and measure a route
    python -m bench.routes --home H dora.json lora.json                              # record them, write the page

A row recorded again replaces its earlier figures; every row keeps the commit and date it was measured at.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.recorded import ROOT, Records, commit, kind_title, today, write_pages

RECORDS = Records("routes-demo")
PAGE = ROOT / "docs" / "routes.md"
WHAT = "the routes beside the NKB on the demo"


def row_of(measured: dict, params: int | None, measured_at: str | None = None, note: str = "") -> dict:
    """What the page shows of one `bench.levers` result."""
    base = measured["heldout_loss_base"]
    return {"em": measured["em"], "em_interval": measured["em_interval"], "em_0shot": measured.get("em_0shot"),
            "em_0shot_interval": measured.get("em_0shot_interval"), "questions": measured["questions"],
            "probe_unseen": measured["probe_unseen"], "probe_seen": measured["probe_seen"],
            "heldout_loss_change": round(100 * (measured["heldout_loss"] - base) / base, 2),
            "capitals_kept": measured["capitals_kept"], "capitals_known": measured["capitals_known"],
            "train_seconds": measured["train_seconds"], "params_trained": params,
            "commit": measured_at or measured.get("commit") or commit(), "note": note,
            "date": today()}


def em_cell(row: dict, key: str) -> str:
    """An EM figure of a recorded row with its interval, or that the row was not asked so."""
    if row.get(key) is None:
        return "not asked"
    low, high = row[f"{key}_interval"]
    return f"{row[key]:.1f} ({low:.1f}-{high:.1f})"


def headline(record: dict) -> str:
    return ", ".join(f"{name} {row['em']:.1f}" for name, row in sorted(record["rows"].items())) + " (5-shot EM)"


def page(recorded: list[dict]) -> str:
    lines = ["# The routes beside the NKB on the demo", "",
             "<!-- Written by `python -m bench.pages` from bench/records/routes-demo/; do not edit. -->", "",
             "Each route trained as `nkb demo` trains base+NKB (`experiments/sample-world-smollm2.yaml`: the same "
             "knowledge, blocks, batches, steps, QA steps and own-text term; each route's learning rate from the "
             "file's `stages:`) by `python -m bench.levers --row ROW`, and recorded by `python -m bench.routes`. EM in "
             "% on the 67 validation questions, 5-shot and with no examples, with 95 % bootstrap intervals; the probe "
             "in unseen / seen wordings; the held-out loss's change against the base's on the world's general text; "
             "the base's real-world capitals still answered. base+NKB's own figures: "
             "[demo-smollm2.md](demo-smollm2.md).", ""]
    for record in recorded:
        lines += [f"## {kind_title(record['machine'])}", "",
                  "| row | parameters trained | 5-shot EM | 0-shot EM | probe unseen / seen | held-out loss change "
                  "| capitals kept | training (s) | commit, date |", "|---|---|---|---|---|---|---|---|---|"]
        notes = [f"{name}: {r['note']}" for name, r in sorted(record["rows"].items()) if r.get("note")]
        for name, r in sorted(record["rows"].items()):
            params = f"{r['params_trained']:,}" if r.get("params_trained") else ""
            seconds = f"{r['train_seconds']:.0f}" if r.get("train_seconds") else ""
            lines.append(f"| {name} | {params} | {em_cell(r, 'em')} | {em_cell(r, 'em_0shot')} | {r['probe_unseen']:.1f} / "
                         f"{r['probe_seen']:.1f} | {r['heldout_loss_change']:+.2f} % | {r['capitals_kept']} of "
                         f"{r['capitals_known']} | {seconds} | {r['commit']}, {r['date']} |")
        lines += [""] + [f"- {note}" for note in notes] + ([""] if notes else [])
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.routes", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="`bench.levers` JSON outputs, one per route")
    parser.add_argument("--home", required=True, help="the warehouse the routes were trained in (their parameters)")
    parser.add_argument("--note", default="", help="what the page should say beside these rows (e.g. that their "
                                                   "training ran beside another job)")
    parser.add_argument("--commit", help="the commit the results were measured at (default: the one their JSON "
                                         "names, else this checkout's)")
    args = parser.parse_args(argv)
    from stages.machine import cpu_kind
    from stages.models import find_model
    from warehouse import Warehouse
    wh = Warehouse(args.home, create=False)
    kind = cpu_kind()
    record = RECORDS.of(kind) or {"machine": kind, "rows": {}}
    for path in args.results:
        measured = json.loads(Path(path).read_text())
        info = json.loads((find_model(wh, measured["name"]) / "nkb-model.json").read_text())
        record["rows"][measured["row"]] = row_of(measured, info.get("params_injected"), args.commit, args.note)
    print(f"recorded {RECORDS.write(kind, record)}; {write_pages()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
