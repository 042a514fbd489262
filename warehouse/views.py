"""The SQL of the views `warehouse.duckdb` holds for the plain DuckDB CLI, and of a table that fails when read.

`nkb`'s own reads verify every file they read (its size and footer digest before, each page's checksum as it is
decoded: `Warehouse.table_files`). The plain CLI reads the views in `warehouse.duckdb`, and DuckDB verifies no page
checksum, so each view checks, every time it is read, what SQL can check without reading the data:
- that it is read from the database file it was made for: a copied warehouse's views would name the original's
  files until an `nkb` command points them at the copy's;
- that each file is there with the size and modification time its run committed. A commit sets that time a second
  back (`COMMITTED_MTIME_LAG`), so any later write gives the file another time, even within the same second.
A check that fails raises one line that names the file. What these checks cannot see is a change that keeps a file's
size and time (a disk flipping a bit under it): `nkb sql`'s page checksums and `nkb check`'s digests see that.

A check, or a damaged table, fails however the view is filtered: each column of the failing SELECT is computed from
`error()`, so no filter can be folded to false without calling it (a `WHERE error(...)` beside constant NULL
columns was dropped unread under `WHERE corpus = 'k2'`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pyarrow as pa

from warehouse.schemas import duckdb_type

# A committed file's modification time is set this many seconds before its commit, in whole seconds (what DuckDB's
# read_blob reports), so that a write after the commit always changes it.
COMMITTED_MTIME_LAG = 1


def sql_literal(value) -> str:
    """`value` as a single-quoted SQL string literal."""
    return "'" + str(value).replace("'", "''") + "'"


def _columns_from(schema: pa.Schema, value: str) -> str:
    return ", ".join(f'CAST({value} AS {duckdb_type(f.type)}) AS "{f.name}"' for f in schema)


def empty_select(schema: pa.Schema) -> str:
    """A typed, row-less SELECT: a table with no Parquet files yet still has its columns."""
    return f"SELECT {_columns_from(schema, 'NULL')} WHERE false"


def failing_select(schema: pa.Schema, message: str) -> str:
    """A typed SELECT that fails with `message` whenever a row of it is asked for, filtered or not; DESCRIBE still
    shows its columns."""
    return f"SELECT {_columns_from(schema, 'e')} FROM (SELECT error({sql_literal(message)}) AS e) WHERE e IS NULL"


def _raising(problem: str) -> str:
    """NULL, or an error with the text `problem` (a SQL expression) computes where that is not NULL."""
    return f"SELECT CASE WHEN p IS NULL THEN NULL ELSE error(p) END FROM (SELECT ({problem}) AS p)"


def _guard(schema: pa.Schema, problem: str) -> str:
    """A typed SELECT of no rows that fails where `problem` computes a text."""
    return f"SELECT {_columns_from(schema, 'e')} FROM ({_raising(problem)}) AS g(e) WHERE e IS NOT NULL"


_MOVED_FIX = (": a copy or a move. `nkb --home DIR tables` (any nkb command) points a copy's views at its own files; "
              "or open the original")
_CHANGED = " is damaged or missing: its size or modification time is not what run "
_CHANGED_FIX = " committed (`nkb check` compares its bytes, lists what is damaged and the command that rebuilds each file)"


def guarded_view(schema: pa.Schema, files: Iterable[tuple[Path, str, int, int | None]], db_path: Path) -> str:
    """The view of a table's committed `files` ((path, run id, bytes, modification time in seconds or None where
    it was not recorded)) for the plain CLI: their rows, after the checks this module's docstring describes."""
    files = list(files)
    listed = ", ".join(sql_literal(path) for path, *_ in files)
    expected = ", ".join(f"({sql_literal(path)}, {sql_literal(run)}, {size}, {'NULL' if mtime is None else mtime})"
                         for path, run, size, mtime in files)
    opened_as = "(SELECT path FROM duckdb_databases() WHERE database_name = current_database())"
    made_for = sql_literal(f"the views of this warehouse were made for {db_path}, and it was opened as ")
    moved = f"{made_for} || {opened_as} || {sql_literal(_MOVED_FIX)}"
    changed = (f"SELECT e.file || {sql_literal(_CHANGED)} || e.run || {sql_literal(_CHANGED_FIX)} "
               f"FROM (VALUES {expected}) AS e(file, run, bytes, mtime) "
               f"LEFT JOIN read_blob([{listed}]) AS b ON b.filename = e.file "
               "WHERE b.filename IS NULL OR b.size <> e.bytes OR epoch_ms(b.last_modified) // 1000 <> e.mtime LIMIT 1")
    problem = f"CASE WHEN {opened_as} IS DISTINCT FROM {sql_literal(db_path)} THEN {moved} ELSE ({changed}) END"
    # The guard twice: as a filter of the rows, so that it runs before their pages are decoded (a flipped byte can
    # fail DuckDB's decoding first, with a line that names no file), and as a branch of its own, so that it runs
    # however few rows a filter leaves.
    return (f"SELECT * FROM read_parquet([{listed}], union_by_name = true) WHERE ({_raising(problem)}) IS NULL "
            f"UNION ALL BY NAME {_guard(schema, problem)}")
