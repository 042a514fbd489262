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


def fingerprint(stage: str, config: dict[str, Any], inputs: Iterable[str] = ()) -> str:
    """The identity of a stage's work: its name, its config, and digests of everything it reads."""
    payload = json.dumps({"stage": stage, "config": config, "inputs": list(inputs)}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]
