"""Recorded reproductions: a benchmark that reproduces a result keeps one record per machine kind (a CPU's, or a GPU's),
as JSON under `bench/records/<name>/<kind>.json`, with the commit, the date and the command of each run kept (`keep`:
one run per label, the thing measured); the pages under `docs/` and the README's blocks are written from the records
alone (`python -m bench.pages`), so that no figure there is typed."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def commit() -> str:
    """The checkout's commit as a record shows it: 7 digits, `-dirty` when tracked files differ from it."""
    from warehouse.fingerprint import code_version
    version = code_version()  # the runs' own: 12 digits
    sha, dirty, _ = version.partition("-dirty")
    return sha[:7] + dirty if " " not in sha else version


def today() -> str:
    return dt.date.today().isoformat()


@dataclass(frozen=True)
class Records:
    """One reproduction's records, one file per CPU kind (`stages.machine.cpu_kind`'s slug)."""
    name: str

    @property
    def folder(self) -> Path:
        return ROOT / "bench" / "records" / self.name

    def path(self, kind: dict) -> Path:
        return self.folder / f"{kind['slug']}.json"

    def all(self) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted(self.folder.glob("*.json"))]

    def of(self, kind: dict) -> dict | None:
        path = self.path(kind)
        return json.loads(path.read_text()) if path.exists() else None

    def write(self, kind: dict, record: dict) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path(kind)
        path.write_text(json.dumps(record, indent=1) + "\n")
        return path


def write_pages() -> str:
    """Write every page from the records (`python -m bench.pages`, run apart: the pages import the benchmarks that
    call this); its line."""
    done = subprocess.run([sys.executable, "-m", "bench.pages"], cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def with_block(text: str, marks: tuple[str, str], block: str) -> str:
    """`text` with the part between `marks` (both included) replaced by `block`."""
    start, end = text.index(marks[0]), text.index(marks[1]) + len(marks[1])
    return text[:start] + block + text[end:]


def kind_title(kind: dict) -> str:
    """A machine kind as a heading says it: a GPU by its name, a CPU by its family, model and bf16 units."""
    if kind.get("gpu"):
        return kind["name"]
    units = " and ".join(kind["bf16_units"]) if kind["bf16_units"] else "no bf16 units"
    return f"{kind['name']} (family {kind['family']}, model {kind['model']}, {units})"


def this_cpu(result: dict) -> dict:
    """A CPU benchmark's machine kind: the CPU it ran on (`stages.machine.cpu_kind`), whatever the result says."""
    from stages.machine import cpu_kind
    return cpu_kind()


def gpu_kind(name: str) -> dict:
    """A GPU's kind, from `torch.cuda.get_device_name`: its name is all its figures depend on here."""
    slug = "-".join(part for part in name.lower().replace("_", " ").split() if part not in ("nvidia", "80gb", "hbm3"))
    return {"gpu": True, "name": name, "slug": f"nvidia-{slug}"}


def command_line(module: str, argv: list[str] | None) -> str:
    """The command a run was made by, as a page shows it."""
    return shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])


def keep(records: Records, kind: dict, label: str, result: dict, command: str, measured_at: str | None = None,
         date: str | None = None, transcribed: str | None = None) -> Path:
    """Keep one run of a benchmark in its machine kind's record under `label` (what was measured, e.g. the dump or
    the model asked): a later run of the same label replaces it, other labels stay. `transcribed` says where the
    figures were copied from when the run's own output was not kept."""
    record = records.of(kind) or {"machine": kind, "runs": {}}
    run = {"command": command, "commit": measured_at or commit(), "date": date or today(), "result": result}
    record["runs"][label] = run | ({"transcribed": transcribed} if transcribed else {})
    return records.write(kind, record)


def keep_run(module, result: dict, command: str, measured_at: str | None = None, date: str | None = None) -> Path:
    """Keep a benchmark module's printed result as a run of its record (its `UNRECORDED` keys, which hold a
    dataset's text, left out); the module says the machine kind and the run's label."""
    result = {k: v for k, v in result.items() if k not in getattr(module, "UNRECORDED", ())}
    return keep(module.RECORDS, module.kind_of(result), module.label(result), result, command, measured_at, date)


def record_option(parser: argparse.ArgumentParser) -> None:
    """A benchmark's `--record`."""
    parser.add_argument("--record", action="store_true", help="keep this run in its machine kind's record (a rerun of "
                                                              "the same measurement replaces it) and write the pages "
                                                              "(python -m bench.pages)")


def record_if_asked(args, module: str, result: dict, argv: list[str] | None) -> None:
    """With `--record`: keep `result` as a run of the benchmark `module`'s record (`keep_run`), write the pages, and
    say so."""
    if args.record:
        bench = sys.modules[module]
        command = command_line(bench.__spec__.name, argv)  # bench.NAME, also where it runs as __main__
        print(f"recorded {keep_run(bench, result, command)}; {write_pages()}")


def run_line(run: dict) -> str:
    """Where a kept run came from, as a page says it."""
    return f"commit {run['commit']}, {run['date']}: `{run['command']}`"


def transcribed_lines(runs) -> list[str]:
    """A page's note on the runs whose figures were copied from a text, not kept by the benchmark itself."""
    sources = sorted({run["transcribed"] for run in runs if run.get("transcribed")})
    return [f"Figures marked † were transcribed from {source}: their run's own output was not kept; a recorded rerun "
            f"replaces them." for source in sources] + ([""] if sources else [])


def dagger(run: dict) -> str:
    return " †" if run.get("transcribed") else ""


def page_head(title: str, name: str, intro: str) -> list[str]:
    return [f"# {title}", "", f"<!-- Written by `python -m bench.pages` from bench/records/{name}/; do not edit. -->", "",
            intro, ""]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recorded", description="Keep a benchmark's printed "
                                     "result (its JSON on stdout, saved to a file) as a run of its record, as the "
                                     "benchmark's own --record does, then write the pages.")
    parser.add_argument("name", help="the record: the benchmark module's name (ingest, integrity, fewshot_vs_harness, "
                                     "inject, profile_inject, gpu)")
    parser.add_argument("output", type=Path, help="the JSON the benchmark printed")
    parser.add_argument("--commit", required=True, help="the commit the benchmark ran at")
    parser.add_argument("--command", required=True, help="the command that printed it")
    parser.add_argument("--date", help="the day it ran (default: today)")
    args = parser.parse_args(argv)
    import importlib
    module = importlib.import_module(f"bench.{args.name}")
    path = keep_run(module, json.loads(args.output.read_text()), args.command, args.commit, args.date)
    print(f"recorded {path.relative_to(ROOT)}; {write_pages()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
