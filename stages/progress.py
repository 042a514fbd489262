"""Progress bars for long stage work, on stderr; off when NKB_PROGRESS=0 (tests, logs)."""

from __future__ import annotations

import os
from typing import Iterable, Iterator, TypeVar

from tqdm import tqdm

T = TypeVar("T")


def progress(**kwargs) -> tqdm:
    return tqdm(disable=os.environ.get("NKB_PROGRESS", "1") == "0", mininterval=0.5, **kwargs)


def counting(items: Iterable[T], bar: tqdm) -> Iterator[T]:
    """`items`, advancing `bar` by one for each."""
    for item in items:
        bar.update(1)
        yield item
