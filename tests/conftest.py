"""Shared fixtures. Tiers (docs/testing.md): pure functions on tiny inputs (tests/corpus, tests/warehouse,
tests/nkb_model), stages on a small sample world (tests/stages), flows under the Prefect test harness and against a
real Prefect server (tests/flows)."""

import bz2
import os
from pathlib import Path

import pytest

os.environ.setdefault("NKB_PROGRESS", "0")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

# The suite runs in pytest-xdist workers (`-n auto` in pyproject.toml), a test file to each. Every worker's torch
# would start a thread per core: on 2 cores two workers so took the fast tier 71 s, with the cores shared out 50 s
# (one worker: 73 s). Set before any test module imports torch; the CLI's and Prefect's subprocesses inherit it.
MAX_WORKERS = 4  # each worker holds its own torch, transformers and Prefect, and its module's models
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # usable here
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, CORES // _workers)))

WHOLLY_SLOW = "pytestmark = pytest.mark.slow"


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: one worker per core this process may use, at most MAX_WORKERS (xdist's own counts the
    machine's physical cores, whatever this process may use)."""
    return max(1, min(MAX_WORKERS, CORES))


def pytest_ignore_collect(collection_path: Path, config):
    """The fast tier (`-m "not slow"`) does not import the modules whose every test is slow (Prefect's harness,
    whole pipelines), only to deselect them all."""
    if config.getoption("markexpr", "") == "not slow" and collection_path.suffix == ".py" \
            and collection_path.name.startswith("test_"):
        return any(line.startswith(WHOLLY_SLOW) for line in collection_path.read_text().splitlines()) or None
    return None


def mediawiki_page(title: str, text: str, page_id: int, ns: int = 0, redirect: str | None = None) -> str:
    from xml.sax.saxutils import escape
    red = f'<redirect title="{escape(redirect)}" />' if redirect else ""
    return (f"<page><title>{escape(title)}</title><ns>{ns}</ns><id>{page_id}</id>{red}"
            f"<revision><id>{page_id + 1000}</id><text xml:space=\"preserve\">{escape(text)}</text></revision></page>\n")


def mediawiki_dump(pages: list[str]) -> str:
    return ('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" version="0.11">\n'
            "<siteinfo><sitename>T</sitename></siteinfo>\n" + "".join(pages) + "</mediawiki>\n")


@pytest.fixture
def write_bz2(tmp_path):
    def write(name: str, content: str) -> Path:
        path = tmp_path / name
        with bz2.open(path, "wt", encoding="utf-8") as fh:
            fh.write(content)
        return path
    return write


@pytest.fixture(scope="session")
def world_dir(tmp_path_factory):
    """A small sample world, generated once per session."""
    from corpus.sample_world import generate
    root = tmp_path_factory.mktemp("world")
    generate(root, seed=7, people=30, background_people=20)
    return root
