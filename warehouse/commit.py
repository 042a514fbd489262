"""Atomic stage runs: stage everything, then commit it at once, or leave the warehouse as it was.

A stage runs inside `run_stage`: if a successful run with the same stage and inputs fingerprint exists it
is skipped (unless forced); otherwise the stage body writes its outputs through a `StagedRun` into a staging
area, and only when the body returns are the staged files renamed into place and the run row, metrics and
views written, all under the warehouse's exclusive lock. Folders and files a stage publishes under `files/`
(models, indexes, the sample world, plots) are staged and swapped in at the same commit. A body that
raises (bad input, a crash, Ctrl-C) leaves every table and published file as it was; a failed run row
records the error. A process killed outright leaves only staging folders behind, which the next run sweeps.

In a data-parallel run only the leader process (`Warehouse.leader`) records the run and publishes; the
other processes train alongside it and write nothing (`FollowerRun`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from pathlib import Path
from typing import Any, Callable, Iterator

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from warehouse.fingerprint import code_version
from warehouse.parquet import PartitionWriter, ShardTarget
from warehouse.runs import RunRecord, StageResult, find_successful_run, insert_run, new_run_id, now
from warehouse.schemas import PARQUET_TABLES
from warehouse.journal import Move, write_journal
from warehouse.store import PartitionRecord, Warehouse, WarehouseError, check_partition, stamp_committed


class StagedRun:
    """The handle a stage body writes through. Nothing it writes is visible until commit."""

    def __init__(self, wh: Warehouse, run: RunRecord, writes: frozenset[str] | None = None,
                 model: str | None = None):
        self.wh = wh
        self.record = run  # the run's row: its id, config, fingerprint and outputs
        self.run_id = run.run_id
        self.writes = writes  # the tables the stage declared it writes (None: any)
        self.model = model  # the model the run builds or asks: its metrics' `model` unless one says otherwise
        self._staged: list[tuple[Path, Path]] = []  # (staging file, final path)
        self._metrics: list[tuple] = []
        self._staging_dirs: set[Path] = set()
        self._shard_sets: list[ShardSet] = []
        self._replaced: list[tuple[str, str]] = []  # (table, partition prefix) whose old files go at commit
        self._published: list[tuple[Path, Path]] = []  # (staged folder or file, final path)
        self._dropped: list[Path] = []  # folders removed once the run has committed

    @property
    def is_leader(self) -> bool:
        """False on the follower processes of a data-parallel run: they must not publish files."""
        return self.wh.leader

    # -- Parquet outputs --

    def _staging_path(self, final: Path) -> Path:
        """Where `final` is staged until commit: this run's staging folder beside it."""
        # The pid in the name lets a later run tell a live writer's files from a killed one's.
        staging_dir = final.parent / ".staging" / f"{self.run_id}.{os.getpid()}"
        staging_dir.mkdir(parents=True, exist_ok=True)
        self._staging_dirs.add(staging_dir)
        return staging_dir / final.name

    def _declared(self, table: str) -> None:
        if self.writes is not None and table not in self.writes:
            raise ValueError(f"{self.record.stage} writes {table}, which it does not declare (it writes "
                             f"{', '.join(sorted(self.writes)) or 'no table'})")

    def _staging_file(self, table: str, partition: str) -> tuple[Path, Path]:
        self._declared(table)
        final = self.wh.partition_path(table, partition)
        staged = self._staging_path(final)
        if any(f == final for _, f in self._staged):
            raise ValueError(f"run {self.run_id} writes {table}/{partition} twice")
        self._staged.append((staged, final))
        return staged, final

    @contextlib.contextmanager
    def writer(self, table: str, partition: str) -> Iterator[PartitionWriter]:
        """Stream record batches into one partition of `table` (memory stays flat)."""
        staged, _ = self._staging_file(table, partition)
        w = PartitionWriter(staged, self.wh.schema(table), self.run_id, self.record.inputs_fingerprint)
        try:
            yield w
        finally:
            w.close()
        self.count(table, w.rows)

    def output(self, name: str, value: Any) -> None:
        """Record a figure of what the run produced in its row's `outputs` (e.g. a model's parameter count)."""
        self.record.outputs[name] = value

    def count(self, table: str, rows: int) -> None:
        """Add `rows` written to `table` to the run row's outputs."""
        self.output(table, self.record.outputs.get(table, 0) + rows)

    def staged_path(self, table: str, partition: str) -> Path:
        """Where this run staged a partition it wrote (readable by other processes until commit)."""
        return next(s for s, f in self._staged if f == self.wh.partition_path(table, partition))

    def write(self, table: str, partition: str, data: pa.Table | dict[str, list]) -> int:
        """Write a whole partition at once; returns the number of rows."""
        with self.writer(table, partition) as w:
            w.write(data)
        return w.rows

    def part_target(self, table: str, name: str) -> ShardTarget:
        """A file of `table`'s rows that another process (a Dask worker) can write, for this run to copy into a
        partition (`PartitionWriter.append_file`). It lives in this run's staging folder and goes with it: never
        committed itself."""
        self._declared(table)
        path = self._staging_path(self.wh.tables_dir / table / f"{check_partition(name)}.part.parquet")
        return ShardTarget(path=str(path), table=table, run_id=self.run_id,
                           inputs_fingerprint=self.record.inputs_fingerprint)

    def replace_partitions(self, table: str, prefix: str) -> None:
        """At commit, remove the table's existing partitions named `prefix*` that this run did not write."""
        check_partition(prefix)
        self._replaced.append((table, prefix))

    def shards(self, table: str, prefix: str) -> "ShardSet":
        """Numbered partitions `prefix-00000`, ... that survive a crash of this run (see ShardSet)."""
        self._declared(table)
        shard_set = ShardSet(self, table, prefix)
        self._shard_sets.append(shard_set)
        self.replace_partitions(table, prefix + "-")
        return shard_set

    def first_duplicate(self, table: str, partition: str, column: str):
        """A value of `column` that occurs twice in a staged partition, or None (checked out of core)."""
        staged = self.staged_path(table, partition)
        con = duckdb.connect(":memory:")
        try:
            row = con.execute(f'SELECT "{column}" FROM read_parquet(?) GROUP BY 1 HAVING count(*) > 1 LIMIT 1',
                              [str(staged)]).fetchone()
        finally:
            con.close()
        return row[0] if row else None

    # -- folders and files under files/ --

    def publish_folder(self, final: Path, fill: Callable[[Path], Any], drop: Path | None = None) -> Any:
        """`fill` writes into an empty staging folder, which replaces `final` when the run commits; returns
        what `fill` returns. `drop` (e.g. the training checkpoint the result supersedes) goes after the commit;
        if the run fails, `final` and `drop` stay as they were."""
        return self._publish(final, fill, drop, folder=True)

    def publish_file(self, final: Path, write: Callable[[Path], Any]) -> Any:
        """`write` writes a file at the path it is given, which replaces `final` when the run commits."""
        return self._publish(final, write, None, folder=False)

    def _publish(self, final: Path, fill: Callable[[Path], Any], drop: Path | None, folder: bool) -> Any:
        staged = self._staging_path(final)
        if any(f == final for _, f in self._published):
            raise ValueError(f"run {self.run_id} publishes {final} twice")
        if folder:
            staged.mkdir()
        value = fill(staged)
        self._published.append((staged, final))
        if drop is not None:
            self._dropped.append(drop)
        return value

    def scratch(self, beside: Path) -> Path:
        """An empty folder for this run's temporary files, on the same disk as `beside`. It goes when the run
        ends, however it ends; a killed run's is swept by the next run like its staged outputs."""
        path = self._staging_path(beside.with_name(beside.name + ".scratch"))
        path.mkdir()
        return path

    # -- metrics --

    def metric(self, metric: str, value: float, dataset: str | None = None,
               split: str | None = None, step: int | None = None, model: str | None = None) -> None:
        self._metrics.append((self.run_id, dataset, split, metric, float(value), step, model or self.model))

    # -- commit / abort --

    def commit(self) -> None:
        """Swap every staged file and folder in and record the run, all at once. The renames are written to a
        journal first (`warehouse.journal`): if the database commit fails (a full disk), they are undone here and
        the error raised; if the process is killed before it ends, the next writer undoes them. Either way a table
        never shows files that no committed run wrote, and loses none that one did."""
        for shard_set in self._shard_sets:
            self._staged += shard_set.files()
        for staged, _ in self._staged:
            stamp_committed(staged)
        records = [PartitionRecord.of_file(final.parent.name, staged) for staged, final in self._staged]
        moves, written_down = [], None
        try:
            with self.wh.write_connection() as con:
                written = {(r.table, r.partition) for r in records}
                removed = [(t, stem) for t, stem in self.wh.registry() for table, prefix in self._replaced
                           if t == table and stem.startswith(prefix) and (t, stem) not in written]
                self._refuse_overtaken(con, [*written, *removed])
                moves = self._moves(removed)
                written_down = write_journal(self.wh.home, self.run_id, moves)
                _on_step("journal written")
                for move in moves:
                    _rename(move)
                self.wh.forget_partitions(con, removed)
                self.wh.record_partitions(con, records)
                if self._metrics:
                    con.executemany("INSERT INTO metrics (run_id, dataset, split, metric, value, step, model) "
                                    "VALUES (?, ?, ?, ?, ?, ?, ?)", self._metrics)
                self.record.status = "success"
                self.record.finished_at = now()
                insert_run(con, self.record, self.wh.home)
                _on_step("run recorded")
            _on_step("committed")
        except BaseException:
            if written_down is not None:
                for move in reversed(moves):
                    with contextlib.suppress(OSError):
                        move.undo()
                written_down.unlink(missing_ok=True)
            self.record.status = "running"
            raise
        written_down.unlink()
        _on_step("journal cleared")
        self._cleanup()
        for folder in self._dropped:
            shutil.rmtree(folder, ignore_errors=True)
        for shard_set in self._shard_sets:
            shutil.rmtree(shard_set.directory, ignore_errors=True)
        _resume_marker(self.wh, self.record).unlink(missing_ok=True)

    def _refuse_overtaken(self, con: duckdb.DuckDBPyConnection, partitions: list[tuple[str, str]]) -> None:
        """Refuse to replace a partition another run committed after this one started: two runs writing the same
        partition at once (two ingests of one corpus) would otherwise leave whichever committed last, and the
        other's rows would vanish without a word."""
        registry = self.wh.registry()
        others = {registry[key].run_id: key for key in partitions if key in registry
                  and registry[key].run_id != self.run_id}
        if not others:
            return
        later = con.execute("SELECT run_id, stage, finished_at FROM runs WHERE run_id IN (SELECT unnest(?)) AND "
                            "status = 'success' AND finished_at > ? ORDER BY finished_at",
                            [list(others), self.record.started_at]).fetchall()
        if later:
            run_id, stage, finished = later[0]
            table, partition = others[run_id]
            raise WarehouseError(
                f"{table}/{partition} was committed by run {run_id} ({stage}) at {finished:%H:%M:%S}, after this run "
                f"started at {self.record.started_at:%H:%M:%S}: two runs wrote it at once, and this one's rows would "
                "replace those unseen, so they are not committed. The other run's rows stand; rerun this stage to "
                "make its own the table's")

    def _moves(self, removed: list[tuple[str, str]]) -> list[Move]:
        """The renames of this commit: each staged file or folder into place, what it replaces set aside into this
        run's staging area (gone with it at cleanup), and the partitions it removes set aside."""
        moves = []
        for staged, final in [*self._staged, *self._published]:
            aside = self._aside(final) if os.path.lexists(final) else None
            moves.append(Move(str(staged), str(final), aside))
        for table, stem in removed:
            old = self.wh.tables_dir / table / f"{stem}.parquet"
            if os.path.lexists(old):
                moves.append(Move(None, str(old), self._aside(old)))
        return moves

    def _aside(self, path: Path) -> str:
        return str(self._staging_path(path.with_name(path.name + ".replaced")))

    def abort(self, error: BaseException) -> None:
        """Drop what this run staged — except finished shards, which a rerun with the same inputs resumes from —
        and record the failure if the warehouse can still be written (not on a full disk: the error that stopped
        the run is what the user needs to see)."""
        self._cleanup()
        self.record.status = "failed"
        self.record.finished_at = now()
        self.record.error = f"{type(error).__name__}: {error}"
        self.record.outputs = {}
        with contextlib.suppress(duckdb.Error, OSError):
            with self.wh.write_connection() as con:
                insert_run(con, self.record, self.wh.home)

    def _cleanup(self) -> None:
        for d in self._staging_dirs:
            shutil.rmtree(d, ignore_errors=True)


class FollowerRun(StagedRun):
    """What a stage body gets on a follower process of a data-parallel run: it trains alongside the leader
    (which records the run and publishes the results); what it writes is dropped and no run row is recorded."""

    def commit(self) -> None:
        self._cleanup()

    def abort(self, error: BaseException) -> None:
        self._cleanup()


class ShardSet:
    """Resumable, sharded output of one run.

    Finished shards wait in `tables/<table>/.staging/resume-<run_id>/`. If the run dies, a rerun of the same
    stage with the same inputs fingerprint and code version gets the same run id back (see `run_stage`), finds
    those shards done, and only writes the rest; nothing is visible in the table until commit."""

    def __init__(self, run: StagedRun, table: str, prefix: str):
        self.run, self.table, self.prefix = run, table, check_partition(prefix)
        self.directory = run.wh.tables_dir / table / ".staging" / f"resume-{run.run_id}"
        self.directory.mkdir(parents=True, exist_ok=True)
        for tmp in self.directory.glob("*.tmp"):
            tmp.unlink()  # a shard that was being written when the run died
        # Shards an interrupted attempt finished are this run's output too.
        self.count(sum(pq.read_metadata(p).num_rows for p in self.directory.glob(f"{self.prefix}-*.parquet")))

    def name(self, index: int) -> str:
        return f"{self.prefix}-{index:05d}"

    def is_done(self, index: int) -> bool:
        return (self.directory / f"{self.name(index)}.parquet").exists()

    def done_count(self) -> int:
        return len(list(self.directory.glob(f"{self.prefix}-*.parquet")))

    def target(self, index: int) -> ShardTarget:
        """Where shard `index` goes, as plain values: another process (a Dask worker) can write it."""
        return ShardTarget(path=str(self.directory / f"{self.name(index)}.parquet"), table=self.table,
                           run_id=self.run.run_id, inputs_fingerprint=self.run.record.inputs_fingerprint)

    def write(self, index: int, data: pa.Table | dict[str, list]) -> int:
        rows = self.target(index).write(data)
        self.count(rows)
        return rows

    def count(self, rows: int) -> None:
        """Add rows written through a `target` elsewhere to the run's outputs."""
        self.run.count(self.table, rows)

    def files(self) -> list[tuple[Path, Path]]:
        """(staged, final) for every finished shard."""
        return [(p, self.run.wh.partition_path(self.table, p.stem)) for p in sorted(self.directory.glob("*.parquet"))]


# Called with the name of each step of a commit as it is passed: a test kills its process there (`kill -9` at every
# point of a commit, tests/warehouse/test_commit_kill.py).
_on_step: Callable[[str], None] = lambda step: None


def _rename(move: Move) -> None:
    """Make one move of a commit: what is at `final` set aside, then the staged file or folder into its place."""
    final = Path(move.final)
    if move.aside is not None:
        final.rename(move.aside)
        _on_step(f"set aside {final.name}")
    if move.staged is not None:
        Path(move.staged).rename(final)
        _on_step(f"renamed {final.name}")


def run_stage(wh: Warehouse, stage: str, config: dict[str, Any], inputs_fingerprint: str,
              body: Callable[[StagedRun], Any], force: bool = False, device: str | None = None,
              still_valid: Callable[[RunRecord], bool] | None = None, resumable: bool = False,
              writes: frozenset[str] | None = None, model: str | None = None) -> StageResult:
    """Run `body` as one atomic stage run, or skip it if the same inputs already succeeded.

    `still_valid(previous_run)` can veto a skip, e.g. when the files a run produced were deleted.
    `resumable`: an interrupted run's finished shards (`StagedRun.shards`) are picked up by the next
    run of the same stage, inputs and code version, which continues under the interrupted run's id; under other
    code they are written again (the run's output `not_resumed` says whose were dropped). `writes`: the tables the
    stage declared; writing another fails the run. `model`: the model the run builds or asks, named in its metrics.
    """
    previous = None if force else reusable_run(wh, stage, inputs_fingerprint, still_valid)
    if previous is not None:
        return StageResult(run=previous, skipped=True)
    run = RunRecord(run_id=new_run_id(stage), stage=stage, status="running", inputs_fingerprint=inputs_fingerprint,
                    config=config, code_version=code_version(), started_at=now(), host=socket.gethostname(),
                    device=device)
    if not wh.leader:
        return _run_as_follower(wh, run, body)
    _sweep_stale_staging(wh)
    not_resumed = None
    if resumable:
        marker = _resume_marker(wh, run)
        interrupted, written_by = _marked(marker)
        if interrupted and written_by == run.code_version:
            run.run_id = interrupted
        else:
            if interrupted:  # its shards would enter this run's tables under this code's version
                not_resumed = f"the shards of {interrupted}, written by code {written_by or 'unknown'}"
            _drop_other_resumes(wh, stage)
            marker.write_text(f"{run.run_id}\n{run.code_version}")
    staged = StagedRun(wh, run, writes, model)
    if not_resumed:
        staged.output("not_resumed", not_resumed)
    try:
        value = body(staged)
        staged.commit()
    except BaseException as exc:
        staged.abort(exc)
        raise
    return StageResult(run=run, skipped=False, value=value)


def reusable_run(wh: Warehouse, stage: str, inputs_fingerprint: str,
                 still_valid: Callable[[RunRecord], bool] | None = None) -> RunRecord | None:
    """The earlier run a run of `stage` with these inputs is skipped for: one that succeeded on the same inputs and
    whose rows the tables still hold (and that `still_valid` does not veto); None when the run must run."""
    previous = find_successful_run(wh, stage, inputs_fingerprint)
    if previous is not None and outputs_intact(wh, previous) and (still_valid is None or still_valid(previous)):
        return previous
    return None


def outputs_intact(wh: Warehouse, run: RunRecord) -> bool:
    """Whether the tables still hold every row `run` wrote. A skip means "what this run would write is what the
    tables hold now": not so when another run has rewritten one of its partitions since, or it was deleted."""
    for table, rows in run.outputs.items():
        if table in PARQUET_TABLES:
            files, found = wh.rows_written_by(table, run.run_id)
            if not files or found != rows:
                return False
    return True


def _run_as_follower(wh: Warehouse, run: RunRecord, body: Callable[[StagedRun], Any]) -> StageResult:
    run.run_id += f"-follower{os.getpid()}"  # its staging folders never collide with the leader's
    staged = FollowerRun(wh, run)
    try:
        value = body(staged)
    finally:
        staged.commit()
    return StageResult(run=run, skipped=False, value=value)


def _resume_marker(wh: Warehouse, run: RunRecord) -> Path:
    return wh.tables_dir / f".resume-{run.stage}-{run.inputs_fingerprint}"


def _marked(marker: Path) -> tuple[str | None, str | None]:
    """(run id, code version) of the interrupted run a resume marker names; (None, None) without one."""
    if not marker.exists():
        return None, None
    run_id, _, version = marker.read_text().partition("\n")
    return run_id.strip(), version.strip() or None


def _drop_other_resumes(wh: Warehouse, stage: str) -> None:
    """Shards left by an interrupted run whose inputs or code have since changed can never be resumed."""
    for marker in wh.tables_dir.glob(f".resume-{stage}-*"):
        run_id, _ = _marked(marker)
        for d in wh.tables_dir.glob(f"*/.staging/resume-{run_id}"):
            shutil.rmtree(d, ignore_errors=True)
        marker.unlink(missing_ok=True)


def _sweep_stale_staging(wh: Warehouse) -> None:
    """Remove staging folders of runs that were killed before they could clean up.

    A staging folder whose writer process is still alive is left alone, and so is what a commit that was cut short
    set aside, until its journal has been read (`Warehouse.recover`)."""
    wh.recover()
    parents = [*wh.tables_dir.iterdir(), wh.files_dir, *wh.files_dir.iterdir()]
    for stale in (p / ".staging" for p in parents):
        if stale.is_dir():
            with contextlib.suppress(OSError):
                for d in stale.iterdir():
                    if not d.name.startswith("resume-") and _staging_owner_dead(d):
                        shutil.rmtree(d, ignore_errors=True)


def _staging_owner_dead(staging_dir: Path) -> bool:
    """Staging dirs are named `<run_id>.<pid>`; the run is gone when that process is."""
    try:
        pid = int(staging_dir.name.rsplit(".", 1)[1])
    except (IndexError, ValueError):
        return True
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
