"""The paper's own experiment rerun and held against its last record on this kind of CPU.

    python -m bench.paper_t5 [--seeds 5] [--home bench/results/paper-t5] [--record] [--page]

Runs `experiments/sample-world.yaml` (what `nkb demo --arch t5` runs: tiny T5 bases pretrained here, injected,
fine-tuned on closed-book QA in three formats) once per fine-tuning seed, 0 to SEEDS-1, in one warehouse: the
sample world, the base and the injections are made once, and each seed fine-tunes and evaluates every row again.
The fine-tuning's draw is the one that moves the figures most: a tiny base fine-tuned 30 epochs on 300 questions
lands on answers that differ by seed far more than by the base or the injection's numerics.

Prints each seed's figures and their mean, and compares base+NKB's average EM and its lead over the base with the
record this CPU kind has in `bench/records/paper-t5/` (the kind: vendor, family and model numbers, bf16 units).
The check fails (exit 1) where a mean moved beyond the seeds' spread: by more than twice the standard error of the
difference of the two means (Welch), and at least `MIN_SHIFT` points. `--record` makes this run the kind's record
(after a change meant to move the figures, with the reason in the commit); `--page` writes every page from the records
(`python -m bench.pages`: `docs/paper-t5.md`, the README's lines on this experiment, ...), which a test holds to them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from bench.recorded import Records, commit, today, write_pages
from stages.machine import cpu_kind

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENT = ROOT / "experiments" / "sample-world.yaml"
RECORDS = Records("paper-t5")
PAGE = ROOT / "docs" / "paper-t5.md"
ROWS = ("base", "base+NKB", "base+NKB-a")
MAIN = "base+NKB"
DATASETS = ("headqa", "nq", "webquestions")
# The two means the check holds against the record, and the least shift it calls a change: the figures are EM in
# points on 300 questions, where one question is a third of a point.
CHECKED = ("em_base+NKB", "lead")
MIN_SHIFT = 2.0


# ---- the machine -------------------------------------------------------------------------------------------

# ---- one seed ----------------------------------------------------------------------------------------------

def run_seed(home: Path, seed: int) -> float:
    """The experiment with fine-tuning seed `seed`, in the warehouse `home`; returns its seconds."""
    started = time.perf_counter()
    command = [sys.executable, "-m", "flows.cli", "--home", str(home), "pipeline", str(EXPERIMENT),
               "--set", f"stages.finetune.seed={seed}"]
    done = subprocess.run(command, cwd=ROOT, env=os.environ | {"NKB_PROGRESS": "0"}, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"seed {seed}: the experiment failed ({' '.join(command)}):\n{done.stderr[-3000:]}")
    return round(time.perf_counter() - started, 1)


def figures_of(home: Path) -> dict:
    """The figures the warehouse's tables hold now (the last pipeline run's, made then or skipped as unchanged): each
    row's EM per dataset and on average, base+NKB's interval, probe and held-out loss, the generation scores and
    surgery at strength 0.5."""
    from stages.report import generation_table, report_rows, report_table
    from warehouse import Warehouse, query
    wh = Warehouse(home, create=False)
    table = {(r["model"], r["dataset"]): r for r in report_table(report_rows(wh), digits=True).to_pylist()}
    out = {}
    for model in ROWS:
        out[f"em_{model}"] = table[model, "average"]["em"]
        for dataset in DATASETS:
            out[f"em_{model}_{dataset}"] = table[model, dataset]["em"]
    out["lead"] = round(out[f"em_{MAIN}"] - out["em_base"], 1)
    main = table[MAIN, "average"]
    out |= {"em_low": main["em_low"], "em_high": main["em_high"], "probe_unseen": main["probe_em"],
            "probe_seen": main["probe_seen_em"], "heldout_base": table["base", "average"]["heldout_loss"],
            "heldout_nkb": main["heldout_loss"]}
    generation = generation_table(wh)
    for g in generation.to_pylist() if generation is not None else []:
        for column, score in g.items():
            if column != "model":
                out[f"{column.split(' ')[0]}_{g['model']}"] = score
    # The surgery rows the tables hold now (this seed's, whether its run was made now or skipped as unchanged).
    at_half = query(wh, "SELECT round(100 * avg(success::INT), 1) AS success, round(100 * avg(change_rate), 1) AS "
                        "change FROM edits JOIN runs USING (run_id) WHERE stage = 'surgery' AND strength = 0.5"
                    ).to_pylist()
    if at_half and at_half[0]["success"] is not None:
        out |= {"surgery_success": at_half[0]["success"], "surgery_change": at_half[0]["change"]}
    return out


# ---- the check ---------------------------------------------------------------------------------------------

def summary(seeds: dict[str, dict]) -> dict:
    """Each figure's mean, standard deviation, lowest and highest over the seeds."""
    figures = {k for s in seeds.values() for k, v in s.items() if isinstance(v, (int, float))}
    out = {}
    for figure in sorted(figures):
        values = [s[figure] for s in seeds.values() if isinstance(s.get(figure), (int, float))]
        out[figure] = {"mean": round(statistics.fmean(values), 4),
                       "sd": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0,
                       "low": min(values), "high": max(values), "n": len(values)}
    return out


def compare(recorded: dict, now: dict) -> list[dict]:
    """For each checked figure: the two means, their difference, the standard error of the difference (Welch) and
    whether it moved beyond the seeds' spread (more than twice that and at least MIN_SHIFT)."""
    verdicts = []
    for figure in CHECKED:
        a, b = recorded[figure], now[figure]
        se = math.sqrt(a["sd"] ** 2 / a["n"] + b["sd"] ** 2 / b["n"])
        shift = round(b["mean"] - a["mean"], 2)
        verdicts.append({"figure": figure, "recorded": a["mean"], "now": b["mean"], "shift": shift,
                         "se": round(se, 2), "moved": abs(shift) > max(2 * se, MIN_SHIFT)})
    return verdicts


# ---- the page ----------------------------------------------------------------------------------------------

def page(records: list[dict]) -> str:
    """docs/paper-t5.md: each CPU kind's record, newest first."""
    lines = ["# The paper's experiment on a tiny T5, reproduced", "",
             "<!-- Written by `python -m bench.pages` from bench/records/paper-t5/; do not edit. -->", "",
             "`nkb demo --arch t5` runs `experiments/sample-world.yaml`: tiny T5 bases pretrained here, NKB slots "
             "injected with the base frozen, then every row fine-tuned on closed-book QA in three formats (the "
             "paper's Table 3). Remade by `python -m bench.paper_t5 --seeds 5`: the experiment once per "
             "fine-tuning seed in one warehouse (the base and the injections made once); `--record` keeps a run as "
             "its CPU kind's record, and the check fails when a later run's mean moves beyond the seeds' spread. "
             "EM in % on the 300 validation questions (100 per dataset); the interval is each seed's 95 % "
             "bootstrap interval of base+NKB's EM.", ""]
    for r in sorted(records, key=lambda r: r["date"], reverse=True):
        kind, s = r["machine"], r["summary"]
        lines += [f"## {kind['name']} (family {kind['family']}, model {kind['model']}"
                  f"{', ' + ' and '.join(kind['bf16_units']) if kind['bf16_units'] else ', no bf16 units'})", "",
                  f"Commit {r['commit']}, {r['date']}, {r['cpus']} cores, {r['precision']}; {len(r['seeds'])} "
                  f"fine-tuning seeds.", "",
                  "| fine-tuning seed | base | base+NKB (95 %) | headqa / nq / webq | base+NKB-a | probe unseen / "
                  "seen | BLEU base / base+NKB | surgery at 0.5 |", "|---|---|---|---|---|---|---|---|"]
        for seed, f in sorted(r["seeds"].items(), key=lambda item: int(item[0])):
            per = " / ".join(f"{f[f'em_{MAIN}_{d}']:.0f}" for d in DATASETS)
            lines.append(f"| {seed} | {f['em_base']:.1f} | {f[f'em_{MAIN}']:.1f} ({f['em_low']:.1f}-{f['em_high']:.1f}) | "
                         f"{per} | {f['em_base+NKB-a']:.1f} | {f['probe_unseen']:.1f} / {f['probe_seen']:.1f} | "
                         f"{_get(f, 'translation_base')} / {_get(f, 'translation_base+NKB')} | "
                         f"{_get(f, 'surgery_success')} % / {_get(f, 'surgery_change')} % |")

        def spread(figure: str) -> str:
            return (f"{s[figure]['mean']:.1f} (sd {s[figure]['sd']:.1f}; {s[figure]['low']:.1f}-"
                    f"{s[figure]['high']:.1f})")
        lines += [f"| **mean** | {spread('em_base')} | **{spread(f'em_{MAIN}')}** | | {spread('em_base+NKB-a')} | | | |",
                  "", f"base+NKB leads the base by {spread('lead')} points; held-out loss "
                      f"{s['heldout_base']['mean']:.4f} for the base, {s['heldout_nkb']['mean']:.4f} with the slots "
                      "mounted.", ""]
    return "\n".join(lines)


README_MARKS = ("<!-- paper-t5: written by `python -m bench.pages` from bench/records/paper-t5 -->",
                "<!-- /paper-t5 -->")


def readme_block(records: list[dict]) -> str:
    """The README's lines on this experiment: each CPU kind's means over its seeds, the demo's seed 0, the page."""
    text = []
    for r in sorted(records, key=lambda r: r["date"], reverse=True):
        s, first = r["summary"], r["seeds"]["0"]
        text.append(f"On a 2-core {r['machine']['name']} (family {r['machine']['family']}, model {r['machine']['model']}), "
                    f"commit {r['commit']}, {len(r['seeds'])} fine-tuning seeds: base+NKB "
                    f"**{s[f'em_{MAIN}']['mean']:.1f}** EM on average ({s[f'em_{MAIN}']['low']:.1f}-"
                    f"{s[f'em_{MAIN}']['high']:.1f}) against the base's {s['em_base']['mean']:.1f} and base+NKB-a's "
                    f"{s['em_base+NKB-a']['mean']:.1f}; the demo's seed 0: base {first['em_base']:.1f}, base+NKB "
                    f"{first[f'em_{MAIN}']:.1f} ({first['em_low']:.1f}-{first['em_high']:.1f}), probe "
                    f"{first['probe_unseen']:.1f} / {first['probe_seen']:.1f} in unseen / seen wordings.")
    text.append("Every seed, the generation check and surgery: [`docs/paper-t5.md`](docs/paper-t5.md); "
                "`python -m bench.paper_t5` reruns it and fails where a mean moved beyond the seeds' spread.")
    return "\n".join([README_MARKS[0], *textwrap.wrap(" ".join(text), 115), README_MARKS[1]])


def _get(figures: dict, key: str) -> str:
    value = figures.get(key)
    return "" if value is None else f"{value:.1f}"


WHAT = "`nkb demo --arch t5`, the paper's Table 3"


def headline(record: dict) -> str:
    s = record["summary"]
    return (f"base+NKB {s[f'em_{MAIN}']['mean']:.1f} against the base's {s['em_base']['mean']:.1f} (mean EM over "
            f"{len(record['seeds'])} seeds; {record['commit']})")


def records() -> list[dict]:
    return RECORDS.all()


# ---- the command -------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="fine-tuning seeds 0..N-1 (default 5)")
    parser.add_argument("--home", default="bench/results/paper-t5", help="the warehouse the runs use (kept: a rerun "
                        "reuses its world, base and injections where the code left them unchanged)")
    parser.add_argument("--record", action="store_true", help="make this run the record of this CPU kind")
    parser.add_argument("--page", action="store_true", help="only write the pages from the records (python -m "
                                                              "bench.pages: docs/paper-t5.md, the README's blocks, ...)")
    args = parser.parse_args(argv)
    if args.page:
        print(write_pages())
        return 0
    if args.seeds < 2:
        parser.error("--seeds takes 2 or more: the check compares spreads")
    home = Path(args.home).resolve()
    seeds = {}
    for seed in range(args.seeds):
        seconds = run_seed(home, seed)
        seeds[str(seed)] = {**figures_of(home), "seconds": seconds}
        print(json.dumps({"seed": seed, **seeds[str(seed)]}), flush=True)
    from nkb_model.train import choose_device
    kind = cpu_kind()
    # the stages' precision on this machine (the experiment leaves it at auto: fp32 on a CPU)
    precision = "bf16" if choose_device().autocast_dtype else "fp32"
    run = {"machine": kind, "cpus": os.cpu_count(), "precision": precision, "commit": commit(),
           "date": today(), "seconds": round(sum(s["seconds"] for s in seeds.values())),
           "seeds": seeds, "summary": summary(seeds)}
    path = RECORDS.path(kind)
    verdicts = compare(json.loads(path.read_text())["summary"], run["summary"]) if path.exists() else []
    from bench import record
    from warehouse import Warehouse
    record(Warehouse(ROOT / "bench" / "results" / "paper-t5-figures"), "paper_t5",
           {f"{figure}_{k}": v for figure, stats in run["summary"].items() for k, v in stats.items()},
           {"seeds": args.seeds, "cpu": kind["slug"], "commit": run["commit"]})
    print(json.dumps({"benchmark": "paper_t5", "cpu": kind["slug"], "commit": run["commit"],
                      "summary": {f: run["summary"][f] for f in (*CHECKED, "em_base")}, "against_record": verdicts},
                     indent=1))
    if args.record:
        print(f"recorded {RECORDS.write(kind, run)}; {write_pages()}")
        return 0
    if not path.exists():
        print(f"no record for this CPU kind ({kind['slug']}) yet: --record makes this run its record")
        return 0
    moved = [v for v in verdicts if v["moved"]]
    for v in moved:
        print(f"FAIL: {v['figure']} moved from {v['recorded']} to {v['now']} ({v['shift']:+} points; twice the "
              f"standard error is {2 * v['se']:.2f}) against the record of {json.loads(path.read_text())['commit']}")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
