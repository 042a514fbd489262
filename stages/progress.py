"""Progress bars for long stage work, on stderr: redrawn in place on a terminal; when stderr is a file or a pipe (a
log), a line every 30 s of work that lasts longer than that, instead of one line of thousands of redraws. Off when
NKB_PROGRESS=0 (tests)."""

from __future__ import annotations

import os
import sys
from typing import Iterable, Iterator, TypeVar

from tqdm import tqdm

T = TypeVar("T")
LOG_INTERVAL_S = 30


class LogLines:
    """A stream for tqdm that writes each redraw as its own line (tqdm starts every redraw with a carriage return)."""

    def __init__(self, stream):
        self.stream, self.last = stream, None

    def write(self, text: str) -> None:
        text = text.replace("\r", "").strip()
        if text and text != self.last:  # closing redraws the last state once more
            self.stream.write(text + "\n")
            self.last = text

    def flush(self) -> None:
        self.stream.flush()


def progress(disable: bool = False, **kwargs) -> tqdm:
    disable = disable or os.environ.get("NKB_PROGRESS", "1") == "0"
    if sys.stderr.isatty():
        return tqdm(disable=disable, mininterval=0.5, **kwargs)
    # Work shorter than the interval prints nothing: the stage's own line says what it did.
    return tqdm(disable=disable, file=LogLines(sys.stderr), mininterval=LOG_INTERVAL_S, maxinterval=LOG_INTERVAL_S,
                delay=LOG_INTERVAL_S, ascii=True, **kwargs)


def counting(items: Iterable[T], bar: tqdm) -> Iterator[T]:
    """`items`, advancing `bar` by one for each."""
    for item in items:
        bar.update(1)
        yield item
