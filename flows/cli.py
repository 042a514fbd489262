"""`nkb`: the command line over the same stages and flows the Prefect deployments use."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import sys
import time
import typing
from pathlib import Path

from pydantic import ValidationError

from flows.error_lines import USER_ERRORS, describe_error
from stages.configs import EditConfig, is_list, set_value, validation_problems
from warehouse import Warehouse, WarehouseError, list_runs, query, resolve_home, row_counts
from warehouse.sql import FORMATTERS

EPILOG = "The warehouse is ./.nkb unless --home or $NKB_HOME says otherwise."


def _prepare_environment(home: Path) -> None:
    """Prefect state lives inside the warehouse home unless the user chose otherwise."""
    (home / "prefect").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(home / "prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # The temporary server that runs flows without a configured server can be slow to start on 2 cores.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


@contextlib.contextmanager
def local_flow_settings():
    """Flow runs in this process. Without a configured server they run under a temporary one that stops
    with the process, so Prefect's flow-run heartbeats (on by default since 3.8, for a server to tell a
    crashed run) have no one to tell; their thread also holds every flow up to a second at exit, ~50 s of
    a demo's 50 stage flows. They stay on wherever a server is configured."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, get_current_settings, temporary_settings
    if get_current_settings().api.url:
        yield
    else:
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            yield


def _kind(field) -> tuple[str, list | None]:
    """How a config field's values look (`int`, `a,b,...`, `specific|top`), and its choices when it has a few."""
    annotation = field.annotation
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Union:
        inner = [a for a in args if a is not type(None)]
        annotation = inner[0] if len(inner) == 1 else annotation
        args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:  # a constrained type (Name): say what it holds
        annotation = args[0]
        args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return "|".join(map(str, args)), list(args)
    if is_list(annotation):
        return "a,b,...", None
    return getattr(annotation, "__name__", str(annotation)), None


def _shown_default(field) -> str:
    return "required" if field.is_required() else f"default {field.get_default(call_default_factory=True)!r}"


def _field_help(name: str, field) -> str:
    return f"  {name}={_kind(field)[0]}  ({_shown_default(field)})\n      {field.description or ''}"


def config_options(parser: argparse.ArgumentParser, config: type) -> None:
    """An option per field of `config` (`--strength 0.5`), its type, choices, default and help drawn from the field,
    its value read as `--set` reads one: a command's options are its config model's fields, declared once."""
    for name, field in config.model_fields.items():
        kind, choices = _kind(field)
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, required=field.is_required(), choices=choices,
                            metavar=None if choices else kind.upper(),
                            type=lambda text, f=field: set_value(text, f),
                            help=f"{field.description or ''} ({_shown_default(field)})")


def config_from_options(config: type, args):
    """`config` from the options `config_options` added (those not given keep the field's default)."""
    return config(**{name: getattr(args, name) for name in config.model_fields if getattr(args, name) is not None})


def _experiment_epilog() -> str:
    import textwrap

    from stages.experiment import Experiment
    lines = ["experiment keys (YAML; paths relative to the file; '{sample_world}': the sample world's folder):"]
    for name, field in Experiment.model_fields.items():
        lines += textwrap.wrap(field.description or "", 110, initial_indent=f"  {name:<13} ",
                               subsequent_indent=" " * 16)
    return "\n".join(lines)


def _config_epilog(config: type) -> str:
    return "\n".join(["config fields (set with --set key=value):"] +
                     [_field_help(name, field) for name, field in config.model_fields.items()])


def _set_value(fields: dict, key: str, value: str, command: str):
    """The value `--set key=value` gives a field (`stages.configs.set_value`: the experiments' rules)."""
    if key not in fields:
        raise SystemExit(f"error: `{command}` has no config field {key!r}; fields: {', '.join(fields)}")
    try:
        return set_value(value, fields[key])
    except ValueError as exc:
        raise SystemExit(f"error: --set {key}: {exc}") from None


def parse_sets(config: type, pairs: list[str], command: str):
    """`config` from `--set key=value` pairs. Errors name the field and `command`, whose --help lists them."""
    values: dict[str, typing.Any] = {}
    fields = config.model_fields
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep:
            raise SystemExit(f"error: --set expects key=value, got {pair!r}")
        values[key] = _set_value(fields, key, value, command)
    try:
        return config.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(validation_problems(exc))
        raise SystemExit(f"error: invalid config for `{command}`: {problems}\n(see `{command} --help`)") from None


def _output_format(args) -> str:
    """--format if given, else the --output file's extension (.csv, .json), else an aligned table."""
    if args.format:
        return args.format
    suffix = Path(args.output or "").suffix.lstrip(".").lower()
    if suffix == "parquet" and "parquet" in getattr(args, "formats", ()):
        return "parquet"
    return suffix if suffix in FORMATTERS else "table"


def _write(path: str, data: str | bytes) -> None:
    """Write an output file the user named, creating its folder."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            Path(path).write_text(data, encoding="utf-8")
        else:
            Path(path).write_bytes(data)
    except OSError as exc:
        raise ValueError(f"cannot write {path}: {exc.strerror or exc}") from None
    print(f"wrote {path}", file=sys.stderr)


def _emit(text: str, output: str | None) -> None:
    if output:
        _write(output, text if text.endswith("\n") else text + "\n")
    else:
        print(text)


def _program() -> str:
    """How to call this command again: `nkb` when it is on PATH, else the path it was run by."""
    me = os.path.abspath(sys.argv[0])
    return "nkb" if shutil.which("nkb") == me or not os.path.exists(me) else os.path.relpath(me)


def server_command(action: str, project: Path) -> str:
    """`nkb server ACTION` for this project, as a command that works from any directory."""
    return f"{_program()} server {action} --project {shlex.quote(str(project.resolve()))}"


def _home_flag(args) -> str:
    return f" --home {shlex.quote(str(args.home))}" if args.home else ""


# ---- commands ------------------------------------------------------------------------------

def cmd_run(args) -> int:
    from stages.registry import STAGES
    from stages.runner import run_stage, summarize
    stage = STAGES[args.stage]
    config = parse_sets(stage.config, args.set or [], f"nkb run {stage.name}")
    started = time.perf_counter()
    wh = Warehouse(args.home)  # refused here if it cannot be written, before Prefect starts
    if args.prefect or os.environ.get("PREFECT_API_URL") or getattr(config, "dask", None):
        _prepare_environment(wh.home)
        from flows.flows import STAGE_FLOWS
        with local_flow_settings():
            row = STAGE_FLOWS[stage.name](config, str(wh.home), args.force)
    else:
        row = summarize(stage.name, run_stage(stage.name, wh, config, args.force), time.perf_counter() - started)
    if row["skipped"]:
        print(f"{stage.name}: skipped, inputs unchanged since run {row['run_id']} (use --force to rerun)")
    else:
        details = ", ".join(f"{k}={v}" for k, v in row.items() if k not in ("stage", "run_id", "skipped", "written"))
        print(f"{stage.name}: run {row['run_id']} done: {details}")
    return 0


def cmd_pipeline(args) -> int:
    from stages.experiment import Experiment
    return run_experiment(Experiment.load(args.experiment, args.set or []), args)


def cmd_demo(args) -> int:
    from stages.experiment import FULL_DEMO, SAMPLE_WORLD, SAMPLE_WORLD_SMOLLM2, Experiment, decoder_only_demo
    real = args.arch == "smollm2"
    sets = (FULL_DEMO if args.full and not real else []) + (
        decoder_only_demo(args.arch) if args.arch in ("llama", "gpt2") else []) + (
        args.set or []) + ([f"sample_world.people={args.people}"] if args.people else [])
    return run_experiment(Experiment.load(SAMPLE_WORLD_SMOLLM2 if real else SAMPLE_WORLD, sets), args)


def run_experiment(experiment, args) -> int:
    """Run an experiment's plan through the pipeline flow, then say what ran and where the results are."""
    home = resolve_home(args.home)
    experiment.require_files()  # before Prefect starts (the flow checks again, for runs from the UI)
    wh = Warehouse(home)  # a warehouse that cannot be written is refused here, not by Prefect's own state
    _prepare_environment(home)
    from flows.flows import pipeline
    started = time.perf_counter()
    with local_flow_settings():
        rows = pipeline(experiment=experiment, home=str(home), force=args.force, train_models=args.models)
    seconds = time.perf_counter() - started
    print(f"\nExperiment {experiment.name} finished in {seconds:.0f} s. Stages:")
    width = max((len(r["for"]) for r in rows), default=0)
    for r in rows:
        state = "skipped (unchanged)" if r["skipped"] else f"{r['written'] or 'done'} in {r['seconds']:.1f} s"
        print(f"  {r['stage']:<16} {r['for']:<{width}}  {state}")
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
    h = _program() + _home_flag(args)
    print("\nTry:")
    for sql in ("SELECT label, count(*) AS spans FROM salient_spans GROUP BY label ORDER BY spans DESC",
                "SELECT dataset, split, round(100 * value, 1) AS recall_at_3 FROM metrics "
                "WHERE metric = 'answer_recall@3' ORDER BY ALL",
                "SELECT input, target FROM ssm_examples LIMIT 5"):
        print(f'  {h} sql "{sql}"')
    print(f"  {h} runs")
    if models:
        example = next((m for m in models if m.endswith("+nkb.qa")), list(models)[-1])
        print(f"  {h} export {example} exported-model    # a folder stock transformers loads")
    if not args.models:
        return 0
    plot = wh.files_dir / "report.png"
    code = cmd_report(argparse.Namespace(home=args.home, format="table", output=None, plot=str(plot)))
    plots = [plot, *sorted((wh.files_dir / "analysis").glob("*.png"))[-1:]]
    print("\nPlots:\n" + "\n".join(f"  {p}" for p in plots if p.exists()))
    return code


def cmd_sql(args) -> int:
    table = query(Warehouse(args.home, create=False), args.query, timeout=_sql_timeout(args.timeout))
    fmt = _output_format(args)
    if fmt == "parquet":
        import pyarrow.parquet as pq
        if not args.output:
            raise ValueError("--format parquet writes a file: give it with --output FILE.parquet")
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, args.output)
        print(f"wrote {args.output} ({table.num_rows} rows)", file=sys.stderr)
        return 0
    _emit(FORMATTERS[fmt](table), args.output)
    return 0


def _sql_timeout(given: float | None) -> float | None:
    """--timeout, else $NKB_SQL_TIMEOUT (what a shared machine sets for everyone), else 600 s where a Prefect
    server is shared (PREFECT_API_URL set), else none. 0 means none."""
    if given is None:
        given = float(os.environ.get("NKB_SQL_TIMEOUT") or (600 if os.environ.get("PREFECT_API_URL") else 0))
    return given or None


def cmd_check(args) -> int:
    """Compare every table file with what its run committed; with --repair, move the bad ones aside."""
    from warehouse.runs import get_run
    wh = Warehouse(args.home, create=False)
    if args.repair and not wh.writable:
        raise WarehouseError(f"--repair moves files and the warehouse {wh.home} cannot be written")
    problems = wh.check_files()
    if not problems:
        print(f"every table file of {wh.home} is as its run committed it")
        return 0
    aside = wh.home / "quarantine" / time.strftime("%Y%m%dT%H%M%S") if args.repair else None
    for path, why, record in problems:
        where = path.relative_to(wh.home)
        if record is None:
            fix = "no run needs it" + (f"; moved to {aside / where}" if aside else "; `nkb check --repair` moves it "
                                                                                     "aside")
        else:
            run = get_run(wh, record.run_id)
            fix = (f"run {record.run_id} wrote it; rebuild it: {rerun_command(run, args)}" if run
                   else f"run {record.run_id} wrote it and is gone: rerun the pipeline")
        print(f"{where}: {why}; {fix}")
    if aside:
        wh.quarantine([p for p, _, _ in problems], aside)
        print(f"\nMoved what was there to {aside} (nothing deleted); each table reads without it now. "
              "Rerunning the pipeline (or the commands above) rebuilds what is missing.")
    return 2


def rerun_command(run, args) -> str:
    """The command that reruns `run` as it was configured (its settings that are set, as --set pairs)."""
    sets = []
    for key, value in run.config.items():
        if value is None or value == [] or isinstance(value, dict):
            continue
        text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        sets.append(f"--set {shlex.quote(f'{key}={text}')}")
    return " ".join([_program() + _home_flag(args), "run", run.stage, *sets, "--force"])


def cmd_tables(args) -> int:
    import pyarrow as pa
    counts = row_counts(Warehouse(args.home, create=False))
    table = pa.table({"table": [c[0] for c in counts], "kind": [c[1] for c in counts], "rows": [c[2] for c in counts]})
    _emit(FORMATTERS[args.format](table), None)
    return 0


def cmd_runs(args) -> int:
    import pyarrow as pa

    from stages.registry import run_subject
    wh = Warehouse(args.home, create=False)
    runs = list_runs(wh, stage=args.stage, limit=args.limit)
    if args.stage and not runs:
        known = sorted({r.stage for r in list_runs(wh)})
        raise WarehouseError(f"no runs of stage {args.stage!r}; stages with runs: {', '.join(known) or 'none yet'}")
    rows = [{"run_id": r.run_id, "stage": r.stage, "for": run_subject(r.stage, r.config), "status": r.status,
             "started_at": r.started_at.isoformat(sep=" ", timespec="seconds") if r.started_at else None,
             "seconds": round(r.seconds, 2) if r.seconds is not None else None, "outputs": r.outputs,
             "inputs_fingerprint": r.inputs_fingerprint, "code_version": r.code_version, "error": r.error or ""}
            for r in runs]
    if args.format == "json":  # nested objects stay objects; the config too
        _emit(json.dumps([{**row, "config": r.config} for row, r in zip(rows, runs)], indent=1, default=str), None)
        return 0
    for row in rows:
        row["outputs"] = ", ".join(f"{k}={v}" for k, v in row["outputs"].items())
    columns = list(rows[0]) if rows else ["run_id", "stage", "for", "status"]
    _emit(FORMATTERS[args.format](pa.table({c: [row[c] for row in rows] for c in columns})), None)
    return 0


def cmd_report(args) -> int:
    from stages.report import (edits_summary, em_intervals, generation_table, interval_table, refresh_table,
                               report_rows, report_table, surgery_table)
    wh = Warehouse(args.home, create=False)
    rows = report_rows(wh)
    if not rows:
        print("no report yet: run `nkb run report` (after base-model, inject, finetune and evaluate)", file=sys.stderr)
        return 1
    if args.plot:
        from stages.report_plot import report_png
        _write(args.plot, report_png(wh))
    fmt = _output_format(args)
    if fmt == "json":
        keys = ("model", "dataset", "split", "em", "params_total", "params_injected")
        intervals = em_intervals(wh, rows)
        _emit(json.dumps([{k: r[k] for k in keys} | dict(zip(("em_low", "em_high"),
                                                               intervals.get((r["model"], r["dataset"]), ())))
                          for r in rows if r["dataset"] != "average"], indent=1), args.output)
        return 0
    if fmt == "table":  # CSV on standard output stays one parseable table
        print(f"Report {rows[0]['run_id']} ({rows[0]['split']}; EM in %; probe: cloze prompts in unseen wordings, "
              "before fine-tuning)")
    _emit(FORMATTERS[fmt](report_table(wh, rows)), args.output)
    if fmt == "table" and not args.output:
        intervals = interval_table(wh, rows)
        if intervals is not None:
            print("\nEM with 95 % bootstrap intervals (each row's validation questions resampled 2,000 times)")
            print(FORMATTERS[fmt](intervals))
        generation = generation_table(wh)
        if generation is not None:
            print("\nGeneral generation after fine-tuning on each task (ROUGE-L F1 % / SacreBLEU; beam search)")
            print(FORMATTERS[fmt](generation))
        surgery = surgery_table(wh)
        if surgery is not None:
            print("\nKnowledge surgery, one slot edited per wrong first answer token (the paper's Table 8; strength: "
                  "the edit's length over the residual stream's at that step; mean_lambda: the paper's λ applied; "
                  "success and change rate in %)")
            print(FORMATTERS[fmt](surgery))
        edits = edits_summary(wh)
        if edits:
            print(f"\nBatch edit {edits['model']}: {edits['edits']} facts changed together; "
                  f"success {edits['success']} %, "
                  f"generalisation to paraphrases {edits['generalization']} %, locality {edits['locality']} %")
        refresh = refresh_table(wh)
        if refresh is not None:
            print(f"\nThe last refresh: models rebuilt since report {refresh[0]} (EM %, before and after; probe: "
                  "unseen wordings; questions newly right and newly wrong)")
            print(FORMATTERS[fmt](refresh[1]))
    return 0


def cmd_edit(args) -> int:
    from stages.runner import run_stage
    try:
        config = config_from_options(EditConfig, args)
    except ValidationError as exc:
        raise SystemExit(f"error: {validation_problems(exc)[0].removeprefix('config: ')}") from None
    if config.edits:  # a wrong file is found before the model is loaded
        from stages.knowledge import read_edits
        read_edits(config.edits)
    result = run_stage("edit", Warehouse(args.home), config)
    v = result.value or {}
    if result.skipped:
        print(f"this edit was already made: model {result.run.checkpoint} (run {result.run.run_id})")
        return 0
    how = f"λ = {config.lam:g}" if config.lam else f"strength {config.strength:g}"
    print(f"edited model: {v['model']} (from {config.model}, which is unchanged); {how}, "
          f"{v['slots_edited']} slot(s) edited; the log is in {result.run.checkpoint}/nkb-model.json")
    if config.edits:
        print(f"  {v['edits']} edits: success {v['success']} %, generalisation (paraphrases) {v['generalization']} %, "
              f"locality (unedited questions unchanged) {v['locality']} %")
        return 0
    print(f"  old answer: {v['old_answer']!r}\n  new answer: {v['new_answer']!r}"
          f"{'  (the whole wanted answer)' if v['whole_answer'] else '  (not yet the whole wanted answer)'}")
    if not v["whole_answer"]:
        print("  a larger --strength edits harder, at the price of changing more unrelated answers")
    return 0


def cmd_export(args) -> int:
    from stages.export import export_model
    target = export_model(Warehouse(args.home, create=False), args.model, Path(args.folder), adapter=args.adapter)
    if args.adapter:
        print(f"exported {args.model} to {target}: the base and, in nkb/, its slots; load it with "
              "nkb_model.checkpoint.load_model (see its README.md)")
    else:
        print(f"exported {args.model} to {target}: a stock model, the slots merged into its feed-forward layers\n"
              f"  its README.md says how to load it (AutoModelForSeq2SeqLM or AutoModelForCausalLM) and prompt it")
    return 0


def cmd_server(args) -> int:
    from flows import server
    project = Path(args.project)
    if args.action == "up":
        started = time.perf_counter()
        try:
            state = server.up(project, port=args.port, home=args.home)
        except server.ServerError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"\nReady in {time.perf_counter() - started:.1f} s. Open the UI at {state.url}\n"
              f"To use this server from a shell:\n  export PREFECT_API_URL={state.api_url}\n"
              f"Run the pipeline:   prefect deployment run pipeline/pipeline\n"
              f"Rerun one stage:    prefect deployment run inject/inject --param force=true\n"
              f"Stop everything:    {server_command('down', project)}")
        return 0
    if args.action == "down":
        try:
            server.down(project)
        except server.ServerError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    info = server.status(project)
    if args.format == "json":
        print(json.dumps(info, indent=1))
    elif not info["running"]:
        print(f"no server started from {info['project']} runs (`{server_command('up', project)}` starts one)")
    else:
        print(f"server at {info['url']} ({'healthy' if info['healthy'] else 'NOT answering'}); UI: {info['url']}")
        for name, p in info["processes"].items():
            print(f"  {name:<11} pid {p['pid']:<8} {'running' if p['running'] else 'STOPPED'}  log: {p['log']}")
    return 0 if info["running"] else 3


def cmd_schedule(args) -> int:
    from flows import server
    try:
        made = server.schedule(Path(args.project), Path(args.experiment), args.cron, args.timezone)
    except server.ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"scheduled {made['deployment']} ({made['slug']}) at cron {made['cron']!r} {made['timezone']}: each run "
          f"reads {made['experiment_file']} and redoes what changed since the last one")
    return 0


# ---- parser --------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from stages.registry import STAGES
    parser = argparse.ArgumentParser(prog="nkb", description="Neural Knowledge Bank pipeline: stages, warehouse, SQL.",
                                     epilog=EPILOG)
    parser.add_argument("--home", help="warehouse directory (default: $NKB_HOME or ./.nkb)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    experiment_epilog = _experiment_epilog()
    experiment_help = ("set an experiment key (repeatable): stages.STAGE.KEY=value for a stage's setting (listed "
                       "by `nkb run STAGE --help`), pretrain.KEY, large.KEY, sample_world.KEY, or a top-level key "
                       "such as rows=base,base+nkb; values are YAML")
    models_help = ("also build or bring in the base, inject, fine-tune, evaluate and report (about 12 minutes for "
                   "the sample world on 2 CPU cores); --no-models stops after the data stages")
    pipe = sub.add_parser("pipeline", help="run an experiment file end to end",
                          description="Run an experiment: the stages its YAML file plans (ingest its corpora and QA "
                                      "files, index, retrieve, salient spans, base model, NKB injection, fine-tuning, "
                                      "evaluation, report, analysis, surgery). Stages whose inputs are unchanged are "
                                      "skipped, so a rerun after changing a setting reruns only what it affects.",
                          epilog=experiment_epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    pipe.add_argument("experiment", help="the experiment's YAML file (see experiments/example.yaml)")
    demo = sub.add_parser("demo", help="run the built-in sample world's experiment end to end",
                          description="Generate the sample world and run its experiment (experiments/sample-world.yaml) "
                                      "end to end; `nkb pipeline experiments/sample-world.yaml` does the same. E.g. "
                                      "`--set rows=base,base+nkb --set generation=` trains only those rows, without "
                                      "the generation check.",
                          epilog=experiment_epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("--people", type=int, help="people in the sample world (sets sample_world.people)")
    demo.add_argument("--full", action="store_true", help="every row of the paper's Tables 3 and 4 (adds the "
                      "Transformer, larger-base, Kformer and concat rows to the default's base, base+NKB and "
                      "base+NKB-a, and NKB-a to the generation check; what the default built is reused)")
    demo.add_argument("--arch", choices=["t5", "llama", "gpt2", "smollm2"], default="t5", help=(
        "the base: a T5 (default), or a decoder-only Llama or GPT-2 of the same size and budget, with slots on "
        "every block (no Kformer or concat rows: they are T5 baselines); smollm2: the real pretrained "
        "SmolLM2-135M-Instruct, asked few-shot (experiments/sample-world-smollm2.yaml)"))
    for p, func in ((pipe, cmd_pipeline), (demo, cmd_demo)):
        p.add_argument("--set", action="append", metavar="KEY=VALUE", help=experiment_help)
        p.add_argument("--force", action="store_true", help="rerun stages even when their inputs are unchanged")
        p.add_argument("--models", action=argparse.BooleanOptionalAction, default=True, help=models_help)
        p.set_defaults(func=func)

    run = sub.add_parser("run", help="run one stage", description="Run one stage with its config; "
                         "`nkb run STAGE --help` lists the stage's config fields.")
    stage_sub = run.add_subparsers(dest="stage", required=True, metavar="STAGE")
    for stage in STAGES.values():
        p = stage_sub.add_parser(stage.name, help=stage.summary, description=stage.summary,
                                 epilog=_config_epilog(stage.config), formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--set", action="append", metavar="KEY=VALUE", help="set a config field (repeatable)")
        p.add_argument("--force", action="store_true", help="rerun even if the same inputs already succeeded")
        p.add_argument("--prefect", action="store_true",
                       help="run as a Prefect flow run even without a configured server "
                            "(automatic when PREFECT_API_URL is set)")
        p.set_defaults(func=cmd_run)

    fmt_help = "output format: aligned table, CSV, or JSON (an array of row objects)"
    sql = sub.add_parser("sql", help="run a read-only SQL query", description="Run read-only SQL (SELECT, WITH, "
                         "DESCRIBE, SHOW, SUMMARIZE, EXPLAIN) over the warehouse's tables and views.")
    sql.add_argument("query", help="the SQL, e.g. \"SELECT count(*) FROM documents\"")
    sql.add_argument("--format", choices=[*FORMATTERS, "parquet"], help=fmt_help + ", or Parquet (with --output); "
                     "default: from --output's extension (.csv, .json, .parquet), else table")
    sql.add_argument("--output", metavar="FILE", help="write the result to FILE instead of standard output")
    sql.add_argument("--timeout", type=float, metavar="SECONDS", help="stop the query after this long (default: "
                     "$NKB_SQL_TIMEOUT, else 600 where PREFECT_API_URL names a shared server, else none; 0: none). "
                     "Ctrl-C stops it at once")
    sql.set_defaults(func=cmd_sql, formats=[*FORMATTERS, "parquet"])

    check = sub.add_parser("check", help="verify every table file against what its run wrote",
                           description="Read every Parquet file of the warehouse and compare it with the size and "
                                       "SHA-256 its run recorded. Lists damaged, missing and foreign files (files no "
                                       "run wrote) with the command that rebuilds each; exit status 2 if any.")
    check.add_argument("--repair", action="store_true", help="move damaged and foreign files to "
                       "HOME/quarantine/TIME/ (nothing is deleted): every table then reads without them, and "
                       "rerunning the pipeline rebuilds what is missing")
    check.set_defaults(func=cmd_check)

    tables = sub.add_parser("tables", help="list tables with row counts", description="List tables with row counts.")
    tables.add_argument("--format", choices=list(FORMATTERS), default="table", help=fmt_help)
    tables.set_defaults(func=cmd_tables)

    runs = sub.add_parser("runs", help="list stage runs, newest first", description="List stage runs, newest first.")
    runs.add_argument("--stage", help="only runs of this stage")
    runs.add_argument("--limit", type=int, default=50, help="at most this many runs (default 50; 0: all)")
    runs.add_argument("--format", choices=list(FORMATTERS), default="table", help=fmt_help)
    runs.set_defaults(func=cmd_runs)
    rep = sub.add_parser("report", help="print the latest report (the paper's Table 3)",
                         description="Print the latest report: EM per dataset and model, the knowledge probe, "
                                     "held-out loss (no-forgetting check), parameter counts.")
    rep.add_argument("--format", choices=list(FORMATTERS),
                     help="table, csv, or json (rows {model, dataset, split, em, params_total, params_injected}); "
                          "default: from --output's extension (.csv, .json), else table")
    rep.add_argument("--output", metavar="FILE", help="write to FILE instead of standard output")
    rep.add_argument("--plot", metavar="PNG", help="also draw the loss curves and EM per model into this PNG file")
    rep.set_defaults(func=cmd_report)

    ed = sub.add_parser("edit", help="edit facts in a model's NKB, saved as a new model version",
                        description="Knowledge surgery: at each step of the wanted answer, the slot most particular "
                                    "to the question (--slot) gets v += λ (e_wanted − e_predicted), with λ set by a "
                                    "relative strength (the edit adds a vector STRENGTH times as long as the model's "
                                    "residual stream at that step) or given as the paper's absolute λ. "
                                    "The result is a new model (the old one stays selectable by its name) with an "
                                    "edit log. --edits applies many edits and reports success, generalisation to "
                                    "paraphrases and locality.")
    config_options(ed, EditConfig)
    ed.set_defaults(func=cmd_edit)

    ex = sub.add_parser("export", help="write a model as a folder that stock transformers loads",
                        description="Write a warehouse model to a new folder that "
                                    "`AutoModelForSeq2SeqLM` (T5) or `AutoModelForCausalLM` (GPT-2, Llama-style) and "
                                    "`AutoTokenizer` load with no project code: its NKB slots merged into the "
                                    "model's feed-forward layers as extra neurons (same outputs), with a "
                                    "model card (README.md: prompt format, how it was built, scores).")
    ex.add_argument("model", help="the model's name (e.g. base+nkb.qa; `nkb runs` lists them) or folder")
    ex.add_argument("folder", help="the folder to write (must not exist, or be empty)")
    ex.add_argument("--adapter", action="store_true", help="instead write the base plus the slots apart (nkb/, "
                                                           "with the base's name and SHA-256), to swap slots")
    ex.set_defaults(func=cmd_export)

    sch = sub.add_parser("schedule", help="run an experiment on a schedule (e.g. a weekly knowledge refresh)",
                         description="Add a schedule to the running server's pipeline deployment that runs an "
                                     "experiment file. Point the file's knowledge path at the newest dump (e.g. a "
                                     "link your download job updates): each run reruns only what the new dump "
                                     "changes, and `nkb report` shows the refresh beside the report before. "
                                     "Scheduling the same experiment again replaces its schedule.")
    sch.add_argument("experiment", help="the experiment's YAML file")
    sch.add_argument("--cron", default="0 3 * * 1", help="when, as cron (default '0 3 * * 1': Mondays 03:00)")
    sch.add_argument("--timezone", default="UTC", help="the cron's time zone (default UTC)")
    sch.add_argument("--project", default=".", help="project directory whose server to use (default: .)")
    sch.set_defaults(func=cmd_schedule)

    srv = sub.add_parser("server", help="start, stop or inspect a local Prefect server with workers",
                         description="up: start a Prefect server on 127.0.0.1, create the cpu and gpu work pools "
                                     "(gpu: one run at a time), deploy every stage and the pipeline, start one "
                                     "worker per pool. down: stop exactly what `up` started. status: what runs "
                                     "and where the UI is. State and logs live in PROJECT/.prefect.")
    srv.add_argument("action", choices=["up", "down", "status"], help="what to do")
    srv.add_argument("--port", type=int, default=4200, help="server port on 127.0.0.1 (default 4200)")
    srv.add_argument("--project", default=".", help="project directory with prefect.yaml (default: .)")
    srv.add_argument("--format", choices=["text", "json"], default="text", help="status output format")
    srv.set_defaults(func=cmd_server)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        # The reader stopped early (`nkb sql ... | head`): not our error. Point stdout at /dev/null so that
        # the interpreter's final flush does not raise again, and exit as a process killed by SIGPIPE would.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except USER_ERRORS as exc:
        print(f"error: {describe_error(exc)}", file=sys.stderr)
        return 1
    except OSError as exc:  # the machine's: a full disk, a read-only mount, a missing permission
        print(f"error: {describe_error(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        what = "the query was stopped" if args.command == "sql" else "the warehouse is unchanged by the unfinished stage"
        print(f"interrupted; {what}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
