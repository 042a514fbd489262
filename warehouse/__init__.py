"""All Parquet and DuckDB I/O: table schemas, atomic writes, views, run and metric records, read-only SQL."""

from warehouse.commit import ShardSet, StagedRun, reusable_run, run_stage
from warehouse.fingerprint import code_version, file_digest, fingerprint
from warehouse.parquet import ShardTarget
from warehouse.runs import RunRecord, StageResult, get_run, list_runs, run_metrics
from warehouse.schemas import NATIVE_TABLES, PARQUET_TABLES
from warehouse.sql import ReadOnlyError, query, row_counts
from warehouse.store import DamagedFileError, Warehouse, WarehouseError, resolve_home

__all__ = ["Warehouse", "WarehouseError", "resolve_home", "PARQUET_TABLES", "NATIVE_TABLES", "RunRecord",
           "ShardSet", "ShardTarget", "StagedRun", "StageResult", "reusable_run", "run_stage", "fingerprint", "file_digest",
           "code_version", "list_runs", "get_run", "run_metrics", "query", "row_counts", "ReadOnlyError",
           "DamagedFileError"]
