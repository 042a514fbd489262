"""Ingestion benchmark: pages/s and MB/s of uncompressed XML, and peak memory as the dump grows.

Two sources of dumps:
- the sample world (default): dumps of at least `--mb` MB uncompressed and 4x that;
- a real pages-articles file (`--dump FILE`): the file itself and copies made `--repeats` times larger by
  repeating its pages under new ids and titles, with a plain single-process mwparserfromhell `strip_code`
  loop over the same pages for comparison, and the time the full English Wikipedia would take at that rate.

Each dump is ingested by the real `ingest` stage in a fresh process. Memory must be flat: bounded by one
Parquet row group of text (8M characters), so the peak RSS stops growing once a dump fills one. Results are
recorded as `metrics` rows of the ingest runs in the benchmark warehouse (`bench/results/warehouse` unless
--home).

    python -m bench.ingest [--mb 50] [--home DIR]
    python -m bench.ingest --dump enwiki-...-pages-articles1.xml-p1p41242.bz2 [--repeats 1,20,80] [--record]

With --dump, WikiExtractor (the tool users would otherwise pick; a dev dependency) runs on each dump with as many
processes as the ingest's wikitext workers, and both are reported side by side: pages/s, characters kept, pages
and articles still holding markup, and the hours the English Wikipedia would take on 2 and on 64 cores.
"""

from __future__ import annotations

import argparse
import bz2
import gc
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from bench.recorded import ROOT, Records, kind_title, page_head, record_if_asked, record_option, run_line, this_cpu
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


ENWIKI_ARTICLES = 7_028_569  # English Wikipedia's articles on 26 July 2025 (Wikipedia:Size of Wikipedia)


def repeat_dump(source: Path, path: Path, times: int) -> float:
    """`source`'s pages `times` over, each copy with new page ids and titles (the reader refuses repeated ids).
    Returns the uncompressed MB."""
    text = bz2.open(source, "rt", encoding="utf-8").read() if source.suffix == ".bz2" else source.read_text("utf-8")
    head, rest = text.split("<page>", 1)
    pages, tail = rest.rsplit("</page>", 1)
    pages = "<page>" + pages + "</page>"
    size = 0
    with bz2.open(path, "wt", encoding="utf-8", compresslevel=1) as out:
        out.write(head)
        for k in range(times):
            copy = pages if k == 0 else re.sub(
                r"<title>(.*?)</title>(\s*<ns>\d+</ns>\s*)<id>(\d+)</id>",
                lambda m: f"<title>{m[1]} ({k})</title>{m[2]}<id>{int(m[3]) + k * 10**9}</id>", pages)
            out.write(copy)
            size += len(copy.encode("utf-8"))
        out.write(tail)
    return (size + len(head.encode()) + len(tail.encode())) / 1e6


def plain_loop(path: Path) -> dict:
    """A single-process mwparserfromhell `strip_code` loop over the main-namespace articles: the floor a
    wikitext cleaner built on the same parser has to beat."""
    import xml.etree.ElementTree as ET

    import mwparserfromhell
    started, pages = time.perf_counter(), 0
    with bz2.open(path, "rb") as fh:
        for _, elem in ET.iterparse(fh):
            if elem.tag.endswith("}page"):
                ns = elem.find("{*}ns")
                text = elem.find("{*}revision/{*}text")
                if ns is not None and ns.text == "0" and elem.find("{*}redirect") is None and text is not None:
                    mwparserfromhell.parse(text.text or "").strip_code()
                    pages += 1
                elem.clear()
    seconds = time.perf_counter() - started
    return {"pages": pages, "seconds": round(seconds, 1), "pages_per_s": round(pages / seconds, 1)}


MARKUP = ("<ref", "{{", "[[", "|}")  # what clean text must not hold


def _residue(title_texts) -> dict:
    """Pages, characters kept, and the pages (and distinct articles, a repeated dump's copies counted once) whose
    text still holds wiki markup."""
    pages = chars = 0
    marked = set()
    for title, text in title_texts:
        pages, chars = pages + 1, chars + len(text)
        if any(m in text for m in MARKUP):
            marked.add(title)
    articles = {re.sub(r" \(\d+\)$", "", t) for t in marked}
    return {"pages": pages, "characters": chars, "pages_with_markup": len(marked),
            "articles_with_markup": len(articles)}


def ours_kept(home: Path, corpus: str) -> dict:
    import pyarrow.compute as pc

    from warehouse import Warehouse
    table = Warehouse(home).read("documents", ["title", "text"], filter=pc.field("corpus") == corpus)
    return _residue(zip(table.column("title").to_pylist(), table.column("text").to_pylist()))


def wikiextractor(dump: Path, processes: int, out: Path) -> dict | None:
    """WikiExtractor (attardi/wikiextractor, `pip install wikiextractor`) on the same dump with as many processes,
    as its users run it for plain text (`--no-templates --json`); None where it is not installed."""
    import importlib.util
    import shutil
    if importlib.util.find_spec("wikiextractor") is None:
        return None
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "wikiextractor.WikiExtractor", "--processes", str(processes),
                    "--no-templates", "--json", "-q", "-o", str(out), str(dump)], check=True, capture_output=True)
    seconds = time.perf_counter() - started
    rows = (json.loads(line) for f in sorted(out.rglob("wiki_*")) for line in f.open(encoding="utf-8"))
    kept = _residue((r["title"], r["text"]) for r in rows)
    shutil.rmtree(out, ignore_errors=True)
    return {"seconds": round(seconds, 1), "pages_per_s": round(kept["pages"] / seconds, 1), **kept}


def hours(pages_per_s: float, cores: int, measured_on: int) -> float:
    """The English Wikipedia's articles at this rate, scaled linearly from the cores measured on (an upper bound
    on the speed-up: decompression and writing stay one process each)."""
    return round(ENWIKI_ARTICLES / (pages_per_s * cores / measured_on) / 3600, 1)


def ingest_in_child(home: Path, dump: Path, corpus: str, mb: float) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(home), str(dump), corpus],
                         capture_output=True, text=True, check=True, env={"NKB_PROGRESS": "0", **_env()})
    child = json.loads(out.stdout.strip().splitlines()[-1])
    return {"dump": dump.name, "uncompressed_mb": round(mb, 1), "compressed_mb": round(dump.stat().st_size / 1e6, 1),
            "pages": child["pages"], "seconds": round(child["seconds"], 1),
            "pages_per_s": round(child["pages"] / child["seconds"], 1),
            "mb_per_s": round(mb / child["seconds"], 2), "peak_rss_mb": round(child["peak_rss_mb"], 1),
            "peak_rss_with_workers_mb": round(child["peak_rss_with_workers_mb"], 1),
            "rss_before_mb": round(child["rss_before_mb"], 1), "run_id": child["run_id"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=50, help="uncompressed size of the smaller sample-world dump "
                                                              "(default 50)")
    parser.add_argument("--dump", type=Path, help="a real pages-articles file (.xml or .xml.bz2) instead")
    parser.add_argument("--repeats", default="1,20,80", help="with --dump: how many times to repeat its pages, "
                                                             "comma-separated (default 1,20,80)")
    parser.add_argument("--home", default="bench/results/warehouse", help="benchmark warehouse directory")
    record_option(parser)
    args = parser.parse_args(argv)
    home = Path(args.home)
    home.mkdir(parents=True, exist_ok=True)
    results = []
    factors = [int(f) for f in args.repeats.split(",")] if args.dump else [1, 4]
    for factor in factors:
        dump = home.parent / f"dump-{factor}x.xml.bz2"
        started = time.perf_counter()
        mb = repeat_dump(args.dump, dump, factor) if args.dump else make_dump(dump, args.mb * factor)
        gc.collect()
        print(f"made {dump} ({mb:.1f} MB uncompressed) in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        results.append(ingest_in_child(home, dump, f"bench{factor}x", mb))
        if args.dump:  # side by side with the tool users would otherwise pick, on the same file
            cores = os.cpu_count() or 1
            results[-1]["ours"] = ours_kept(home, f"bench{factor}x")
            theirs = wikiextractor(dump, cores, home.parent / "wikiextractor-out")
            results[-1]["wikiextractor"] = theirs or "not installed (pip install wikiextractor)"
            if theirs:
                results[-1]["ours_over_wikiextractor_pages_per_s"] = round(results[-1]["pages_per_s"]
                                                                          / theirs["pages_per_s"], 2)
            for who, rate in (("ours", results[-1]["pages_per_s"]), ("wikiextractor", (theirs or {}).get("pages_per_s"))):
                if rate:
                    results[-1][f"{who}_enwiki_hours"] = {"2_cores": hours(rate, 2, cores),
                                                          "64_cores": hours(rate, 64, cores)}
        print(json.dumps(results[-1]), file=sys.stderr)
    summary = {"benchmark": "ingest", "source": str(args.dump or "sample world"), "cpus": os.cpu_count(),
               "results": results, "peak_rss_ratio_largest_over_smallest": _ratio(results[-1], results[0])}
    if len(results) > 2:  # memory is bounded by a row group's text: the smallest dump may not fill one
        summary["peak_rss_ratio_largest_over_next"] = _ratio(results[-1], results[-2])
    if args.dump:
        loop = plain_loop(home.parent / f"dump-{factors[0]}x.xml.bz2")
        best = max(results, key=lambda r: r["pages_per_s"])
        summary |= {"plain_mwparserfromhell_loop": loop,
                    "enwiki_hours_at_this_rate": round(ENWIKI_ARTICLES / best["pages_per_s"] / 3600, 1)}
    _record(home, summary)
    print(json.dumps(summary, indent=1))
    record_if_asked(args, __name__, summary, argv)
    return 0


RECORDS = Records("ingest")
PAGE = ROOT / "docs" / "ingest.md"
WHAT = "Wikipedia ingest beside WikiExtractor"
kind_of = this_cpu


def label(result: dict) -> str:
    return Path(result["source"]).name


def headline(record: dict) -> str:
    """The largest dump's rate beside WikiExtractor's, of the record's first run with WikiExtractor beside it."""
    for run in record["runs"].values():
        largest = run["result"]["results"][-1]
        if isinstance(largest.get("wikiextractor"), dict):
            return (f"{largest['pages_per_s']:.0f} pages/s, {largest['ours_over_wikiextractor_pages_per_s']:.2f}x "
                    f"WikiExtractor's, on {largest['uncompressed_mb']:.0f} MB ({run['commit']})")
    return "no run beside WikiExtractor"


def dump_row(r: dict) -> str:
    """One dump's row: ours beside WikiExtractor's ("-" where it did not run)."""
    theirs = r["wikiextractor"] if isinstance(r.get("wikiextractor"), dict) else {}

    def both(key: str) -> str:
        return " / ".join(f"{x:,}" if x is not None else "-" for x in (r["ours"][key], theirs.get(key)))
    return (f"| {r['dump']}, {r['uncompressed_mb']:.1f} MB | {both('pages')} | {r['seconds']} / "
            f"{theirs.get('seconds', '-')} | {r['pages_per_s']:.0f} / {theirs.get('pages_per_s', 0):.0f} | "
            f"{r.get('ours_over_wikiextractor_pages_per_s', '-')} | {both('characters')} | "
            f"{r['ours']['pages_with_markup']} ({r['ours']['articles_with_markup']}) / "
            f"{theirs.get('pages_with_markup', '-')} ({theirs.get('articles_with_markup', '-')}) | "
            f"{r['peak_rss_with_workers_mb']:.0f} MB |")


def page(records: list[dict]) -> str:
    lines = page_head("Wikipedia ingest beside WikiExtractor", RECORDS.name,
                      "The `ingest` stage in a fresh process with its wikitext workers, and WikiExtractor (`--processes "
                      "N --no-templates --json`, N the same) on the same files: a real dump and its pages repeated "
                      "under new ids. Markup left: a page whose text still holds `<ref`, `{{`, `[[` or `|}`. Remade by "
                      "`python -m bench.ingest --dump FILE --record`.")
    for record in records:
        lines += [f"## {kind_title(record['machine'])}", ""]
        for name, run in record["runs"].items():
            result = run["result"]
            lines += [f"### {name}", "", f"Measured at {run_line(run)}, {result['cpus']} cores.", "",
                      "| dump, uncompressed | pages kept, ours / WikiExtractor | seconds | pages/s | ours ÷ theirs "
                      "| characters kept | pages (articles) with markup left | peak RSS with workers |",
                      "|---|---|---|---|---|---|---|---|"]
            lines += [dump_row(r) for r in result["results"]]
            loop = result.get("plain_mwparserfromhell_loop", {})
            lines += ["", f"- Peak memory, the largest dump over the next: "
                          f"{result.get('peak_rss_ratio_largest_over_next', '-')}x (bounded by one Parquet row group)."]
            if loop:
                lines.append(f"- A plain single-process mwparserfromhell `strip_code` loop on the first dump: "
                             f"{loop['pages_per_s']:.0f} pages/s.")
            if result["results"][-1].get("ours_enwiki_hours"):
                hours = result["results"][-1]
                lines.append(f"- The English Wikipedia at the largest dump's rate: {hours['ours_enwiki_hours']['2_cores']} h "
                             f"on 2 cores (WikiExtractor {hours['wikiextractor_enwiki_hours']['2_cores']} h), "
                             f"{hours['ours_enwiki_hours']['64_cores']} h on 64 if cleaning scales with the cores.")
            lines.append("")
    return "\n".join(lines)


def _ratio(larger: dict, smaller: dict) -> float:
    return round(larger["peak_rss_with_workers_mb"] / smaller["peak_rss_with_workers_mb"], 3)


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k != "NKB_PROGRESS"}


def _record(home: Path, summary: dict) -> None:
    """Record the figures as metrics of the ingest runs they measured."""
    from warehouse import Warehouse, run_stage
    wh = Warehouse(home)

    def body(run):
        for r in summary["results"]:
            for metric in ("pages_per_s", "mb_per_s", "peak_rss_mb", "peak_rss_with_workers_mb", "uncompressed_mb"):
                run.metric(f"bench.ingest.{metric}", r[metric], dataset=r["dump"])
        for ratio in ("peak_rss_ratio_largest_over_smallest", "peak_rss_ratio_largest_over_next"):
            if ratio in summary:
                run.metric(f"bench.ingest.{ratio}", summary[ratio])
        if "plain_mwparserfromhell_loop" in summary:
            run.metric("bench.ingest.plain_loop_pages_per_s", summary["plain_mwparserfromhell_loop"]["pages_per_s"])
        for r in summary["results"]:
            if isinstance(r.get("wikiextractor"), dict):
                run.metric("bench.ingest.wikiextractor_pages_per_s", r["wikiextractor"]["pages_per_s"], dataset=r["dump"])
                for who in ("ours", "wikiextractor"):
                    run.metric(f"bench.ingest.{who}_articles_with_markup", r[who]["articles_with_markup"],
                               dataset=r["dump"])
        return summary

    run_stage(wh, "bench-ingest", {"results": [r["run_id"] for r in summary["results"]]}, "bench", body, force=True)


if __name__ == "__main__":
    sys.exit(main())
