"""Ingestion benchmark: pages/s and MB/s of uncompressed XML, and peak memory for a dump and one 4x larger.

Generates sample-world MediaWiki dumps of at least `--mb` MB uncompressed (and 4x that), ingests each
with the real `ingest` stage in a fresh process, and prints one JSON object. Memory must be flat: the
peak RSS for the large dump should match the small one's. Results are recorded as `metrics` rows of
the ingest runs in the benchmark warehouse (`bench/results/warehouse` unless --home).

    python -m bench.ingest [--mb 50] [--home DIR]
"""

from __future__ import annotations

import argparse
import bz2
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

from corpus.sample_world import SampleWorld

_CHILD = """
import json, sys, threading, time
import psutil
from stages import data
from stages.configs import IngestConfig
from warehouse import Warehouse

me = psutil.Process()
peak = {"main": 0, "total": 0}
done = threading.Event()

def sample():  # resident memory of this process and its wikitext workers, every 100 ms
    while not done.is_set():
        try:
            main = me.memory_info().rss
            total = main + sum(c.memory_info().rss for c in me.children(recursive=True))
        except psutil.Error:
            continue
        peak["main"], peak["total"] = max(peak["main"], main), max(peak["total"], total)
        done.wait(0.1)

wh = Warehouse(sys.argv[1])
base = me.memory_info().rss
threading.Thread(target=sample, daemon=True).start()
t = time.perf_counter()
result = data.ingest(wh, IngestConfig(path=sys.argv[2], corpus=sys.argv[3]), force=True)
seconds = time.perf_counter() - t
done.set()
print(json.dumps({"run_id": result.run.run_id, "pages": result.value["documents"], "seconds": seconds,
                  "rss_before_mb": base / 2**20, "peak_rss_mb": peak["main"] / 2**20,
                  "peak_rss_with_workers_mb": peak["total"] / 2**20}))
"""


def make_dump(path: Path, min_mb: float, seed: int = 1) -> float:
    """Write a sample-world dump of at least `min_mb` MB uncompressed; returns its uncompressed MB."""
    people = max(100, int(min_mb * 1e6 / 2200))
    while True:
        world = SampleWorld(seed=seed, people=people, background_people=0)
        world.write_dump(path)
        with bz2.open(path, "rb") as fh:
            size = sum(len(chunk) for chunk in iter(lambda: fh.read(1 << 22), b""))
        if size >= min_mb * 1e6:
            return size / 1e6
        people = int(people * min_mb * 1e6 / size * 1.05) + 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=50, help="uncompressed size of the smaller dump (default 50)")
    parser.add_argument("--home", default="bench/results/warehouse", help="benchmark warehouse directory")
    args = parser.parse_args(argv)
    home = Path(args.home)
    home.mkdir(parents=True, exist_ok=True)
    results = []
    for factor in (1, 4):
        dump = home.parent / f"dump-{factor}x.xml.bz2"
        started = time.perf_counter()
        mb = make_dump(dump, args.mb * factor)
        gc.collect()
        print(f"generated {dump} ({mb:.1f} MB uncompressed) in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        out = subprocess.run([sys.executable, "-c", _CHILD, str(home), str(dump), f"bench{factor}x"],
                             capture_output=True, text=True, check=True, env={"NKB_PROGRESS": "0", **_env()})
        child = json.loads(out.stdout.strip().splitlines()[-1])
        results.append({"dump": dump.name, "uncompressed_mb": round(mb, 1), "compressed_mb": round(dump.stat().st_size / 1e6, 1),
                        "pages": child["pages"], "seconds": round(child["seconds"], 1),
                        "pages_per_s": round(child["pages"] / child["seconds"], 1),
                        "mb_per_s": round(mb / child["seconds"], 2), "peak_rss_mb": round(child["peak_rss_mb"], 1),
                        "peak_rss_with_workers_mb": round(child["peak_rss_with_workers_mb"], 1),
                        "rss_before_mb": round(child["rss_before_mb"], 1), "run_id": child["run_id"]})
        print(json.dumps(results[-1]), file=sys.stderr)
    summary = {"benchmark": "ingest", "results": results,
               "peak_rss_ratio_4x_over_1x": round(results[1]["peak_rss_with_workers_mb"]
                                                  / results[0]["peak_rss_with_workers_mb"], 3)}
    _record(home, summary)
    print(json.dumps(summary, indent=1))
    return 0


def _env() -> dict:
    import os
    return {k: v for k, v in os.environ.items() if k != "NKB_PROGRESS"}


def _record(home: Path, summary: dict) -> None:
    """Record the figures as metrics of the ingest runs they measured."""
    from warehouse import Warehouse, run_stage
    wh = Warehouse(home)

    def body(run):
        for r in summary["results"]:
            for metric in ("pages_per_s", "mb_per_s", "peak_rss_mb", "peak_rss_with_workers_mb", "uncompressed_mb"):
                run.metric(f"bench.ingest.{metric}", r[metric], dataset=r["dump"])
        run.metric("bench.ingest.peak_rss_ratio_4x_over_1x", summary["peak_rss_ratio_4x_over_1x"])
        return summary

    run_stage(wh, "bench-ingest", {"results": [r["run_id"] for r in summary["results"]]}, "bench", body, force=True)


if __name__ == "__main__":
    sys.exit(main())
