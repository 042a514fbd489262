"""A commit's journal: the renames a commit is about to make, written down before the first of them, so that a
process killed in the middle of a commit leaves the warehouse as it was before it, or as the commit made it.

A commit renames its staged files and folders into place, setting aside what they replace, then records the run
and its files in `warehouse.duckdb` in one transaction. Killed between the first rename and that transaction's end,
it would leave new files that no run registered beside a registry that still lists the old ones (set aside in a
staging folder the next run sweeps away). The next process to write the warehouse reads the journal first, under the
same exclusive lock: if the run's row is in `runs`, the commit happened and only the journal goes; if not, each
rename is undone. Undoing is idempotent, so a process killed while it undoes leaves a journal the next one finishes.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

FOLDER = ".commits"  # under the warehouse home: `<run_id>.<pid>.json`, one per commit in progress


@dataclass(frozen=True)
class Move:
    """One rename of a commit: `staged` (None: nothing new, the old file only goes) into `final`, whose old content
    (if any) goes to `aside` first."""
    staged: str | None
    final: str
    aside: str | None

    def undo(self) -> None:
        """Put `final` back as it was, from whatever point the commit reached."""
        staged, final, aside = (Path(p) if p else None for p in (self.staged, self.final, self.aside))
        final_there = os.path.lexists(final)
        if aside is not None and os.path.lexists(aside):
            if final_there and staged is not None and not os.path.lexists(staged):
                final.rename(staged)  # the new one back to where it was staged
            elif final_there:  # a state no commit leaves: keep what is there rather than lose it
                return
            aside.rename(final)
        elif aside is None and staged is not None and final_there and not os.path.lexists(staged):
            final.rename(staged)  # a new partition or folder, with nothing before it


def write_journal(home: Path, run_id: str, moves: Iterable[Move]) -> Path:
    """Write the journal of a commit about to make `moves`, durably, and return its path."""
    folder = home / FOLDER
    folder.mkdir(exist_ok=True)
    path = folder / f"{run_id}.{os.getpid()}.json"
    partial = path.with_suffix(".partial")
    with open(partial, "w") as fh:
        json.dump({"run_id": run_id, "moves": [asdict(m) for m in moves]}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    partial.rename(path)
    _sync_folder(folder)
    return path


def pending_commits(home: Path) -> list[Path]:
    """Journals of commits that did not finish (their process is gone; the caller holds the exclusive lock, so
    no live process is in the middle of one), oldest first."""
    folder = home / FOLDER
    if not folder.is_dir():
        return []
    mine = f".{os.getpid()}.json"
    return sorted((p for p in folder.glob("*.json") if not p.name.endswith(mine)), key=lambda p: p.stat().st_mtime)


def recover_commits(home: Path, committed: Callable[[str], bool]) -> list[str]:
    """Finish or undo each commit a killed process left (`committed(run_id)`: whether its run row is recorded);
    returns what was done, a line each."""
    done = []
    for path in pending_commits(home):
        try:
            entry = json.loads(path.read_text())
        except ValueError:  # cut before its rename: no move was made
            path.unlink()
            continue
        run_id = entry["run_id"]
        if committed(run_id):
            done.append(f"the commit of run {run_id} had finished; its journal is cleared")
        else:
            for move in reversed([Move(**m) for m in entry["moves"]]):
                move.undo()
            done.append(f"the commit of run {run_id} was cut short; the files it replaced are back")
        path.unlink()
        _sync_folder(path.parent)
    for partial in (home / FOLDER).glob("*.partial") if (home / FOLDER).is_dir() else []:
        partial.unlink()  # a journal never completed: its commit made no move
    return done


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

