"""Every page and README block written from recorded runs, in one command:

    python -m bench.pages            # write them
    python -m bench.pages --check    # exit 1 naming each that differs from its records (a test runs it)

Each page belongs to the benchmark that records it (`PAGES`): the demo over seeds (docs/demo-smollm2.md and the
README's table), the paper's T5 experiment (docs/paper-t5.md and the README's lines), the routes beside the NKB, real
passages, ingest, integrity, few-shot parity, injection's speed, its profile and the GPU path. results.md's index gives each page's headline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench import (demo_seeds, fewshot_vs_harness, gpu, ingest, inject, integrity, paper_t5, profile_inject,
                   real_passages, routes)
from bench.recorded import README, ROOT, with_block

# Each page's module: its RECORDS, PAGE, WHAT, page(records) and headline(record), in the index's order.
PAGES = (demo_seeds, paper_t5, routes, real_passages, ingest, integrity, fewshot_vs_harness, inject, profile_inject, gpu)
RESULTS = ROOT / "docs" / "results.md"
INDEX_MARKS = ("<!-- pages: written by `python -m bench.pages` from bench/records -->", "<!-- /pages -->")


def index_block() -> str:
    """results.md's index of the generated pages, each with its headline on each machine kind recorded."""
    lines = [INDEX_MARKS[0], "", "| page | what | headline, per machine kind recorded |", "|---|---|---|"]
    for module in PAGES:
        name = module.PAGE.name
        for record in module.RECORDS.all():
            lines.append(f"| [{name}]({name}) | {module.WHAT} | {record['machine']['slug']}: "
                         f"{module.headline(record)} |")
    return "\n".join(lines + ["", INDEX_MARKS[1]])


def generated() -> dict[Path, str]:
    """Each generated file's text, from the records."""
    readme = README.read_text()
    readme = with_block(readme, demo_seeds.README_MARKS, demo_seeds.readme_block(demo_seeds.records()))
    readme = with_block(readme, paper_t5.README_MARKS, paper_t5.readme_block(paper_t5.records()))
    pages = {module.PAGE: module.page(module.RECORDS.all()) for module in PAGES}
    return {README: readme, RESULTS: with_block(RESULTS.read_text(), INDEX_MARKS, index_block()), **pages}


def stale() -> list[Path]:
    """The generated files whose text differs from what their records give."""
    return [path for path, text in generated().items() if not path.exists() or path.read_text() != text]


def write() -> list[Path]:
    written = []
    for path, text in generated().items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path.relative_to(ROOT))
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pages", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page differs from its records")
    args = parser.parse_args(argv)
    if args.check:
        behind = stale()
        for path in behind:
            print(f"{path.relative_to(ROOT)} differs from its records: run `python -m bench.pages`")
        return 1 if behind else 0
    print(f"wrote {', '.join(map(str, write())) or 'nothing: every page is as its records give it'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
