"""`nkb sql`, `check`, `tables`, `runs` and `report`: reading the warehouse."""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import textwrap
from pathlib import Path

from flows.cli_common import emit, home_flag, output_format, program, write_output
from warehouse import Warehouse, WarehouseError, list_runs, row_counts
from warehouse.sql import FORMATTERS, WRITERS, query_stream


def cmd_sql(args) -> int:
    fmt = output_format(args)
    if fmt == "parquet" and not args.output:
        raise ValueError("--format parquet writes a file: give it with --output FILE.parquet")
    wh = Warehouse(args.home, create=False)
    with query_stream(wh, args.query, timeout=_sql_timeout(args.timeout)) as (schema, batches):
        if fmt == "parquet":
            write_output(args.output, lambda partial: _write_parquet(schema, batches, partial))
        elif args.output:
            write_output(args.output, lambda partial: _write_text(WRITERS[fmt], schema, batches, partial))
        else:
            WRITERS[fmt](schema, batches, sys.stdout)
    return 0


def _write_parquet(schema, batches, path: str) -> None:
    import pyarrow.parquet as pq
    with pq.ParquetWriter(path, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)


def _write_text(writer, schema, batches, path: str) -> None:
    with open(path, "w", newline="", encoding="utf-8") as out:
        writer(schema, batches, out)


def _sql_timeout(given: float | None) -> float | None:
    """--timeout, else $NKB_SQL_TIMEOUT (what a shared machine sets for everyone), else 600 s where a Prefect
    server is shared (PREFECT_API_URL set), else none. 0 means none."""
    if given is None:
        setting = os.environ.get("NKB_SQL_TIMEOUT")
        given = seconds(setting, "$NKB_SQL_TIMEOUT") if setting else 600 if os.environ.get("PREFECT_API_URL") else 0
    return given or None


def seconds(text: str, what: str = "--timeout") -> float:
    """A number of seconds, 0 or more and finite (-1 would never stop, nan would mean no limit)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} takes seconds, 0 or more (0: no limit), not {text!r}")
    return value


def _timeout_option(text: str) -> float:
    try:
        return seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--timeout ")) from None


def _count_option(text: str) -> int:
    """A whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"takes a whole number, 0 or more (0: all), not {text!r}")
    return value


def cmd_check(args) -> int:
    """Compare every table file with what its run committed; with --repair, move the bad ones aside; with --adopt,
    register the files a lost warehouse.duckdb no longer lists."""
    from warehouse.runs import get_run
    wh = Warehouse(args.home, create=False, adopt=args.adopt)  # --adopt on a read-only home is refused here
    if args.repair and not wh.writable:
        raise WarehouseError(f"--repair moves files and the warehouse {wh.home} cannot be written")
    if args.adopt:
        print(f"registered {len(wh.adopted)} table file{'s' * (len(wh.adopted) != 1)} as they are now" + "".join(
            f"\n  {r.table}/{r.partition}.parquet ({r.rows} rows, run {r.run_id})" for r in wh.adopted))
    refused = dict(wh.refused)  # adoption left them out: they stay files no run wrote, for the reason it found
    problems = [(path, refused.get(path, why), record) for path, why, record in wh.check_files()]
    for path, why, record in problems:
        if record is None:
            fix = "no run needs it; " + ("moved aside" if args.repair else "`nkb check --repair` moves it aside")
        else:
            fix = _rebuild(get_run(wh, record.run_id), record.run_id, args)
        print(f"{path.relative_to(wh.home)}: {why}; {fix}")
    if problems and args.repair:
        aside = wh.quarantine(problems)
        print(f"\nMoved what was there to {aside} (nothing deleted; moved.json lists it); each table reads without "
              "it now. Rerunning the pipeline (or the commands above) rebuilds what is missing." if aside else
              "\nNothing left to move: another --repair moved it meanwhile.")
    lacking = wh.unrebuilt()
    if lacking:
        print(f"\nNot rebuilt since --repair moved {'it' if len(lacking) == 1 else 'them'} aside, so "
              f"{'its table lacks its' if len(lacking) == 1 else 'their tables lack their'} rows:")
        for entry in lacking:
            print(f"  {entry['file']} (in {Path(entry['folder']).relative_to(wh.home)}): "
                  f"{_rebuild(get_run(wh, entry['run_id']), entry['run_id'], args)}")
    if not problems and not lacking:
        print(f"every table file of {wh.home} is as its run committed it")
        return 0
    return 2


def _rebuild(run, run_id: str, args) -> str:
    return (f"run {run_id} wrote it; rebuild it: {rerun_command(run, args)}" if run
            else f"run {run_id} wrote it and its record is gone: rerun the pipeline")


def rerun_command(run, args) -> str:
    """The command that reruns `run` as it was configured (its settings that are set, as --set pairs)."""
    sets = []
    for key, value in run.config.items():
        if value is None or value == [] or isinstance(value, dict):
            continue
        text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        sets.append(f"--set {shlex.quote(f'{key}={text}')}")
    return " ".join([program() + home_flag(args), "run", run.stage, *sets, "--force"])


def cmd_tables(args) -> int:
    import pyarrow as pa
    counts = row_counts(Warehouse(args.home, create=False))
    table = pa.table({"table": [c[0] for c in counts], "kind": [c[1] for c in counts], "rows": [c[2] for c in counts]})
    emit(FORMATTERS[args.format](table), None)
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
        emit(json.dumps([{**row, "config": r.config} for row, r in zip(rows, runs)], indent=1, default=str), None)
        return 0
    for row in rows:
        row["outputs"] = ", ".join(f"{k}={v}" for k, v in row["outputs"].items())
    columns = list(rows[0]) if rows else ["run_id", "stage", "for", "status"]
    emit(FORMATTERS[args.format](pa.table({c: [row[c] for row in rows] for c in columns})), None)
    return 0


def cmd_report(args) -> int:
    from warehouse.runs import get_run
    from stages.report import (edits_summary, generation_table, refresh_table, report_rows, report_table,
                               rows_to_read, surgery_table)
    wh = Warehouse(args.home, create=False)
    rows = report_rows(wh)
    if not rows:
        print("no report yet: run `nkb run report` (after base-model, inject, finetune and evaluate)", file=sys.stderr)
        return 1
    if args.plot:
        from stages.report_plot import report_png
        write_output(args.plot, report_png(wh))
    fmt = output_format(args)
    if fmt == "json":
        emit(json.dumps(report_table(rows).to_pylist(), indent=1), args.output)
        return 0
    if fmt == "table":  # to be read: what repeats another row or column left out (CSV and JSON keep every cell)
        print(f"Report {rows[0]['run_id']} ({rows[0]['split']}; EM in %, with its 95 % interval; `nkb report --help` "
              "says what each column means; columns empty on every row, and a model's average of one dataset, "
              "left out)")
        rows = rows_to_read(rows)
    table = report_table(rows, digits=True)
    if fmt == "table":
        table = table.select([c for c in table.column_names if table.column(c).null_count < table.num_rows])
    emit(FORMATTERS[fmt](table), args.output)
    held_out = (get_run(wh, rows[0]["run_id"]).outputs or {}).get("heldout_loss")
    if held_out:  # why the column is empty
        print(f"held-out loss: {held_out}", file=sys.stderr)
    if fmt == "table" and not args.output:
        generation = generation_table(wh)
        if generation is not None:
            print("\nGeneral generation after fine-tuning on each task (ROUGE-L F1 % / SacreBLEU; beam search)")
            print(FORMATTERS[fmt](generation), end="")
        surgery = surgery_table(wh)
        if surgery is not None:
            print("\nKnowledge surgery, one slot edited per wrong first answer token (the paper's Table 8; strength: "
                  "the edit's length over the residual stream's at that step; mean_lambda: the paper's λ applied; "
                  "success and change rate in %)")
            print(FORMATTERS[fmt](surgery), end="")
        edits = edits_summary(wh)
        if edits:
            print(f"\nBatch edit {edits['model']}: {edits['edits']} facts changed together; "
                  f"success {edits['success']} %, "
                  f"generalisation to paraphrases {edits['generalization']} %, locality {edits['locality']} %")
        refresh = refresh_table(wh)
        if refresh is not None:
            print(f"\nThe last refresh: models rebuilt since report {refresh[0]} (EM %, before and after; probe: "
                  "unseen wordings; questions newly right and newly wrong)")
            print(FORMATTERS[fmt](refresh[1]), end="")
    return 0


def add_commands(sub) -> None:
    fmt_help = "output format: aligned table, CSV, or JSON (an array of row objects)"
    sql = sub.add_parser("sql", help="run a read-only SQL query", description="Run read-only SQL (SELECT, WITH, "
                         "DESCRIBE, SHOW, SUMMARIZE, EXPLAIN) over the warehouse's tables and views.")
    sql.add_argument("query", help="the SQL, e.g. \"SELECT count(*) FROM documents\"")
    sql.add_argument("--format", choices=[*FORMATTERS, "parquet"], help=fmt_help + ", or Parquet (with --output); "
                     "default: from --output's extension (.csv, .json, .parquet), else table")
    sql.add_argument("--output", metavar="FILE", help="write the result to FILE instead of standard output")
    sql.add_argument("--timeout", type=_timeout_option, metavar="SECONDS", help="stop the query after this long "
                     "(default: "
                     "$NKB_SQL_TIMEOUT, else 600 where PREFECT_API_URL names a shared server, else none; 0: none). "
                     "Ctrl-C stops it at once")
    sql.set_defaults(func=cmd_sql, formats=[*FORMATTERS, "parquet"])

    check = sub.add_parser("check", help="verify every table file against what its run wrote",
                           description="Read every Parquet file of the warehouse and compare it with the size and "
                                       "SHA-256 its run recorded. Lists damaged, missing and foreign files (files no "
                                       "run wrote) with the command that rebuilds each, and the files an earlier "
                                       "--repair moved aside that no run has rebuilt since; exit status 2 if any.")
    check.add_argument("--repair", action="store_true", help="move damaged and foreign files to a new folder "
                       "HOME/quarantine/TIME/ (nothing is deleted or overwritten; its moved.json lists them): every "
                       "table then reads without them, and rerunning the pipeline rebuilds what is missing")
    check.add_argument("--adopt", action="store_true", help="register the table files that the registry does not "
                       "list but whose footer names the run that wrote them, as they are now: after "
                       "warehouse.duckdb was lost (a new one is made) or files were copied in on purpose")
    check.set_defaults(func=cmd_check)

    tables = sub.add_parser("tables", help="list tables with row counts", description="List tables with row counts.")
    tables.add_argument("--format", choices=list(FORMATTERS), default="table", help=fmt_help)
    tables.set_defaults(func=cmd_tables)

    runs = sub.add_parser("runs", help="list stage runs, newest first", description="List stage runs, newest first.")
    runs.add_argument("--stage", help="only runs of this stage")
    runs.add_argument("--limit", type=_count_option, default=50, help="at most this many runs (default 50; 0: all)")
    runs.add_argument("--format", choices=list(FORMATTERS), default="table", help=fmt_help)
    runs.set_defaults(func=cmd_runs)
    from stages.report import REPORT_GLOSSARY
    rep = sub.add_parser("report", help="print the latest report (the paper's Table 3)",
                         description="Print the latest report, one row per model and dataset: EM with its 95 %% "
                                     "interval, the knowledge probe, held-out loss (no-forgetting check), facts "
                                     "retained, parameters and training time; the same columns in every format and "
                                     "in the `report` table.",
                         epilog="columns:\n" + "\n".join(
                             textwrap.fill(text, 116, initial_indent=f"  {name:<24}",
                                           subsequent_indent=" " * 26) for name, text in REPORT_GLOSSARY.items()),
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    rep.add_argument("--format", choices=list(FORMATTERS),
                     help="table, csv, or json (an array of rows with the columns below); default: from --output's "
                          "extension (.csv, .json), else table")
    rep.add_argument("--output", metavar="FILE", help="write to FILE instead of standard output")
    rep.add_argument("--plot", metavar="PNG", help="also draw the loss curves and each model's EM (with its 95 %% "
                     "interval) and probes into this PNG file")
    rep.set_defaults(func=cmd_report)
