"""What it costs that no read returns a byte its run did not commit (issue 53), on a large `documents` table.

A documents table of about `--mb` MB of Parquet is written through a real stage run (the sample world's articles,
repeated under new ids), then measured, each figure the best of a few runs (the page cache warm where the file fits):
- writing: the same rows written with and without page checksums (CRC-32 per page);
- the check before each read (`Warehouse.table_files`: each file's size and footer digest) against hashing every
  byte (`file_digest`: what checking the registry's SHA-256 on every read would cost);
- a full scan through `nkb sql` (`SELECT count(*), sum(length(text)) FROM documents`) with pages verified, as the
  warehouse reads, and the same scan with verification off, as before; and `count(*)` through `nkb sql`;
- the same scan and `count(*)` through the plain duckdb CLI, on the view (which checks the file's size and time
  first) and on a bare read_parquet of the file.
Prints JSON and records `metrics` rows.

    python -m bench.integrity [--mb 2000] [--record]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from bench import record
from bench.recorded import ROOT, Records, kind_title, page_head, record_if_asked, record_option, run_line, this_cpu
from stages import data
from stages.configs import SampleWorldConfig
from warehouse import Warehouse, file_digest, query, run_stage
from warehouse.parquet import CHECKED_PARQUET

SCAN = "SELECT count(*) AS n, sum(length(text)) AS chars FROM documents"


def best_of(times: int, work) -> float:
    """The fastest of `times` runs of `work()`, in seconds (the page cache warm after the first)."""
    best = float("inf")
    for _ in range(times):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best


def source_rows(people: int, home: Path) -> pa.Table:
    """The sample world's knowledge articles, as its stages load them: real stage output to repeat."""
    world = Warehouse(home)
    data.load_sample_world(world, SampleWorldConfig(people=people, background_people=0), general=False)
    return world.read("documents", ["doc_id", "title", "text"], filter=pc.field("corpus") == "sampleworld")


def big_documents(wh: Warehouse, rows: pa.Table, mb: int) -> dict:
    """One committed `documents` partition of about `mb` MB, written by a stage run in batches of `rows` under new
    ids; returns its size and the seconds the run took."""
    def body(run):
        with run.writer("documents", "big") as w:
            copy = 0
            while w.rows == 0 or Path(w.path).stat().st_size < mb * 1e6:
                ids = pc.binary_join_element_wise(pa.scalar(f"{copy}/"), rows.column("doc_id"), "")
                w.write(rows.set_column(0, "doc_id", ids).append_column("corpus", pa.array(["big"] * rows.num_rows)))
                copy += 1
    started = time.perf_counter()
    run_stage(wh, "ingest", {"corpus": "big", "mb": mb}, f"big-{mb}", body, force=True)
    path = wh.partition_path("documents", "big")
    return {"rows": pq.read_metadata(path).num_rows, "bytes": path.stat().st_size,
            "stage_write_s": round(time.perf_counter() - started, 2)}


def write_seconds(path: Path, checksums: bool, scratch: Path) -> float:
    """Seconds to rewrite the file's rows with the warehouse's writer settings, with or without page checksums."""
    source = pq.ParquetFile(path)
    target = scratch / f"rewrite-{checksums}.parquet"

    def rewrite():
        with pq.ParquetWriter(target, source.schema_arrow, compression="zstd", write_page_checksum=checksums) as w:
            for group in range(source.num_row_groups):
                w.write_table(source.read_row_group(group))
    return best_of(1, rewrite)


def scan_seconds(path: Path, schema: pa.Schema, verify: bool) -> float:
    """The sql scan over the file registered as nkb sql registers it, pages verified or not."""
    fmt = CHECKED_PARQUET if verify else ds.ParquetFileFormat()
    con = duckdb.connect(":memory:")
    con.register("documents", ds.dataset([str(path)], schema=schema, format=fmt))
    seconds = best_of(3, lambda: con.execute(SCAN).fetchall())
    con.close()
    return seconds


def cli_scan_seconds(wh: Warehouse, path: Path) -> dict:
    """The scan and `count(*)` through the plain duckdb CLI on the warehouse's view (its checks: the database it is
    read from, each file's size and time) and on a bare read_parquet of the same file, each the best of 3 runs of
    the CLI process; {} where the CLI is not installed."""
    cli = shutil.which("duckdb") or str(Path(sys.executable).parent / "duckdb")
    if not os.path.exists(cli):
        return {}

    def seconds(sql: str) -> float:
        return round(best_of(3, lambda: subprocess.run([cli, str(wh.db_path), "-c", sql], check=True,
                                                       capture_output=True)), 3)
    bare = f"(SELECT * FROM read_parquet('{path}'))"
    return {"cli_view_scan_s": seconds(SCAN), "cli_bare_scan_s": seconds(SCAN.replace("documents", bare)),
            "cli_view_count_s": seconds("SELECT count(*) FROM documents"),
            "cli_bare_count_s": seconds(f"SELECT count(*) FROM {bare}")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=2000, help="size of the documents table to build, in MB")
    parser.add_argument("--people", type=int, default=20_000, help="people in the sample world whose articles repeat")
    parser.add_argument("--home", default="bench/results/integrity", help="benchmark warehouse (rebuilt)")
    record_option(parser)
    args = parser.parse_args(argv)
    os.environ.setdefault("NKB_PROGRESS", "0")
    home = Path(args.home)
    shutil.rmtree(home / "big", ignore_errors=True)
    rows = source_rows(args.people, home / "world")
    wh = Warehouse(home / "big")
    figures = big_documents(wh, rows, args.mb)
    path = wh.partition_path("documents", "big")
    schema = wh.schema("documents")
    with tempfile.TemporaryDirectory(dir=home) as scratch:
        figures["write_with_checksums_s"] = round(write_seconds(path, True, Path(scratch)), 2)
        figures["write_without_checksums_s"] = round(write_seconds(path, False, Path(scratch)), 2)
    figures["check_before_read_s"] = round(best_of(5, lambda: Warehouse(wh.home).table_files("documents")), 4)
    figures["whole_digest_s"] = round(best_of(2, lambda: file_digest(path)), 2)
    figures["scan_verified_s"] = round(scan_seconds(path, schema, verify=True), 2)
    figures["scan_unverified_s"] = round(scan_seconds(path, schema, verify=False), 2)
    figures["nkb_sql_scan_s"] = round(best_of(3, lambda: query(Warehouse(wh.home), SCAN)), 2)
    figures["nkb_sql_count_s"] = round(best_of(3, lambda: query(Warehouse(wh.home), "SELECT count(*) FROM documents")),
                                       3)
    figures.update(cli_scan_seconds(wh, path))
    figures["scan_overhead_pct"] = round(100 * (figures["scan_verified_s"] / figures["scan_unverified_s"] - 1), 1)
    figures["write_overhead_pct"] = round(100 * (figures["write_with_checksums_s"] /
                                                 figures["write_without_checksums_s"] - 1), 1)
    figures["run_id"] = record(wh, "integrity", figures, {"mb": args.mb, "people": args.people})
    result = {"benchmark": "integrity", "cpus": os.cpu_count(), **figures}
    print(json.dumps(result, indent=1))
    record_if_asked(args, __name__, result, argv)
    return 0


RECORDS = Records("integrity")
PAGE = ROOT / "docs" / "integrity.md"
WHAT = "what it costs that a read returns only committed bytes"
kind_of = this_cpu
ROWS = (("writing the file with page checksums / without, s", ("write_with_checksums_s", "write_without_checksums_s")),
        ("the check before each read: each file's size and footer digest (`Warehouse.table_files`), s",
         ("check_before_read_s",)),
        ("hashing every byte instead (the registry's SHA-256 checked on each read), s", ("whole_digest_s",)),
        ("full scan `SELECT count(*), sum(length(text))`, pages verified / not verified, s",
         ("scan_verified_s", "scan_unverified_s")),
        ("the same scan through `nkb sql` (registry, checks, sandbox, pages verified), s", ("nkb_sql_scan_s",)),
        ("`count(*)` through `nkb sql`, s", ("nkb_sql_count_s",)),
        ("the scan through the duckdb CLI on the warehouse's view / on a bare read_parquet, s",
         ("cli_view_scan_s", "cli_bare_scan_s")))


def label(result: dict) -> str:
    return f"{result['bytes'] / 1e9:.0f} GB"


def headline(record: dict) -> str:
    return "; ".join(f"{name}: the check before a read {run['result']['check_before_read_s'] * 1000:.0f} ms, a full "
                     f"scan {run['result']['scan_overhead_pct']:+.1f} % with pages verified ({run['commit']})"
                     for name, run in record["runs"].items())


def page(records: list[dict]) -> str:
    lines = page_head("Reading only what was committed", RECORDS.name,
                      "One `documents` partition (the sample world's articles repeated under new ids) written by a stage "
                      "run, then read every way a read can be checked; each figure the best of a few runs. Remade by "
                      "`python -m bench.integrity --mb 2000 --record`.")
    for record in records:
        runs = list(record["runs"].items())
        lines += [f"## {kind_title(record['machine'])}", ""] + [f"- {name}: {run_line(run)}" for name, run in runs]
        lines += ["", "| what | " + " | ".join(f"{r['result']['bytes'] / 1e6:,.0f} MB, {r['result']['rows']:,} rows"
                                               for _, r in runs) + " |", "|---" * (len(runs) + 1) + "|"]
        for what, keys in ROWS:
            cells = [" / ".join(str(r["result"][k]) for k in keys) if all(k in r["result"] for k in keys) else "-"
                     for _, r in runs]
            lines.append(f"| {what} | " + " | ".join(cells) + " |")
        lines += ["", "The scan's cost of verifying pages: " + ", ".join(
            f"{r['result']['scan_overhead_pct']:+.1f} % at {name}" for name, r in runs) + "; writing with checksums: "
            + ", ".join(f"{r['result']['write_overhead_pct']:+.1f} %" for _, r in runs) + ".", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
