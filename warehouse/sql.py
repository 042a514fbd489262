"""Read-only SQL over the warehouse, and rendering results as an aligned table, CSV or JSON."""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import io
import json

import duckdb
import pyarrow as pa

from warehouse.store import Warehouse

# Statement kinds a read-only query may contain. Everything else (INSERT, DELETE, CREATE, DROP, ATTACH,
# COPY, EXPORT, INSTALL/LOAD, SET, PRAGMA, CALL...) is refused before DuckDB sees it.
_ALLOWED = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}


class ReadOnlyError(ValueError):
    """The query would write, attach, copy or configure something."""


def check_read_only(query: str) -> None:
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise ValueError(f"SQL does not parse: {exc}") from None
    if not statements:
        raise ValueError("no SQL statement given")
    for st in statements:
        if st.type not in _ALLOWED:
            kind = st.type.name
            raise ReadOnlyError(
                f"refused: `nkb sql` is read-only and this is a {kind} statement "
                f"({st.query.strip()[:60]!r}). Only SELECT (incl. WITH, DESCRIBE, SHOW, SUMMARIZE) "
                "and EXPLAIN are allowed; stages write the warehouse."
            )


def query(wh: Warehouse, sql: str) -> pa.Table:
    """Run read-only SQL against the warehouse; the last statement's result as an Arrow table."""
    check_read_only(sql)
    with wh.read_connection() as con:
        statements = duckdb.extract_statements(sql)
        for st in statements[:-1]:
            con.execute(st.query)
        return con.sql(statements[-1].query).to_arrow_table()


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
