"""The warehouse directory: Parquet tables, the DuckDB file with views over them, and the write lock.

Layout of a warehouse home (default `./.nkb`, or `$NKB_HOME`):

    tables/<table>/<partition>.parquet   one file per partition (e.g. a corpus, a dataset split)
    tables/<table>/.staging/<run_id>/    files being written by a run that has not committed yet
    warehouse.duckdb                     views over the Parquet tables + native `runs`, `metrics` and `partitions`
    warehouse.lock                       flock: exclusive for writers, shared for readers
    views.home                           the home the views' absolute paths were made for
    files/                               other stage outputs (generated dumps, indexes, checkpoints)

DuckDB allows one read-write process at a time, so connections are short-lived and taken under the
lock; a reader waits for a writer's commit to finish instead of failing.

Every Parquet file a run commits is registered in `partitions` with its rows, size, SHA-256 and the digest of its
footer. Only registered files are read: a file no run wrote (copied in by hand) is reported and left out. A
registered file that is no longer what its run committed is damaged, and reading its table fails with one line
that names it and says how to rebuild it, while every other table keeps answering. A read checks each file's size
and footer digest before it starts (two small reads a file) and each page's checksum as it decodes it, so no
byte that changed since the commit is returned as data; a registered file that is gone fails its table the same
way. `nkb check` compares every file with its whole digest.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import sys
import time
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Iterable, Iterator

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from warehouse.journal import pending_commits, recover_commits
from warehouse.fingerprint import file_digest, footer_digest
from warehouse.parquet import CHECKED_PARQUET, LINEAGE_FINGERPRINT, LINEAGE_RUN_ID, PAGE_CHECKSUMS
from warehouse.schemas import DERIVED_VIEWS, NATIVE_MIGRATIONS, NATIVE_TABLES, PARQUET_TABLES
from warehouse.views import COMMITTED_MTIME_LAG, empty_select, failing_select, guarded_view, sql_literal

DEFAULT_HOME = ".nkb"
# Written so the plain `duckdb` CLI from PyPI (duckdb-cli 1.5.x) can open the file.
STORAGE_VERSION = "v1.5.0"
_PARTITION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=+-]*$")


class WarehouseError(Exception):
    """A problem with the warehouse itself (bad table name, bad partition key, locked database...)."""


class DamagedFileError(WarehouseError):
    """A table's Parquet file is not what the run that wrote it left there (changed, cut, gone)."""


# Ends every DamagedFileError's message: how a failed SQL read that carries one is recognised (`warehouse.sql`).
DAMAGED_HINT = "`nkb check` lists what is damaged and the command that rebuilds each file"


@dataclass(frozen=True)
class PartitionRecord:
    """What a run committed as one partition file (a row of the native `partitions` table)."""
    table: str
    partition: str
    run_id: str
    inputs_fingerprint: str
    rows: int
    bytes: int
    sha256: str
    footer_sha256: str | None = None  # None: the file's pages carry no checksums (written before they did)
    mtime: int | None = None  # its modification time in whole seconds (None: registered before it was recorded)
    damaged: str | None = None  # why `nkb check` found its bytes changed since; None: they are as committed

    @classmethod
    def of_file(cls, table: str, path: Path) -> "PartitionRecord":
        """The record of a finished file: its lineage (from the footer), rows, size, digests and time."""
        meta = pq.read_metadata(path)
        lineage = meta.metadata or {}
        checked = PAGE_CHECKSUMS.encode() in lineage
        stat = path.stat()
        return cls(table, path.stem, lineage.get(LINEAGE_RUN_ID.encode(), b"").decode(),
                   lineage.get(LINEAGE_FINGERPRINT.encode(), b"?").decode(), meta.num_rows, stat.st_size,
                   file_digest(path), footer_digest(path) if checked else None, int(stat.st_mtime))


_COLUMNS = ("table_name", "partition", "run_id", "inputs_fingerprint", "rows", "bytes", "sha256", "footer_sha256",
            "mtime", "damaged")


def stamp_committed(path: Path) -> None:
    """Set a file about to be committed to a modification time `COMMITTED_MTIME_LAG` whole seconds back, the time
    its record keeps: any later write then changes it, which the plain CLI's views check (`warehouse.views`)."""
    stat = path.stat()
    seconds = time.time_ns() // 1_000_000_000 - COMMITTED_MTIME_LAG
    os.utime(path, ns=(stat.st_atime_ns, seconds * 1_000_000_000))


_NO_EXTENSIONS = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
_REPORTED: set[str] = set()  # files already reported in this process (a warning once, not on every read)
_DIGESTS: dict[tuple, str] = {}  # (path, inode, size, mtime) → sha256 of files without page checksums, this process


def _report_once(message: str) -> None:
    if message not in _REPORTED:
        _REPORTED.add(message)
        print(f"warning: {message}", file=sys.stderr)


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
    run opens the same warehouse; only the leader (rank 0) writes it, the others train alongside.
    `create`: make the warehouse if it is not there (what stages need). Read commands pass False: a mistyped
    --home then says there is no warehouse instead of answering from a new empty one, and a warehouse on a
    read-only file system can still be read. A home whose `warehouse.duckdb` is gone while `tables/` still holds
    committed files is refused either way (a new registry would take them for files no run wrote), unless `adopt`:
    then it is made afresh and `adopt_files` registers them."""

    def __init__(self, home: str | os.PathLike | None = None, leader: bool = True, create: bool = True,
                 adopt: bool = False):
        self.home = resolve_home(home)
        self.leader = leader
        self.tables_dir = self.home / "tables"
        self.files_dir = self.home / "files"
        self.db_path = self.home / "warehouse.duckdb"
        self.lock_path = self.home / "warehouse.lock"
        self.views_marker = self.home / "views.home"
        self._writing: duckdb.DuckDBPyConnection | None = None  # the open write connection, while there is one
        self._cached_registry: tuple[tuple, dict] | None = None
        self._write_registry: dict | None = None  # the open write's own view of the registry, until it changes it
        self._lock_held: tuple | None = None  # (file, exclusive) while this object holds warehouse.lock
        self.adopted: list[PartitionRecord] = []  # what `adopt` registered
        self.refused: list[tuple[Path, str]] = []  # files adoption left out, and why
        if self.home.exists() and not self.home.is_dir():
            raise WarehouseError(f"{self.home} is a file, not a warehouse directory (see --home or $NKB_HOME)")
        if not self.db_path.exists() and not adopt and (left := self._files_on_disk()):
            raise WarehouseError(
                f"{self.db_path} is gone, but {self.tables_dir} still holds {len(left)} Parquet "
                f"file{'s' * (len(left) != 1)} that runs committed: `nkb --home {self.home} check --adopt` makes a "
                "new warehouse.duckdb and registers them as they are (the runs' records went with the file, so each "
                "stage runs once more), or move "
                f"{self.tables_dir} aside to start an empty warehouse")
        if not create and not adopt:
            if not self.db_path.exists():
                raise WarehouseError(f"no warehouse at {self.home} (no warehouse.duckdb there): check --home or "
                                     "$NKB_HOME; `nkb demo` or any stage run creates one")
            if self.writable and not self._views_point_here():
                self._refresh()
            return
        try:
            self.home.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WarehouseError(f"cannot create the warehouse {self.home}: {exc.strerror or exc}") from None
        if not self.writable:
            raise WarehouseError(f"the warehouse {self.home} cannot be written ({self._why_not_writable()}): reading "
                                 "it works (nkb tables, sql, runs, report, check); stages need a writable --home")
        for d in (self.tables_dir, self.files_dir, *(self.tables_dir / name for name in PARQUET_TABLES)):
            d.mkdir(exist_ok=True)
        if adopt:  # registered before the views are made, which would report each file as foreign
            self.adopted = self.adopt_files()
        elif not self.db_path.exists() or not self._views_point_here():
            self._refresh()  # creates the file, the native tables and the views (again, for a moved or copied one)

    def _files_on_disk(self) -> list[Path]:
        """Every table file under tables/ (committed ones; staging folders are not looked into)."""
        return [p for name in PARQUET_TABLES for p in sorted((self.tables_dir / name).glob("*.parquet"))]

    @property
    def writable(self) -> bool:
        return os.access(self.home, os.W_OK)

    def _why_not_writable(self) -> str:
        if os.statvfs(self.home).f_flag & os.ST_RDONLY:
            return "it is on a read-only file system"
        return "no write permission"

    def _refresh(self) -> None:
        with self.write_connection():
            pass

    def _views_point_here(self) -> bool:
        """DuckDB views hold absolute Parquet paths: a warehouse that was moved or copied needs them redone."""
        try:
            return self.views_marker.read_text() == str(self.home)
        except OSError:
            return False

    # ---- locking and connections -------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, exclusive: bool) -> Iterator[None]:
        """flock on warehouse.lock: exclusive for writers, shared for readers. Re-entrant within this object: a
        nested lock reuses the held one, raised to exclusive for its duration if need be."""
        if self._lock_held is not None:
            fh, held_exclusive = self._lock_held
            if exclusive and not held_exclusive:
                fcntl.flock(fh, fcntl.LOCK_EX)
                self._lock_held = (fh, True)
                try:
                    yield
                finally:
                    fcntl.flock(fh, fcntl.LOCK_SH)
                    self._lock_held = (fh, False)
            else:
                yield
            return
        try:
            fh = open(self.lock_path, "a+")
        except OSError:
            if exclusive:
                raise
            if not self.lock_path.exists():  # a read-only warehouse without a lock file: nobody can write it
                yield
                return
            fh = open(self.lock_path)  # read-only: a shared lock still waits for a writer elsewhere
        with fh:
            fcntl.flock(fh, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            self._lock_held = (fh, exclusive)
            try:
                yield
            finally:
                self._lock_held = None
                fcntl.flock(fh, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def write_connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-write connection under the exclusive lock, inside one transaction: what the block does and the
        views refreshed after it commit together, or not at all (the block raising, or the commit failing on a
        full disk). The checkpoint that follows may fail without losing anything: the committed work is in the
        write-ahead log, which the next reader checkpoints (`read_connection`)."""
        with self._attached() as con:
            for ddl in [*NATIVE_TABLES.values(), *NATIVE_MIGRATIONS]:
                con.execute(ddl)
            self._finish_cut_commits(con)
            con.execute("BEGIN TRANSACTION")
            self._writing, self._write_registry = con, None
            try:
                self._adopt_unregistered(con)
                yield con
                self._refresh_views(con)
                con.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(duckdb.Error):
                    con.execute("ROLLBACK")
                raise
            finally:
                self._writing = None
            with contextlib.suppress(duckdb.Error):
                con.execute("CHECKPOINT wh")
        if not self._views_point_here():
            with contextlib.suppress(OSError):  # committed already; the next write tries again
                self.views_marker.write_text(str(self.home))

    def recover(self) -> None:
        """Finish or undo the commits of processes killed in the middle of one (`warehouse.journal`), where the
        warehouse can be written; before anything reads its files or sweeps staging folders."""
        if self._writing is None and pending_commits(self.home) and self.writable:
            self._refresh()

    def _finish_cut_commits(self, con: duckdb.DuckDBPyConnection) -> None:
        def committed(run_id: str) -> bool:
            return con.execute("SELECT count(*) FROM runs WHERE run_id = ? AND status = 'success'",
                               [run_id]).fetchone()[0] > 0
        for line in recover_commits(self.home, committed):
            print(f"note: {line}", file=sys.stderr)

    @contextlib.contextmanager
    def read_connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only connection under the shared lock; extensions are never installed or loaded.

        A write-ahead log left by a commit whose checkpoint failed (a full disk) is folded into the file first:
        DuckDB's read-only replay of such a log can show an older state (issue 37), a read-write open does not.
        Where it cannot be folded in (the disk is still full), the reader gets a read-write open that replays it
        in memory, under the exclusive lock."""
        if self._log_pending() and self.writable and self._writing is None:
            try:
                with self._attached() as con:
                    con.execute("CHECKPOINT wh")
            except duckdb.Error:
                with self._attached() as con:
                    yield con
                return
        with self.lock(exclusive=False):
            con = duckdb.connect(str(self.db_path), read_only=True, config=_NO_EXTENSIONS)
            try:
                yield con
            finally:
                con.close()

    @contextlib.contextmanager
    def _attached(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """The database file attached read-write (replaying its log), under the exclusive lock."""
        with self.lock(exclusive=True):
            con = duckdb.connect(":memory:", config=_NO_EXTENSIONS)
            try:
                con.execute(f"ATTACH {sql_literal(self.db_path)} AS wh (STORAGE_VERSION '{STORAGE_VERSION}')")
                con.execute("USE wh")
                yield con
            finally:
                con.close()

    def _log_pending(self) -> bool:
        logs = [self.db_path.with_name(self.db_path.name + suffix) for suffix in (".wal", ".wal.checkpoint",
                                                                                   ".wal.recovery")]
        return any(p.exists() and (p.stat().st_size > 0 or p.suffix != ".wal") for p in logs)

    def _refresh_views(self, con: duckdb.DuckDBPyConnection) -> None:
        """A view per Parquet table over its registered files (a foreign file stays out of it) that checks, when
        read, what `warehouse.views` says; the view of a table with a damaged or missing file fails with the line
        that names it (the duckdb CLI shows it as it is). A file whose time alone moved (copied without its
        times, touched) is hashed whole: its new time is registered where its bytes are as committed."""
        self._register_times(con)
        registry = self.registry()
        for name, schema in PARQUET_TABLES.items():
            files, damaged = self.table_files(name)
            if damaged:
                body = failing_select(schema, str(damaged[0]))
            elif files:
                listed = [(f, registry[(name, f.stem)]) for f in files]
                body = guarded_view(schema, [(f, r.run_id, r.bytes, r.mtime) for f, r in listed], self.db_path)
            else:
                body = empty_select(schema)
            con.execute(f'CREATE OR REPLACE VIEW "{name}" AS {body}')
        for name, body in DERIVED_VIEWS.items():
            con.execute(f'CREATE OR REPLACE VIEW "{name}" AS {body}')

    def _register_times(self, con: duckdb.DuckDBPyConnection) -> None:
        """Register the present time of each intact file whose time differs from its record's (its bytes hashed
        whole, once per process for a given time); one whose bytes differ is registered as damaged."""
        changed = []
        for (table, stem), record in self.registry().items():
            path = self.tables_dir / table / f"{stem}.parquet"
            with contextlib.suppress(OSError):
                seconds = int(path.stat().st_mtime)
                if record.mtime is not None and seconds != record.mtime and not record.damaged:
                    changed.append((seconds, _why_damaged(path, record, whole=True), table, stem))
        if changed:
            con.executemany("UPDATE partitions SET mtime = ?, damaged = ? WHERE table_name = ? AND partition = ?",
                            changed)
            self._write_registry = None

    # ---- the partition registry --------------------------------------------------------------

    def registry(self) -> dict[tuple[str, str], PartitionRecord]:
        """(table, partition) → what the run that wrote it committed. Read once per change of the DuckDB file."""
        if self._writing is not None:  # inside a write: this transaction's view, read again after it changes
            if self._write_registry is None:
                self._write_registry = _registry_rows(self._writing)
            return self._write_registry
        self.recover()
        if self._cached_registry is None or self._cached_registry[0] != self._db_state():
            with self.read_connection() as con:
                try:
                    rows = _registry_rows(con)
                except duckdb.CatalogException:  # made before the registry: adopt its files (in memory if read-only)
                    rows = None if self.writable else self._adoptable(con)
            if rows is None:
                self._refresh()
                return self.registry()
            self._cached_registry = (self._db_state(), rows)  # after the read, which may fold a log in
        return self._cached_registry[1]

    def _db_state(self) -> tuple:
        return tuple((p.stat().st_mtime_ns, p.stat().st_size) if p.exists() else None
                     for p in (self.db_path, self.db_path.with_name(self.db_path.name + ".wal")))

    def record_partitions(self, con: duckdb.DuckDBPyConnection, records: Iterable[PartitionRecord]) -> None:
        """Register committed files (replacing what their partitions held), on the open write connection."""
        rows = [astuple(r) for r in records]
        self.forget_partitions(con, [(r[0], r[1]) for r in rows])
        if rows:
            con.executemany(f"INSERT INTO partitions ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})",
                            rows)
        self._write_registry = None

    def forget_partitions(self, con: duckdb.DuckDBPyConnection, keys: Iterable[tuple[str, str]]) -> None:
        keys = list(keys)
        if keys:
            con.executemany("DELETE FROM partitions WHERE table_name = ? AND partition = ?", keys)
        self._write_registry = None

    def _adopt_unregistered(self, con: duckdb.DuckDBPyConnection) -> None:
        """A warehouse made before the registry existed: register the files its successful runs wrote, once."""
        if con.execute("SELECT count(*) FROM partitions").fetchone()[0]:
            return
        self.record_partitions(con, self._adoptable(con).values())

    def _adoptable(self, con: duckdb.DuckDBPyConnection, any_run: bool = False,
                   registered=frozenset()) -> dict[tuple[str, str], PartitionRecord]:
        """The files on disk, less the `registered` (table, partition) keys, whose footer names a successful run of
        this warehouse (`any_run`: any run at all, its record lost), as records."""
        succeeded = {r[0] for r in con.execute("SELECT run_id FROM runs WHERE status = 'success'").fetchall()}
        adopted = {}
        for path in self._files_on_disk():
            table = path.parent.name
            if (table, path.stem) in registered:
                continue
            with contextlib.suppress(OSError, pa.ArrowException):
                record = PartitionRecord.of_file(table, path)
                if not (record.run_id in succeeded or any_run and record.run_id):
                    continue
                if why := _pages_fail(path):
                    self.refused.append((path, why))
                else:
                    adopted[(table, path.stem)] = record
        return adopted

    def adopt_files(self) -> list[PartitionRecord]:
        """Register the table files no registry row lists but whose footer names the run that wrote them (after
        `warehouse.duckdb` was lost, or files copied in on purpose), as they are now; returns their records."""
        with self.write_connection() as con:
            records = list(self._adoptable(con, any_run=True, registered=self.registry()).values())
            self.record_partitions(con, records)
        return records

    def check_files(self) -> list[tuple[Path, str, PartitionRecord | None]]:
        """Every table file that is not what its run committed: (path, what is wrong, its record or None for a
        file no run wrote). Reads every byte: `nkb check`. Where the warehouse can be written, the registry learns
        what it found: a damaged file's table then fails in the plain CLI too, even where the damage kept the
        file's size and time; a file found intact again (restored, or only touched) reads again."""
        registry = self.registry()
        problems, learnt = [], []
        for table in PARQUET_TABLES:
            on_disk = {p.stem: p for p in (self.tables_dir / table).glob("*.parquet")}
            for stem, path in sorted(on_disk.items()):
                record = registry.get((table, stem))
                why = "no run of this warehouse wrote it" if record is None else _why_damaged(path, record, whole=True)
                if why:
                    problems.append((path, why, record))
                if record is not None and (why or None) != record.damaged:
                    learnt.append((why, table, stem))
            problems += [(self.tables_dir / table / f"{stem}.parquet", "it is missing", record)
                         for (t, stem), record in sorted(registry.items()) if t == table and stem not in on_disk]
        if learnt and self.writable:
            with self.write_connection() as con:
                con.executemany("UPDATE partitions SET damaged = ? WHERE table_name = ? AND partition = ?", learnt)
                self._write_registry = None
        return problems

    def quarantine(self, problems: Iterable[tuple[Path, str, PartitionRecord | None]]) -> Path | None:
        """Move table files (`check_files`'s problems) into a new folder `quarantine/<time>/`, keeping their place
        under the home, and forget them: every table then reads without them, and a stage that needs them finds
        them missing and rebuilds them. Nothing is overwritten: each call has a folder of its own, whose
        `moved.json` lists what it moved and why (what `unrebuilt` reads). Under the exclusive lock throughout, so
        that of two repairs at once the second finds done what the first did. Returns the folder, or None where
        nothing was left to move."""
        with self.write_connection() as con:
            registry = self.registry()
            aside = _new_folder(self.home / "quarantine" / time.strftime("%Y%m%dT%H%M%S"))
            moved = []
            for path, why, record in problems:
                key = (path.parent.name, path.stem)
                if os.path.lexists(path):  # a link is moved as the link it is, dangling or not
                    target = aside / path.relative_to(self.home)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    written_by = _written_by(path)
                    path.rename(target)
                elif key in registry:  # registered and gone: only its registry row goes
                    written_by = None
                else:  # another repair has moved it
                    continue
                self.forget_partitions(con, [key])
                moved.append({"file": str(path.relative_to(self.home)), "why": why,
                              "run_id": record.run_id if record else None} |
                             ({"written_by": written_by} if written_by and record and written_by != record.run_id
                              else {}))
            if not moved:
                aside.rmdir()
                return None
            (aside / "moved.json").write_text(json.dumps(moved, indent=1))
        return aside

    def unrebuilt(self) -> list[dict]:
        """Committed files `quarantine` moved aside whose partitions no run has written again since: the data the
        tables now lack ({file, why, run_id, folder}), each as its latest move left it."""
        registry = self.registry()
        missing = {}
        for manifest in sorted((self.home / "quarantine").glob("*/moved.json"), key=_move_order):
            with contextlib.suppress(OSError, ValueError):
                for entry in json.loads(manifest.read_text()):
                    path = Path(entry["file"])
                    if entry.get("run_id") and (path.parent.name, path.stem) not in registry:
                        missing[entry["file"]] = entry | {"folder": str(manifest.parent)}
        return list(missing.values())

    def damaged(self, path: Path, why: str, record: PartitionRecord) -> DamagedFileError:
        state = "missing" if why.startswith("it is missing") else "damaged"
        return DamagedFileError(f"{path} is {state} ({why}; run {record.run_id} wrote it): {DAMAGED_HINT}")

    # ---- Parquet tables -------------------------------------------------------------------

    def schema(self, table: str) -> pa.Schema:
        try:
            return PARQUET_TABLES[table]
        except KeyError:
            raise WarehouseError(f"unknown table {table!r}; tables: {', '.join(PARQUET_TABLES)}") from None

    def partition_path(self, table: str, partition: str) -> Path:
        self.schema(table)
        return self.tables_dir / table / f"{check_partition(partition)}.parquet"

    def table_files(self, table: str,
                    partitions: Iterable[str] | None = None) -> tuple[list[Path], list[DamagedFileError]]:
        """(the table's intact committed files, one error for each registered file that is damaged or gone), only
        those of `partitions` when given. A file no run wrote is reported and left out. Cheap: each file's size and
        footer digest (the rest is checked page by page as it is read), or its whole digest for a file written
        before pages carried checksums (once per process)."""
        self.schema(table)
        wanted = set(partitions) if partitions is not None else None
        registry = {stem: record for (t, stem), record in self.registry().items()
                    if t == table and (wanted is None or stem in wanted)}
        files, damaged = [], []
        for path in sorted((self.tables_dir / table).glob("*.parquet")):
            if wanted is not None and path.stem not in wanted:
                continue
            record = registry.pop(path.stem, None)
            if record is None:
                _report_once(f"{path}: no run of this warehouse wrote this file, so it is not read "
                             "(`nkb check --repair` moves it aside)")
            elif why := _why_damaged(path, record) or record.damaged:
                damaged.append(self.damaged(path, why, record))
            else:
                files.append(path)
        damaged += [self.damaged(self.tables_dir / table / f"{stem}.parquet", "it is missing", record)
                    for stem, record in sorted(registry.items())]
        return files, damaged

    def partition_files(self, table: str, partitions: Iterable[str] | None = None, strict: bool = True) -> list[Path]:
        """The table's intact committed files (`table_files`). A damaged or missing one raises DamagedFileError
        (`strict`), or is reported and left out."""
        files, damaged = self.table_files(table, partitions)
        if damaged and strict:
            raise damaged[0]
        for error in damaged:
            _report_once(f"{error}; it is left out until then")
        return files

    def read_error(self, table: str, files: list[Path], exc: BaseException) -> BaseException:
        """What a failed read of `files` says: the damaged file it met (found by digest, or by reading its pages),
        else the error itself."""
        registry = self.registry()
        records = [(path, registry.get((table, path.stem))) for path in files]
        for path, record in records:
            if record is not None and file_digest(path) != record.sha256:
                return self.damaged(path, "its bytes differ from what was written", record)
        for path, record in records:  # as committed, yet unreadable: registered as it was found (adopted)
            if record is not None and (why := _pages_fail(path)):
                return self.damaged(path, why, record)
        return exc

    def read(self, table: str, columns: list[str] | None = None, filter=None,
             partitions: Iterable[str] | None = None) -> pa.Table:
        """A Parquet table (all partitions, or those named) as Arrow, optionally projected and filtered."""
        schema = self.schema(table)
        files = self.partition_files(table, partitions)
        if not files:
            return schema.empty_table().select(columns) if columns else schema.empty_table()
        try:
            return ds.dataset(files, schema=schema, format=CHECKED_PARQUET).to_table(columns=columns, filter=filter)
        except (OSError, pa.ArrowException) as exc:
            raise self.read_error(table, files, exc) from None

    def scan(self, table: str, columns: list[str] | None = None, filter=None, batch_size: int = 10_000,
             partitions: Iterable[str] | None = None) -> Iterator[pa.RecordBatch]:
        """A Parquet table's rows as a stream of batches (memory does not grow with the table)."""
        files = self.partition_files(table, partitions)
        if files:
            dataset = ds.dataset(files, schema=self.schema(table), format=CHECKED_PARQUET)
            try:
                yield from dataset.to_batches(columns=columns, filter=filter, batch_size=batch_size)
            except (OSError, pa.ArrowException) as exc:
                raise self.read_error(table, files, exc) from None

    def rows_written_by(self, table: str, run_id: str) -> tuple[int, int]:
        """(files, rows) of the table that run `run_id` committed and that are still there, intact as far as their
        size tells (a partition another run rewrote since is that run's)."""
        files = rows = 0
        for (t, stem), record in self.registry().items():
            path = self.tables_dir / t / f"{stem}.parquet"
            if t == table and record.run_id == run_id and path.exists() and path.stat().st_size == record.bytes:
                files, rows = files + 1, rows + record.rows
        return files, rows

    def lineage(self, table: str, prefix: str = "") -> list[tuple[str, str]]:
        """(partition, inputs fingerprint of the run that wrote it) for the table's partitions named
        `prefix*`: what a downstream stage fingerprints, instead of hashing the data itself."""
        registry = self.registry()
        return [(path.stem, registry[(table, path.stem)].inputs_fingerprint)
                for path in self.partition_files(table) if path.stem.startswith(prefix)]


def _registry_rows(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, str], PartitionRecord]:
    present = {r[0] for r in con.execute("SELECT column_name FROM duckdb_columns() WHERE table_name = 'partitions' "
                                         "AND database_name = current_database()").fetchall()}
    # read-only, made before the last columns were added (a writer adds them): those read as NULL
    columns = ", ".join(c if c in present else f"NULL AS {c}" for c in _COLUMNS)
    rows = con.execute(f"SELECT {columns} FROM partitions").fetchall()
    return {(r[0], r[1]): PartitionRecord(*r) for r in rows}


def _why_damaged(path: Path, record: PartitionRecord, whole: bool = False) -> str | None:
    """What is wrong with a registered file, or None: its size, then its footer's digest (`whole`, or a file whose
    pages carry no checksums: its whole digest)."""
    try:
        stat = path.stat()
    except OSError as exc:
        if exc.errno == errno.ENOENT:  # a link whose target is gone
            return "it is missing: a link to a file that is not there"
        return f"it cannot be read: {exc.strerror}"
    if stat.st_size != record.bytes:
        return "its size differs from what was written"
    try:
        if not whole and record.footer_sha256:
            same = footer_digest(path) == record.footer_sha256
        else:
            key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
            if key not in _DIGESTS or whole:
                _DIGESTS[key] = file_digest(path)
            same = _DIGESTS[key] == record.sha256
    except OSError as exc:
        return f"it cannot be read: {exc.strerror}"
    return None if same else "its bytes differ from what was written"


def _pages_fail(path: Path) -> str | None:
    """Why a file's pages cannot be read as written (a page whose checksum fails, a footer that does not parse), or
    None: every page read, each checksum verified. Reads the whole file, a row group at a time."""
    try:
        source = pq.ParquetFile(path, page_checksum_verification=True)
        for group in range(source.num_row_groups):
            source.read_row_group(group)
    except (OSError, pa.ArrowException) as exc:
        return f"its pages cannot be read as written ({str(exc).splitlines()[0][:120]})"
    return None


def _written_by(path: Path) -> str | None:
    """The run a table file's footer names as its writer, if it can be read."""
    with contextlib.suppress(OSError, pa.ArrowException):
        return (pq.read_metadata(path).metadata or {}).get(LINEAGE_RUN_ID.encode(), b"").decode() or None
    return None


def _move_order(manifest: Path) -> tuple[str, int]:
    """Quarantine folders in the order they were made: by time, then `-2`, `-3`, ... made within one second."""
    stamp, _, n = manifest.parent.name.partition("-")
    return stamp, int(n) if n.isdigit() else 1


def _new_folder(base: Path) -> Path:
    """`base`, or `base-2`, `base-3`, ... : the first that did not exist, made now (two callers never share one)."""
    for n in range(1, 10_000):
        folder = base if n == 1 else base.with_name(f"{base.name}-{n}")
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise WarehouseError(f"cannot make a new folder beside {base}")
