"""What identifies a stage's work: the code version, file digests, and the inputs fingerprint."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Iterable

_PACKAGE_ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def code_version() -> str:
    """The git commit of the code (with `-dirty` for uncommitted changes), else the package version."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=_PACKAGE_ROOT,
                             capture_output=True, text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=_PACKAGE_ROOT,
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        from importlib.metadata import PackageNotFoundError, version
        try:
            return "nkb-pipeline " + version("nkb-pipeline")
        except PackageNotFoundError:
            return "unknown"


def file_digest(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """sha256 of a file's bytes, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def footer_digest(path: str | os.PathLike) -> str:
    """sha256 of a Parquet file's footer (its metadata, length and closing magic): what page checksums leave
    uncovered, read in two small reads. A file too short to hold a footer is hashed whole."""
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size >= 12:
            fh.seek(size - 8)
            length = int.from_bytes(fh.read(4), "little") + 8
            fh.seek(size - min(length, size))
        else:
            fh.seek(0)
        return hashlib.sha256(fh.read()).hexdigest()


def fingerprint(stage: str, config: dict[str, Any], inputs: Iterable[str] = ()) -> str:
    """The identity of a stage's work: its name, its config, and digests of everything it reads."""
    payload = json.dumps({"stage": stage, "config": config, "inputs": list(inputs)}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]
