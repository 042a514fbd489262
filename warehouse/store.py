"""The warehouse directory: Parquet tables, the DuckDB file with views over them, and the write lock.

Layout of a warehouse home (default `./.nkb`, or `$NKB_HOME`):

    tables/<table>/<partition>.parquet   one file per partition (e.g. a corpus, a dataset split)
    tables/<table>/.staging/<run_id>/    files being written by a run that has not committed yet
    warehouse.duckdb                     views over the Parquet tables + native `runs` and `metrics`
    warehouse.lock                       flock: exclusive for writers, shared for readers
    views.home                           the home the views' absolute paths were made for
    files/                               other stage outputs (generated dumps, indexes, checkpoints)

DuckDB allows one read-write process at a time, so connections are short-lived and taken under the
lock; a reader waits for a writer's commit to finish instead of failing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from pathlib import Path
from typing import Iterable, Iterator

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from warehouse.parquet import LINEAGE_FINGERPRINT, LINEAGE_RUN_ID
from warehouse.schemas import DERIVED_VIEWS, NATIVE_TABLES, PARQUET_TABLES, empty_select

DEFAULT_HOME = ".nkb"
# Written so the plain `duckdb` CLI from PyPI (duckdb-cli 1.5.x) can open the file.
STORAGE_VERSION = "v1.5.0"
_PARTITION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=+-]*$")


class WarehouseError(Exception):
    """A problem with the warehouse itself (bad table name, bad partition key, locked database...)."""


def resolve_home(home: str | os.PathLike | None = None) -> Path:
    """`home` if given, else `$NKB_HOME`, else `./.nkb` — always absolute."""
    chosen = home or os.environ.get("NKB_HOME") or DEFAULT_HOME
    return Path(chosen).expanduser().resolve()


MAX_PARTITION_CHARS = 200  # file names stay under the usual 255-byte limit with suffixes and staging names


def check_partition(key: str) -> str:
    if len(key) > MAX_PARTITION_CHARS:
        raise WarehouseError(f"partition name {key[:40]!r}... is {len(key)} characters long; "
                             f"at most {MAX_PARTITION_CHARS} characters")
    if not _PARTITION_RE.match(key):
        raise WarehouseError(
            f"partition name {key!r} must start with a letter or digit and use only letters, digits, '.', '_', '=', '+', '-'"
        )
    return key


class Warehouse:
    """One warehouse home. Cheap to construct; opens DuckDB only for the duration of a call.

    `leader`: whether this process records runs and publishes their results. Every process of a data-parallel
    run opens the same warehouse; only the leader (rank 0) writes it, the others train alongside."""

    def __init__(self, home: str | os.PathLike | None = None, leader: bool = True):
        self.home = resolve_home(home)
        self.leader = leader
        self.tables_dir = self.home / "tables"
        self.files_dir = self.home / "files"
        self.db_path = self.home / "warehouse.duckdb"
        self.lock_path = self.home / "warehouse.lock"
        for d in (self.home, self.tables_dir, self.files_dir):
            d.mkdir(parents=True, exist_ok=True)
        for name in PARQUET_TABLES:
            (self.tables_dir / name).mkdir(exist_ok=True)
        self.views_marker = self.home / "views.home"
        if not self.db_path.exists() or not self._views_point_here():
            with self.write_connection():
                pass  # creates the file, the native tables and the views (again, for a moved or copied warehouse)

    def _views_point_here(self) -> bool:
        """DuckDB views hold absolute Parquet paths: a warehouse that was moved or copied needs them redone."""
        try:
            return self.views_marker.read_text() == str(self.home)
        except OSError:
            return False

    # ---- locking and connections -------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, exclusive: bool) -> Iterator[None]:
        with open(self.lock_path, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def write_connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-write connection under the exclusive lock; views are refreshed on the way out."""
        with self.lock(exclusive=True):
            con = duckdb.connect(":memory:")
            try:
                con.execute(f"ATTACH '{_sql_str(self.db_path)}' AS wh (STORAGE_VERSION '{STORAGE_VERSION}')")
                con.execute("USE wh")
                for ddl in NATIVE_TABLES.values():
                    con.execute(ddl)
                yield con
                self._refresh_views(con)
                con.execute("CHECKPOINT wh")
            finally:
                con.close()

    @contextlib.contextmanager
    def read_connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only connection under the shared lock; extensions are never installed or loaded."""
        with self.lock(exclusive=False):
            con = duckdb.connect(
                str(self.db_path),
                read_only=True,
                config={"autoinstall_known_extensions": False, "autoload_known_extensions": False},
            )
            try:
                yield con
            finally:
                con.close()

    def _refresh_views(self, con: duckdb.DuckDBPyConnection) -> None:
        for name, schema in PARQUET_TABLES.items():
            files = self.partition_files(name)
            if files:
                glob = _sql_str(self.tables_dir / name / "*.parquet")
                body = f"SELECT * FROM read_parquet('{glob}', union_by_name = true)"
            else:
                body = empty_select(schema)
            con.execute(f'CREATE OR REPLACE VIEW "{name}" AS {body}')
        for name, body in DERIVED_VIEWS.items():
            con.execute(f'CREATE OR REPLACE VIEW "{name}" AS {body}')
        if not self._views_point_here():
            self.views_marker.write_text(str(self.home))

    # ---- Parquet tables -------------------------------------------------------------------

    def schema(self, table: str) -> pa.Schema:
        try:
            return PARQUET_TABLES[table]
        except KeyError:
            raise WarehouseError(f"unknown table {table!r}; tables: {', '.join(PARQUET_TABLES)}") from None

    def partition_path(self, table: str, partition: str) -> Path:
        self.schema(table)
        return self.tables_dir / table / f"{check_partition(partition)}.parquet"

    def partition_files(self, table: str, partitions: Iterable[str] | None = None) -> list[Path]:
        """The table's partition files (only those named in `partitions`, when given)."""
        self.schema(table)
        files = sorted((self.tables_dir / table).glob("*.parquet"))
        if partitions is not None:
            wanted = set(partitions)
            files = [f for f in files if f.stem in wanted]
        return files

    def read(self, table: str, columns: list[str] | None = None, filter=None,
             partitions: Iterable[str] | None = None) -> pa.Table:
        """A Parquet table (all partitions, or those named) as Arrow, optionally projected and filtered."""
        schema = self.schema(table)
        files = self.partition_files(table, partitions)
        if not files:
            return schema.empty_table().select(columns) if columns else schema.empty_table()
        return ds.dataset(files, schema=schema, format="parquet").to_table(columns=columns, filter=filter)

    def scan(self, table: str, columns: list[str] | None = None, filter=None, batch_size: int = 10_000,
             partitions: Iterable[str] | None = None) -> Iterator[pa.RecordBatch]:
        """A Parquet table's rows as a stream of batches (memory does not grow with the table)."""
        files = self.partition_files(table, partitions)
        if files:
            dataset = ds.dataset(files, schema=self.schema(table), format="parquet")
            yield from dataset.to_batches(columns=columns, filter=filter, batch_size=batch_size)

    def rows_written_by(self, table: str, run_id: str) -> tuple[int, int]:
        """(files, rows) of the table that run `run_id` wrote and that are still there (read from each file's
        footer: a partition another run rewrote since carries that run's id)."""
        files = rows = 0
        for path in self.partition_files(table):
            meta = pq.read_metadata(path)
            if (meta.metadata or {}).get(LINEAGE_RUN_ID.encode()) == run_id.encode():
                files, rows = files + 1, rows + meta.num_rows
        return files, rows

    def lineage(self, table: str, prefix: str = "") -> list[tuple[str, str]]:
        """(partition, inputs fingerprint of the run that wrote it) for the table's partitions named
        `prefix*`: what a downstream stage fingerprints, instead of hashing the data itself."""
        out = []
        for path in self.partition_files(table):
            if path.stem.startswith(prefix):
                meta = pq.read_schema(path).metadata or {}
                out.append((path.stem, meta.get(LINEAGE_FINGERPRINT.encode(), b"?").decode()))
        return out

    # ---- queries ------------------------------------------------------------------------

    def row_counts(self) -> list[tuple[str, str, int]]:
        """(table, kind, rows) for every table: Parquet (through views), native, and derived views."""
        with self.read_connection() as con:
            out = []
            for name in PARQUET_TABLES:
                out.append((name, "parquet", con.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]))
            for name in NATIVE_TABLES:
                out.append((name, "native", con.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]))
            for name in DERIVED_VIEWS:
                out.append((name, "view", con.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]))
            return out


def _sql_str(value) -> str:
    """A value quoted for use inside a single-quoted SQL string literal."""
    return str(value).replace("'", "''")
