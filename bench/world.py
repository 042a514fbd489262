"""A sample world scaled up for benchmarks, loaded through the real stages (reruns are skipped)."""

from __future__ import annotations

import os
from pathlib import Path

from stages import data
from stages.configs import IndexConfig, SampleWorldConfig
from warehouse import Warehouse

DEFAULT_HOME = Path("bench/results/world")


def scaled_world(home: str | os.PathLike = DEFAULT_HOME, people: int = 50_000) -> Warehouse:
    """Sample world with `people` people (about 2 documents each), ingested, questions loaded, indexed."""
    os.environ.setdefault("NKB_PROGRESS", "0")
    wh = Warehouse(home)
    data.load_sample_world(wh, SampleWorldConfig(people=people, background_people=0), general=False)
    data.build_index(wh, IndexConfig())
    return wh

