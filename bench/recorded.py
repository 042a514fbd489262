"""Recorded reproductions: a benchmark that reproduces a headline keeps one record per CPU kind, as JSON under
`bench/records/<name>/<kind>.json`, with the commit, the machine and the date; the pages under `docs/` and the
README's blocks are written from the records alone (`python -m bench.pages`), so that no figure there is typed."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
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
    import sys
    done = subprocess.run([sys.executable, "-m", "bench.pages"], cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def with_block(text: str, marks: tuple[str, str], block: str) -> str:
    """`text` with the part between `marks` (both included) replaced by `block`."""
    start, end = text.index(marks[0]), text.index(marks[1]) + len(marks[1])
    return text[:start] + block + text[end:]


def kind_title(kind: dict) -> str:
    """A CPU kind as a heading says it."""
    units = " and ".join(kind["bf16_units"]) if kind["bf16_units"] else "no bf16 units"
    return f"{kind['name']} (family {kind['family']}, model {kind['model']}, {units})"
