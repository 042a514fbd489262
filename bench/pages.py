"""Every page and README block written from recorded runs, in one command:

    python -m bench.pages            # write them
    python -m bench.pages --check    # exit 1 naming each that differs from its records (a test runs it)

The demo over seeds (docs/demo-smollm2.md and the README's table: `bench.demo_seeds`), the paper's T5 experiment
(docs/paper-t5.md and the README's lines: `bench.paper_t5`), the routes beside the NKB (docs/routes.md:
`bench.routes`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench import demo_seeds, paper_t5, routes
from bench.recorded import README, ROOT, with_block


RESULTS = ROOT / "docs" / "results.md"
INDEX_MARKS = ("<!-- pages: written by `python -m bench.pages` from bench/records -->", "<!-- /pages -->")


def index_block() -> str:
    """results.md's index of the generated pages, each with its headline on each CPU kind recorded."""
    lines = [INDEX_MARKS[0], "", "| page | what | headline, per CPU kind recorded |", "|---|---|---|"]
    for record in demo_seeds.records():
        lines.append(f"| [demo-smollm2.md](demo-smollm2.md) | `make demo` over injection seeds | "
                     f"{record['machine']['slug']}, {record['commit']}: base+NKB 5-shot "
                     f"{demo_seeds.cell(record, 'base+NKB (5-shot)', 'em')}, 0-shot "
                     f"{demo_seeds.cell(record, 'base+NKB (0-shot)', 'em')}, base "
                     f"{demo_seeds.cell(record, 'base (5-shot)', 'em')} (EM, seed 0 [range over seeds]) |")
    for record in paper_t5.records():
        s = record["summary"]
        lines.append(f"| [paper-t5.md](paper-t5.md) | `nkb demo --arch t5`, the paper's Table 3 | "
                     f"{record['cpu']['slug']}, {record['commit']}: base+NKB {s[f'em_{paper_t5.MAIN}']['mean']:.1f} "
                     f"against the base's {s['em_base']['mean']:.1f} (mean EM over {len(record['seeds'])} seeds) |")
    for record in routes.RECORDS.all():
        rows = ", ".join(f"{name} {row['em']:.1f}" for name, row in sorted(record["rows"].items()))
        lines.append(f"| [routes.md](routes.md) | the routes beside the NKB on the demo | "
                     f"{record['machine']['slug']}: {rows} (5-shot EM) |")
    return "\n".join(lines + ["", INDEX_MARKS[1]])


def generated() -> dict[Path, str]:
    """Each generated file's text, from the records."""
    readme = README.read_text()
    readme = with_block(readme, demo_seeds.README_MARKS, demo_seeds.readme_block(demo_seeds.records()))
    readme = with_block(readme, paper_t5.README_MARKS, paper_t5.readme_block(paper_t5.records()))
    return {README: readme, RESULTS: with_block(RESULTS.read_text(), INDEX_MARKS, index_block()),
            demo_seeds.PAGE: demo_seeds.page(demo_seeds.records()),
            paper_t5.PAGE: paper_t5.page(paper_t5.records()), routes.PAGE: routes.page(routes.RECORDS.all())}


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
