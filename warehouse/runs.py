"""Run records: what every stage run leaves in the native `runs` and `metrics` tables, and queries over them."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

from warehouse.store import Warehouse


@dataclass
class RunRecord:
    run_id: str
    stage: str
    status: str
    inputs_fingerprint: str
    config: dict[str, Any]
    code_version: str
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    host: str | None = None
    device: str | None = None
    checkpoint: str | None = None
    outputs: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def seconds(self) -> float | None:
        if self.started_at and self.finished_at:
            return (self.finished_at - self.started_at).total_seconds()
        return None


@dataclass
class StageResult:
    """What a stage returns: the run that did the work, or the earlier one it was skipped for."""
    run: RunRecord
    skipped: bool
    value: Any = None


def now() -> dt.datetime:
    return dt.datetime.now()


def new_run_id(stage: str) -> str:
    return f"{stage}-{now().strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"


def find_successful_run(wh: Warehouse, stage: str, inputs_fingerprint: str) -> RunRecord | None:
    rows = _select_runs(wh, "WHERE stage = ? AND inputs_fingerprint = ? AND status = 'success' "
                            "ORDER BY finished_at DESC LIMIT 1", [stage, inputs_fingerprint])
    return rows[0] if rows else None


def list_runs(wh: Warehouse, stage: str | None = None, limit: int | None = None) -> list[RunRecord]:
    """Runs, newest first (optionally of one stage, at most `limit`)."""
    where, params = ("WHERE stage = ?", [stage]) if stage else ("", [])
    tail = f" LIMIT {int(limit)}" if limit else ""
    return _select_runs(wh, f"{where} ORDER BY started_at DESC{tail}", params)


def get_run(wh: Warehouse, run_id: str) -> RunRecord | None:
    rows = _select_runs(wh, "WHERE run_id = ?", [run_id])
    return rows[0] if rows else None


def run_metrics(wh: Warehouse, run_id: str, metric: str | None = None) -> list[dict]:
    """The metrics rows of one run (optionally of one metric), ordered by step."""
    sql = "SELECT dataset, split, metric, value, step FROM metrics WHERE run_id = ?"
    params = [run_id]
    if metric:
        sql += " AND metric = ?"
        params.append(metric)
    with wh.read_connection() as con:
        rows = con.execute(sql + " ORDER BY step NULLS FIRST", params).fetchall()
    return [dict(zip(("dataset", "split", "metric", "value", "step"), r)) for r in rows]


_RUN_COLUMNS = ["run_id", "stage", "config", "code_version", "inputs_fingerprint", "status", "started_at",
                "finished_at", "host", "device", "checkpoint", "outputs", "error"]


def _select_runs(wh: Warehouse, tail: str, params: list) -> list[RunRecord]:
    with wh.read_connection() as con:
        rows = con.execute(f"SELECT {', '.join(_RUN_COLUMNS)} FROM runs {tail}", params).fetchall()
    out = []
    for row in rows:
        rec = dict(zip(_RUN_COLUMNS, row))
        rec["config"] = json.loads(rec["config"]) if rec["config"] else {}
        rec["outputs"] = json.loads(rec["outputs"]) if rec["outputs"] else {}
        if rec["checkpoint"]:  # stored relative to the warehouse (`insert_run`), so that a copy finds its own
            rec["checkpoint"] = str(wh.home / rec["checkpoint"])
        out.append(RunRecord(**rec))
    return out


def insert_run(con, run: RunRecord, home: Path) -> None:
    """Write a run row on an open write connection; a resumed run replaces the failed attempt it continues.
    A checkpoint inside the warehouse `home` is stored relative to it: a moved or copied warehouse reads its own."""
    checkpoint = run.checkpoint
    if checkpoint and Path(checkpoint).is_relative_to(home):
        checkpoint = str(Path(checkpoint).relative_to(home))
    con.execute(
        f"INSERT OR REPLACE INTO runs ({', '.join(_RUN_COLUMNS)}) VALUES ({', '.join('?' * len(_RUN_COLUMNS))})",
        [run.run_id, run.stage, json.dumps(run.config, sort_keys=True, default=str), run.code_version,
         run.inputs_fingerprint, run.status, run.started_at, run.finished_at, run.host, run.device,
         checkpoint, json.dumps(run.outputs, sort_keys=True), run.error],
    )
