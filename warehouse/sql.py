"""Read-only SQL over the warehouse, and rendering results as an aligned table, CSV or JSON.

`nkb sql` sees the warehouse's tables and views and nothing else. Two walls keep it so:
- statements are checked before DuckDB runs them: only SELECT (WITH, DESCRIBE, SHOW, SUMMARIZE, VALUES, ...)
  and EXPLAIN of a SELECT; EXPLAIN ANALYZE executes what it explains, so it counts as what it wraps;
- the query runs in a sandbox: an in-memory DuckDB with the warehouse file attached read-only and the
  Parquet tables handed over as Arrow datasets, after which file access is switched off and the
  configuration locked. No path reaches DuckDB's file system, so neither a table function that reads or
  lists files (read_csv, read_text, glob, ...), nor COPY, nor ATTACH can touch anything. The plain
  `duckdb` CLI stays the tool for anything beyond the warehouse.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import decimal
import io
import json
import re
from typing import Iterator

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from warehouse.schemas import DERIVED_VIEWS, PARQUET_TABLES
from warehouse.store import Warehouse

_LEADING_COMMENTS = re.compile(r"^(\s|--[^\n]*(\n|$)|/\*.*?\*/)*", re.S)
_EXPLAIN = re.compile(r"^EXPLAIN\b", re.I)
_MISSING_FILE_TABLE = re.compile(r"Table with name (\S*[/\\.]\S*) does not exist")


class ReadOnlyError(ValueError):
    """The query would write, attach, copy, configure or read something beyond the warehouse's tables."""


def _refuse(kind: str, statement: str) -> ReadOnlyError:
    return ReadOnlyError(f"refused: `nkb sql` is read-only and this is a {kind} statement "
                         f"({' '.join(statement.split())[:60]!r}). Only SELECT (incl. WITH, DESCRIBE, SHOW, "
                         "SUMMARIZE) and EXPLAIN of a SELECT are allowed; stages write the warehouse.")


def check_read_only(query: str) -> list[str]:
    """The query's statements, if every one only reads; else ReadOnlyError naming the first that does not."""
    try:
        statements = duckdb.extract_statements(query)
    except (duckdb.Error, ValueError) as exc:
        raise ValueError(f"SQL does not parse: {str(exc).splitlines()[0]}") from None
    if not statements:
        raise ValueError("no SQL statement given")
    for st in statements:
        if st.type == duckdb.StatementType.EXPLAIN:
            # EXPLAIN ANALYZE runs what it explains: allow EXPLAIN only of what parses as one SELECT.
            explained = _EXPLAIN.sub("", _LEADING_COMMENTS.sub("", st.query), count=1)
            try:
                inner = duckdb.extract_statements(explained)
            except (duckdb.Error, ValueError):
                inner = []
            if len(inner) != 1 or inner[0].type != duckdb.StatementType.SELECT:
                raise _refuse("EXPLAIN ANALYZE or EXPLAIN of a non-SELECT", st.query)
        elif st.type != duckdb.StatementType.SELECT:
            raise _refuse(st.type.name, st.query)
    return [st.query for st in statements]


@contextlib.contextmanager
def sandbox(wh: Warehouse) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection that sees the warehouse's tables and views and cannot reach any file."""
    with wh.lock(exclusive=False):
        con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False,
                                                 "autoload_known_extensions": False})
        try:
            con.execute(f"ATTACH '{str(wh.db_path).replace(chr(39), chr(39) * 2)}' AS wh (READ_ONLY)")
            con.execute("USE wh")  # runs, metrics and the catalog the CLI shows
            for name, schema in PARQUET_TABLES.items():  # shadow the views over files with the same data
                files = [str(f) for f in wh.partition_files(name)]
                con.register(name, ds.dataset(files, schema=schema, format="parquet") if files
                             else schema.empty_table())
            for name, body in DERIVED_VIEWS.items():
                con.execute(f'CREATE TEMP VIEW "{name}" AS {body}')
            con.execute("SET temp_directory = ''")  # no spill folder: DuckDB would allow the query to read it
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
            yield con
        finally:
            con.close()


def query(wh: Warehouse, sql: str) -> pa.Table:
    """Run read-only SQL against the warehouse; the last statement's result as an Arrow table."""
    statements = check_read_only(sql)
    with sandbox(wh) as con:
        try:
            for st in statements[:-1]:
                con.execute(st)
            return con.sql(statements[-1]).to_arrow_table()
        except duckdb.PermissionException as exc:
            raise ReadOnlyError(f"refused: `nkb sql` sees only the warehouse's tables and views, no other files "
                                f"({str(exc).splitlines()[0]})") from None
        except duckdb.CatalogException as exc:
            path = _MISSING_FILE_TABLE.search(str(exc))
            if path:  # FROM 'file.csv': with file access off DuckDB looks for a table of that name
                raise ReadOnlyError(f"refused: `nkb sql` sees only the warehouse's tables and views, and "
                                    f"{path.group(1)!r} is a file") from None
            raise


def _plain(value):
    """A JSON-ready Python value: lists stay lists, times become ISO strings."""
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def to_json(table: pa.Table) -> str:
    """An array of row objects; list columns are JSON arrays."""
    rows = [{k: _plain(v) for k, v in row.items()} for row in table.to_pylist()]
    return json.dumps(rows, ensure_ascii=False, indent=1)


def _cell(value) -> str:
    value = _plain(value)
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def to_csv(table: pa.Table) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(table.column_names)
    for row in table.to_pylist():
        writer.writerow([_cell(row[c]) for c in table.column_names])
    return buf.getvalue()


def to_text_table(table: pa.Table, max_width: int = 60) -> str:
    """An aligned plain-text table; cells wider than `max_width` are cut with '…'."""
    names = table.column_names
    rows = []
    for row in table.to_pylist():
        cells = []
        for c in names:
            text = _cell(row[c]).replace("\n", " ")
            cells.append(text if len(text) <= max_width else text[: max_width - 1] + "…")
        rows.append(cells)
    numeric = [pa.types.is_integer(t) or pa.types.is_floating(t) for t in table.schema.types]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]

    def line(cells):
        return "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric)).rstrip()

    out = [line(names), line(["-" * w for w in widths])] + [line(r) for r in rows]
    out.append(f"({table.num_rows} row{'s' if table.num_rows != 1 else ''})")
    return "\n".join(out)


FORMATTERS = {"table": to_text_table, "csv": to_csv, "json": to_json}
