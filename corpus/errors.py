"""One error type for bad input files, always naming the file and where in it the problem is."""

from __future__ import annotations

import os


class InputFileError(ValueError):
    """Bad or unreadable input: `path`, a location such as 'line 12' or 'byte 40960', and what is wrong."""

    def __init__(self, path: str | os.PathLike, where: str | None, problem: str):
        self.path, self.where, self.problem = str(path), where, problem
        super().__init__(f"{self.path}{', ' + where if where else ''}: {problem}")


def require_file(path: str | os.PathLike) -> None:
    """Fail early, and clearly, for a missing path, a directory, or an empty file."""
    if not os.path.exists(path):
        raise InputFileError(path, None, "no such file")
    if os.path.isdir(path):
        raise InputFileError(path, None, "is a directory, expected a file")
    if os.path.getsize(path) == 0:
        raise InputFileError(path, None, "file is empty")


class LuceneIndexError(RuntimeError):
    """An index directory that is missing, incomplete or unreadable."""
