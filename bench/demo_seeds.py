"""The demo's figures over injection seeds, recorded per CPU kind; the README's headline table is written from them.

    python -m bench.demo_seeds [--seeds 0,1,2] [--home bench/results/demo] [--record]

Runs `nkb demo` (`experiments/sample-world-smollm2.yaml`: SmolLM2-135M-Instruct, the sample world) once per
injection seed in one warehouse (the data stages, the base and RAG made once), and reads each seed's report: every
row's EM and interval, probe, held-out loss, facts kept, and the demo's time. `--record` keeps the run as its CPU
kind's record in `bench/records/demo-smollm2/` (the kind as `stages.machine.cpu_kind` names it); the README's
headline table and docs/demo-smollm2.md are written from every kind's record (`python -m bench.pages`), which a test
holds to the records. `nkb demo` ends by
showing the record of the CPU kind it ran on, so a user sees whether their run falls in its range.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.recorded import Records, commit, kind_title, today, write_pages
from stages.machine import cpu_kind

ROOT = Path(__file__).resolve().parent.parent
RECORDS = Records("demo-smollm2")
PAGE = ROOT / "docs" / "demo-smollm2.md"
README_MARKS = ("<!-- demo-seeds: written by `python -m bench.pages` from bench/records/demo-smollm2 -->",
                "<!-- end of demo-seeds -->")
FIGURES = ("em", "em_low", "em_high", "probe_em", "probe_seen_em", "heldout_loss", "heldout_loss_change",
           "facts_retained")


def run_seed(home: Path, seed: int) -> float:
    """`nkb demo` with injection seed `seed` in the warehouse `home`; returns its seconds."""
    started = time.perf_counter()
    command = [sys.executable, "-m", "flows.cli", "--home", str(home), "demo", "--set", f"stages.inject.seed={seed}"]
    done = subprocess.run(command, cwd=ROOT, env=os.environ | {"NKB_PROGRESS": "0"}, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"seed {seed}: the demo failed ({' '.join(command)}):\n{done.stderr[-3000:]}")
    return round(time.perf_counter() - started, 1)


def figures_of(home: Path) -> dict[str, dict]:
    """Each report row's figures (its average over datasets), by the row's label."""
    from stages.report import by_model, report_rows
    from warehouse import Warehouse
    return {model: {k: row[k] if not isinstance(row[k], float) else round(row[k], 4) for k in FIGURES}
            for model, row in by_model(report_rows(Warehouse(home, create=False))).items()}


WHAT = "`make demo` over injection seeds"


def headline(record: dict) -> str:
    return (f"base+NKB 5-shot {cell(record, 'base+NKB (5-shot)', 'em')}, 0-shot {cell(record, 'base+NKB (0-shot)', 'em')}"
            f", base {cell(record, 'base (5-shot)', 'em')} (EM, seed 0 [range over seeds]; {record['commit']})")


def records() -> list[dict]:
    return RECORDS.all()


def by_seed(record: dict) -> dict[str, dict]:
    """The record's seeds in order, the lowest (the demo's own, 0) first."""
    return dict(sorted(record["seeds"].items(), key=lambda item: int(item[0])))


def spread(record: dict, model: str, key: str = "em") -> tuple[float, float] | None:
    """The lowest and highest of a row's figure over the record's seeds."""
    values = [s["rows"][model][key] for s in record["seeds"].values() if s["rows"].get(model, {}).get(key) is not None]
    return (min(values), max(values)) if values else None


def cell(record: dict, model: str, key: str, digits: int = 1) -> str:
    first = next(iter(by_seed(record).values()))["rows"].get(model, {})
    value, span = first.get(key), spread(record, model, key)
    if value is None:
        return "–"
    shown = f"{value:.{digits}f}"
    return shown if span is None or span[0] == span[1] else f"{shown} [{span[0]:.{digits}f} to {span[1]:.{digits}f}]"


def readme_block(recorded: list[dict]) -> str:
    """The README's headline: per CPU kind, the first seed's row figures with the range over the kind's seeds."""
    lines = [README_MARKS[0]]
    for record in recorded:
        machine, seeds = record["machine"], by_seed(record)
        longest = max(s["seconds"] for s in seeds.values()) / 60
        first = next(iter(seeds))
        lines += ["", f"**{machine['name']}** (family {machine['family']}, model {machine['model']}, "
                      f"{', '.join(machine['bf16_units']) or 'no bf16 units'}), commit {record['commit']}, "
                      f"{record['date']}: injection seed {first}, [the range over seeds {', '.join(seeds)}]; a seed, "
                      f"from its injection to its report, took up to {longest:.0f} min.", "",
                  "| row | EM (95 % interval) | probe, unseen / seen | held-out loss change | capitals kept (%) |",
                  "|---|---|---|---|---|"]
        for model, row in seeds[first]["rows"].items():
            interval = f" ({row['em_low']:.1f}-{row['em_high']:.1f})" if row.get("em_low") is not None else ""
            lines.append(f"| {model} | {cell(record, model, 'em')}{interval} | {cell(record, model, 'probe_em')} / "
                         f"{cell(record, model, 'probe_seen_em')} | {cell(record, model, 'heldout_loss_change')} % "
                         f"| {cell(record, model, 'facts_retained', 0)} |")
    lines.append(README_MARKS[1])
    return "\n".join(lines)


def page(recorded: list[dict]) -> str:
    """docs/demo-smollm2.md: every seed's rows, per CPU kind."""
    lines = ["# The demo, SmolLM2-135M-Instruct on the sample world, over injection seeds", "",
             "<!-- Written by `python -m bench.pages` from bench/records/demo-smollm2/; do not edit. -->", "",
             "`make demo` runs `experiments/sample-world-smollm2.yaml` with injection seed 0. Remade by "
             "`python -m bench.demo_seeds --seeds 0,1,2 --record`: the demo once per seed in one warehouse, its "
             "report read after each. EM in % on the 67 validation questions with its 95 % bootstrap interval; the "
             "probe in % of the validation facts' cloze prompts in unseen / seen wordings; the held-out loss's change "
             "against the base's on the world's general text; the base's real-world capitals still answered, in %.",
             ""]
    for record in recorded:
        lines += [f"## {kind_title(record['machine'])}", "",
                  f"Commit {record['commit']}, {record['date']}.", "",
                  "| seed | row | EM (95 % interval) | probe unseen / seen | held-out loss change | capitals kept (%) |",
                  "|---|---|---|---|---|---|"]
        for seed, run in by_seed(record).items():
            for model, row in run["rows"].items():
                interval = f" ({row['em_low']:.1f}-{row['em_high']:.1f})" if row.get("em_low") is not None else ""
                change = "" if row.get("heldout_loss_change") is None else f"{row['heldout_loss_change']:.1f} %"
                lines.append(f"| {seed} | {model} | {row['em']:.1f}{interval} | {row['probe_em']:.1f} / "
                             f"{row['probe_seen_em']:.1f} | {change} | {row['facts_retained']:.0f} |")
            lines.append(f"| {seed} | (this seed's command took {run['seconds'] / 60:.1f} min) | | | | |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.demo_seeds", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="injection seeds, comma-separated (default 0,1,2)")
    parser.add_argument("--home", default=str(ROOT / "bench" / "results" / "demo"), help="the warehouse")
    parser.add_argument("--record", action="store_true", help="keep this run as its CPU kind's record")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if seeds:
        run = {"machine": cpu_kind(), "commit": commit(), "date": today(), "seeds": {}}
        for seed in seeds:
            seconds = run_seed(Path(args.home), seed)
            run["seeds"][str(seed)] = {"seconds": seconds, "rows": figures_of(Path(args.home))}
            main_row = run["seeds"][str(seed)]["rows"].get("base+NKB (5-shot)", {})
            print(f"seed {seed}: {seconds:.0f} s, base+NKB 5-shot {main_row.get('em')}", flush=True)
        print(json.dumps(run, indent=1))
        if args.record:
            print(f"recorded {RECORDS.write(run['machine'], run)}; {write_pages()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
