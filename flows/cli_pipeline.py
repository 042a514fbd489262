"""`nkb pipeline`, `nkb demo` and `nkb run`: experiments end to end, and one stage."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from flows.cli_common import (config_epilog, experiment_epilog, home_flag, import_uninterrupted, local_flow_settings,
                              parse_sets, prepare_environment, program)
from flows.cli_warehouse import cmd_report
from stages.configs import ARCHITECTURES, DEFAULT_ARCH, FIELD_ROUTES_HELP
from warehouse import Warehouse, resolve_home, row_counts

SMOLLM2 = "smollm2"  # `nkb demo`'s default: the real SmolLM2-135M-Instruct; every other --arch, a base built here


def cmd_run(args) -> int:
    from stages.registry import STAGES
    from stages.runner import dispatch, summarize
    stage = STAGES[args.stage]
    if args.experiment:
        configs, force = experiment_runs(args.experiment, stage.name, args.home, args.set or []), True
    else:
        configs, force = [parse_sets(stage.config, args.set or [], f"nkb run {stage.name}")], args.force
    ready_to_run([(stage.name, config) for config in configs])
    wh = Warehouse(args.home)  # refused here if it cannot be written, before Prefect starts
    prepare_environment(wh.home)  # a server on this warehouse: its flow runs go there
    for config in configs:
        started = time.perf_counter()
        if args.prefect or os.environ.get("PREFECT_API_URL") or getattr(config, "dask", None):
            from flows.flows import STAGE_FLOWS
            with local_flow_settings():
                row = STAGE_FLOWS[stage.name](config, str(wh.home), force)
        else:
            row = summarize(stage.name, dispatch(stage.name, wh, config, force), time.perf_counter() - started)
        subject = f" {row['for']}" if row.get("for") else ""
        if row["skipped"]:
            print(f"{stage.name}{subject}: skipped, inputs unchanged since run {row['run_id']} (use --force to rerun)")
        else:
            details = ", ".join(f"{k}={v}" for k, v in row.items()
                                if k not in ("stage", "for", "run_id", "skipped", "written"))
            print(f"{stage.name}{subject}: run {row['run_id']} done: {details}")
    return 0


def experiment_runs(path: str, stage: str, home: str | None, sets: list[str] = ()) -> list:
    """The configs of an experiment's runs of `stage`, as its pipeline makes them (one per row for a model stage),
    each with `sets` over its settings; runs the sets make the same, once (`--set shots=3` makes a model's 5-shot and
    0-shot evaluations one)."""
    from stages.experiment import Experiment
    from stages.inputs import world_dir
    from stages.registry import STAGES
    from stages.runner import picked
    experiment = Experiment.load(path).with_world(world_dir(Warehouse(home)))
    configs = (parse_sets(STAGES[stage].config, list(sets), f"nkb run {stage}", over=c.model_dump(exclude_unset=True))
               for _, c in picked(experiment.plan(), only=[stage]))
    return list({c.model_dump_json(): c for c in configs}.values())


def ready_to_run(runs) -> None:
    """Before the first of `runs` (stage, config) starts: torch imported whole if any of them needs it, whenever
    Ctrl-C is pressed, a device this machine lacks refused, and a precision it lacks said."""
    from stages.registry import STAGES
    from stages.runner import precision_notes, require_devices
    if any(STAGES[name].imports_torch for name, _ in runs):
        import_uninterrupted("torch", "transformers")
    require_devices(runs)
    for note in precision_notes(runs):
        print(f"note: {note}", file=sys.stderr)


def cmd_pipeline(args) -> int:
    from stages.experiment import Experiment
    experiment = Experiment.load(args.experiment, (args.set or []) + _routes(args))
    return run_experiment(experiment, args)


DEMO_RECORDS = Path(__file__).resolve().parents[1] / "bench" / "records" / "demo-smollm2"  # bench.demo_seeds writes them
COMPARED_ROWS = ("base+NKB (5-shot)", "base+NKB (0-shot)")


def where_in_record(rows: dict[str, dict], record: dict) -> str:
    """This demo's base+NKB EM beside the range its CPU kind's record measured over injection seeds."""
    parts = []
    for model in COMPARED_ROWS:
        values = [seed["rows"][model]["em"] for seed in record["seeds"].values() if model in seed["rows"]]
        if values and rows.get(model, {}).get("em") is not None:
            inside = "inside" if min(values) <= rows[model]["em"] <= max(values) else "OUTSIDE"
            parts.append(f"{model} {rows[model]['em']:.1f}, {inside} {min(values):.1f}-{max(values):.1f}")
    return (f"On this kind of CPU ({record['machine']['name']}), the demo over injection seeds "
            f"{', '.join(sorted(record['seeds'], key=int))} at {record['commit']} gave a range: " + "; ".join(parts))


def record_note(wh: Warehouse) -> str:
    """Where this demo's figures fall in its CPU kind's record, or how to make one."""
    import json

    from stages.machine import cpu_kind
    from stages.report import by_model, report_rows
    kind = cpu_kind()
    path = DEMO_RECORDS / f"{kind['slug']}.json"
    if not path.exists():
        return (f"No record of the demo on this kind of CPU ({kind['slug']}) to hold it to: `python -m "
                "bench.demo_seeds --record` makes one.")
    return where_in_record(by_model(report_rows(wh)), json.loads(path.read_text()))


def cmd_demo(args) -> int:
    from stages.experiment import FULL_DEMO, SAMPLE_WORLD, SAMPLE_WORLD_SMOLLM2, Experiment, arch_demo
    arch = args.arch or (DEFAULT_ARCH if args.full else SMOLLM2)
    if args.full and arch == SMOLLM2:
        raise ValueError("--full adds the paper's rows on bases built here (T5, Transformer, Kformer, concat); "
                         "use it with --arch t5 (its default) or llama/gpt2, not smollm2")
    sets = (FULL_DEMO if args.full else []) + (arch_demo(arch) if arch != SMOLLM2 else []) + (
        args.set or []) + ([f"sample_world.people={args.people}"] if args.people else []) + _routes(args)
    experiment = Experiment.load(SAMPLE_WORLD_SMOLLM2 if arch == SMOLLM2 else SAMPLE_WORLD, sets)
    code = run_experiment(experiment, args, export=True)
    if code == 0 and arch == SMOLLM2 and not sets and args.models and not args.plan:  # the recorded demo as it is
        print("\n" + record_note(Warehouse(args.home)))
    return code


def _stage_list(text: str) -> list[str]:
    """`--only`'s stage names, comma-separated."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("names no stage: give STAGE[,STAGE...]")
    return names


def _routes(args) -> list[str]:
    """`--routes` as the setting it stands for, set before the experiment is checked (zero_shot may name them)."""
    return ["routes=true"] if args.routes else []


# The demo's export check asks this many questions: each is asked twice in fp32 (~0.5 s a question on 2 cores), and
# `tests/stages/test_real_model.py` checks every question of a real model's evaluation.
EXPORT_CHECKED = 25


def export_and_check(wh: Warehouse, name: str, folder) -> None:
    """Export the demo's injected model for stock transformers (once per model version) and show that stock
    transformers alone answers as the warehouse's model does."""
    from stages.export import check_export, export_model
    target = wh.files_dir / "exported" / Path(folder).name
    if target.exists():
        print(f"\nExported {name} for stock transformers earlier: {target}")
        return
    export_model(wh, name, target)
    check = check_export(wh, name, target, questions=EXPORT_CHECKED)
    print(f"\nExported {name} for stock transformers, slots merged into its feed-forward layers: {target}\n"
          f"  {check['loaded_with']} alone gives the warehouse model's greedy answers to {check['same']} of "
          f"{check['questions']} questions of {check['evaluation']} (fp32)")
    for qid, ours, stock in check["differ"][:5]:
        print(f"  differs on {qid}: {ours!r} in the warehouse, {stock!r} exported")


def run_experiment(experiment, args, export: bool = False) -> int:
    """Run an experiment's plan through the pipeline flow, then say what ran and where the results are."""
    home = resolve_home(args.home)
    from stages.inputs import world_dir
    from stages.runner import picked
    experiment.require_files()  # before Prefect starts (the flow checks both again, for runs from the UI)
    plan = picked(experiment.plan(args.models), args.only, args.start)
    ready_to_run(plan)
    wh = Warehouse(home)  # a warehouse that cannot be written is refused here, not by Prefect's own state
    print_plan(wh, [(name, config) for name, config in picked(
        experiment.with_world(world_dir(wh)).plan(args.models), args.only, args.start)],
        args.force or bool(args.only or args.start), calibrate=args.plan)
    if args.plan:
        return 0
    prepare_environment(home)
    from flows.flows import pipeline
    from stages.configs import MAIN_ROW
    from stages.names import evaluated_name
    started = time.perf_counter()
    with local_flow_settings():
        rows = pipeline(experiment=experiment, home=str(home), force=args.force, train_models=args.models,
                        only=args.only, start=args.start)
    seconds = time.perf_counter() - started
    print(f"\nExperiment {experiment.name} finished in {seconds:.0f} s. Stages:")
    width = max((len(r["for"]) for r in rows), default=0)
    stage_width = max((len(r["stage"]) for r in rows), default=0)
    for r in rows:
        state = "skipped (unchanged)" if r["skipped"] else f"{r['written'] or 'done'} in {r['seconds']:.1f} s"
        print(f"  {r['stage']:<{stage_width}} {r['for']:<{width}}  {state}")
    models = {r["model"]: r["folder"] for r in rows if r.get("folder")}
    if models:
        print("\nModels (each folder has a model card, README.md; `nkb export NAME FOLDER` for stock transformers):")
        for name, folder in models.items():
            print(f"  {name:<{max(map(len, models))}}  {folder}")
    print(f"\nWarehouse: {home}\n  Parquet tables: {wh.tables_dir}\n  DuckDB file:    {wh.db_path}"
          f"  (open it with the duckdb CLI too)\n\nTables:")
    filled = [(name, kind, count) for name, kind, count in row_counts(wh) if count]
    width = max((len(name) for name, _, _ in filled), default=0)
    for name, kind, count in filled:
        print(f"  {name:<{width}} {count:>8} rows  ({kind})")
    h = program() + home_flag(args)
    print("\nTry:")
    for sql in suggested_queries({name for name, _, _ in filled}):
        print(f'  {h} sql "{sql}"')
    print(f"  {h} runs")
    # the main row's model, fine-tuned if it was: the one the demo exports
    injected = next((m for m in (evaluated_name(MAIN_ROW.model, 0), MAIN_ROW.model) if m in models), None)
    if models:
        example = injected or list(models)[-1]
        print(f"  {h} export {example} exported-model    # a folder stock transformers loads")
    if not args.models:
        return 0
    if export and injected:
        export_and_check(wh, injected, models[injected])
    plot = wh.files_dir / "report.png"
    code = cmd_report(argparse.Namespace(home=args.home, format="table", output=None, plot=str(plot)))
    plots = [plot, *sorted((wh.files_dir / "analysis").glob("*.png"))[-1:]]
    print("\nPlots:\n" + "\n".join(f"  {p}" for p in plots if p.exists()))
    return code


def print_plan(wh: Warehouse, plan, force: bool, calibrate: bool = False) -> None:
    """Every run of `plan` in order: run or skip, why, and the time each run should take here (`stages.plan`;
    `calibrate`: runs never run here timed on made-up text, where their stage can be)."""
    from stages.plan import plan_steps
    steps = plan_steps(wh, plan, force, calibrate)
    runs = [s for s in steps if s.action == "run"]
    known = [s.seconds for s in runs if s.seconds is not None]
    unknown = len(runs) - len(known)
    untimed = (f"{unknown} never run here and not timed" if calibrate else
               f"{unknown} with no earlier run here to time {'it' if unknown == 1 else 'them'} by; `--plan` times "
               "the long ones")
    total = ", and ".join(([f"about {duration(sum(known))} here"] if known else [])
                          + ([untimed] if unknown else [])) or "nothing to time"
    print(f"Plan: {len(runs)} of {len(steps)} runs to run ({total}); `--plan` shows this and runs nothing")
    width = max(len(f"{s.stage} {s.subject}") for s in steps)
    for s in steps:
        cost = f"  ~{duration(s.seconds)} ({s.basis})" if s.seconds is not None else ""
        print(f"  {s.action:<5} {f'{s.stage} {s.subject}':<{width}}  {s.why}{cost}")
    failing = [s for s in steps if s.action == "fails"]
    if failing:
        raise ValueError(f"{failing[0].stage} {failing[0].subject}: {failing[0].why}")
    print(flush=True)


def duration(seconds: float) -> str:
    """45 s, 12 min, 1 h 40 min."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


# What the end of a run suggests querying, by the table each reads: only tables the run filled are suggested.
SUGGESTED_QUERIES = {
    "salient_spans": "SELECT label, count(*) AS spans FROM salient_spans GROUP BY label ORDER BY spans DESC",
    "metrics": "SELECT dataset, split, round(100 * value, 1) AS recall_at_3 FROM metrics "
               "WHERE metric = 'answer_recall@3' ORDER BY ALL",
    "ssm_examples": "SELECT input, target FROM ssm_examples LIMIT 5",
    "knowledge_questions": "SELECT question, answer, label FROM knowledge_questions LIMIT 5",
}


def suggested_queries(filled: set[str]) -> list[str]:
    """The queries worth trying on a warehouse whose filled tables are `filled`."""
    return [sql for table, sql in SUGGESTED_QUERIES.items() if table in filled]


def add_commands(sub) -> None:
    from stages.registry import STAGES
    epilog = experiment_epilog()
    experiment_help = ("set an experiment key (repeatable): stages.STAGE.KEY=value for a stage's setting (listed "
                       "by `nkb run STAGE --help`), pretrain.KEY, large.KEY, sample_world.KEY, or a top-level key "
                       "such as rows=base,base+nkb; values are YAML")
    models_help = ("also build or bring in the base, inject, fine-tune, evaluate and report (the demo: 15 to "
                   "30 minutes on 2 CPU cores); --no-models stops after the data stages")
    pipe = sub.add_parser("pipeline", help="run an experiment file end to end",
                          description="Run an experiment: the stages its YAML file plans (ingest its corpora and QA "
                                      "files, index, retrieve, salient spans, base model, NKB injection, fine-tuning, "
                                      "evaluation, report, analysis, surgery). Stages whose inputs are unchanged are "
                                      "skipped, so a rerun after changing a setting reruns only what it affects.",
                          epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    pipe.add_argument("experiment", help="the experiment's YAML file (see experiments/example.yaml)")
    demo = sub.add_parser("demo", help="run the built-in sample world's experiment end to end",
                          description="Generate the sample world, put its facts into the slots of the real "
                                      "SmolLM2-135M-Instruct and run the experiment end to end "
                                      "(experiments/sample-world-smollm2.yaml; `nkb pipeline FILE` does the same), "
                                      "then export the injected model for stock transformers and check its answers. "
                                      "`--arch t5` runs the paper's experiment on tiny T5 bases pretrained here "
                                      "(experiments/sample-world.yaml).",
                          epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("--people", type=int, help=(
        "people in the sample world (sets sample_world.people; SmolLM2's experiment has 80 at 1,400 injection steps, "
        "about nine passes over their segments: scale the steps with the people, --set stages.inject.steps=N)"))
    demo.add_argument("--full", action="store_true", help="the T5 experiment with every row of the paper's Tables 3 "
                      "and 4 (adds the Transformer, larger-base, Kformer and concat rows to --arch t5's base, "
                      "base+NKB and base+NKB-a, and NKB-a to the generation check; what --arch t5 built is reused)")
    demo.add_argument("--arch", choices=[SMOLLM2, *ARCHITECTURES], help=(
        "the base: smollm2 (default), the real pretrained SmolLM2-135M-Instruct, asked few-shot; t5 (the default "
        "with --full), the paper's experiment on tiny T5 bases pretrained here, fine-tuned on QA; llama or gpt2, a "
        "decoder-only base of the T5's size and budget with slots on every block (no Kformer or concat rows: "
        "they are T5 baselines)"))
    for p, func in ((pipe, cmd_pipeline), (demo, cmd_demo)):
        p.add_argument("--routes", action="store_true", help=(
            "also train the field's routes on the slots' blocks, batches and steps, for the table that weighs them "
            f"({FIELD_ROUTES_HELP}); what the experiment built is reused"))
        p.add_argument("--set", action="append", metavar="KEY=VALUE", help=experiment_help)
        p.add_argument("--force", action="store_true", help="rerun stages even when their inputs are unchanged")
        p.add_argument("--only", type=_stage_list, metavar="STAGE[,STAGE...]", help=(
            "rerun only these stages, with the experiment's settings, forced (every run of each: `--only evaluate` "
            "evaluates every row); the others are not run"))
        p.add_argument("--from", dest="start", metavar="STAGE", help="rerun this stage and every one after it in "
                       "the experiment's plan, forced; the ones before are not run")
        p.add_argument("--models", action=argparse.BooleanOptionalAction, default=True, help=models_help)
        p.add_argument("--plan", action="store_true", help=(
            "print the plan and stop: every stage run in order, whether it runs or is skipped and why (the setting "
            "that changed, or 'unchanged since run ...'), and how long each run should take here, from this "
            "warehouse's earlier runs, or, for a base brought in or an injection never run here, from loading the "
            "base and timing a few injection steps on made-up text; nothing runs or is written (a pipeline prints the "
            "same plan as it starts, without the timing)"))
        p.set_defaults(func=func)

    run = sub.add_parser("run", help="run one stage", description="Run one stage with its config; "
                         "`nkb run STAGE --help` lists the stage's config fields.")
    stage_sub = run.add_subparsers(dest="stage", required=True, metavar="STAGE")
    for stage in STAGES.values():
        p = stage_sub.add_parser(stage.name, help=stage.summary, description=stage.summary,
                                 epilog=config_epilog(stage.config), formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--set", action="append", metavar="KEY=VALUE", help="set a config field (repeatable); with "
                       "--experiment, over the experiment's settings")
        p.add_argument("--experiment", metavar="FILE", help="run the stage as this experiment's pipeline runs it (its "
                       "settings, each of its runs of the stage: every row's for a model stage), forced")
        p.add_argument("--force", action="store_true", help="rerun even if the same inputs already succeeded")
        p.add_argument("--prefect", action="store_true",
                       help="run as a Prefect flow run even without a configured server "
                            "(automatic when PREFECT_API_URL is set)")
        p.set_defaults(func=cmd_run)
