"""`nkb sql` reads the warehouse and nothing else: every write and DDL statement, however wrapped, and every
DuckDB function that reads or lists files is refused with one line, and no file changes."""

import hashlib
from pathlib import Path

import pytest

from warehouse import ReadOnlyError, Warehouse, query, run_stage

WRITES = [
    "INSERT INTO metrics VALUES ('r', NULL, NULL, 'm', 1, NULL)", "UPDATE runs SET status = 'x'", "DELETE FROM runs",
    "CREATE TABLE t AS SELECT 1", "CREATE TEMP TABLE t AS SELECT 1", "CREATE VIEW v AS SELECT 1",
    "CREATE SCHEMA s", "CREATE SEQUENCE q", "CREATE MACRO m(a) AS a", "CREATE TYPE e AS ENUM ('a')",
    "CREATE INDEX i ON runs (stage)", "DROP VIEW questions", "DROP TABLE runs", "ALTER TABLE runs ADD COLUMN x INT",
    "ATTACH '{home}/other.duckdb' AS o", "DETACH wh", "COPY (SELECT 'x' AS x) TO '{tables}/documents/evil.parquet' (FORMAT parquet)",
    "COPY runs TO '{home}/runs.csv'", "COPY runs FROM '{home}/runs.csv'", "EXPORT DATABASE '{home}/export'",
    "IMPORT DATABASE '{home}/export'", "INSTALL httpfs", "LOAD httpfs", "SET threads = 1", "RESET threads",
    "SET enable_external_access = true", "PRAGMA enable_profiling", "CALL pragma_version()", "CHECKPOINT", "VACUUM",
    "ANALYZE", "BEGIN TRANSACTION", "USE memory", "CREATE SECRET (TYPE s3, KEY_ID 'a', SECRET 'b')",
]
WRAPPED = ["{}", "EXPLAIN {}", "EXPLAIN ANALYZE {}", "explain analyse {}", "/* note */ EXPLAIN ANALYZE {}",
           "WITH x AS (SELECT 1) {}", "SELECT 1; {}"]
FILE_READS = [
    "SELECT * FROM read_csv('/etc/passwd')", "SELECT * FROM read_csv_auto('/etc/passwd')",
    "SELECT * FROM read_text('/etc/hostname')", "SELECT * FROM read_blob('/etc/hostname')",
    "SELECT * FROM read_json('/etc/hostname')", "SELECT * FROM read_json_auto('/etc/hostname')",
    "SELECT * FROM read_json_objects('/etc/hostname')", "SELECT * FROM read_ndjson('/etc/hostname')",
    "SELECT * FROM read_ndjson_objects('/etc/hostname')", "SELECT * FROM read_ndjson_auto('/etc/hostname')",
    "SELECT * FROM read_parquet('{other}/tables/questions/*.parquet')", "SELECT * FROM parquet_scan('{other_file}')",
    "SELECT * FROM parquet_metadata('{other_file}')", "SELECT * FROM parquet_schema('{other_file}')",
    "SELECT * FROM parquet_file_metadata('{other_file}')", "SELECT * FROM parquet_kv_metadata('{other_file}')",
    "SELECT * FROM '{other_file}'", "SELECT * FROM '/etc/passwd'", "SELECT * FROM glob('/*')",
    "SELECT * FROM glob('{tables}/../../**')", "SELECT * FROM sniff_csv('/etc/passwd')",
    "SUMMARIZE SELECT * FROM read_csv('/etc/passwd')", "DESCRIBE SELECT * FROM read_text('/etc/hostname')",
    "SELECT * FROM read_text('{tables}/../../../../../etc/hostname')", "SELECT * FROM read_text('.tmp/x')",
    "SELECT * FROM query('SELECT * FROM read_text(''/etc/hostname'')')", "SELECT * FROM duckdb_extensions()",
]


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.endswith(".lock")}


def _questions(run):
    run.write("questions", "d.train", {"question_id": ["d/train/1"], "dataset": ["d"], "split": ["train"],
                                       "question": ["who?"], "answers": [["Ada"]]})


@pytest.fixture(scope="module")
def homes(tmp_path_factory):
    root = tmp_path_factory.mktemp("sandbox")
    wh, other = Warehouse(root / "wh"), Warehouse(root / "other")
    for w in (wh, other):
        run_stage(w, "questions", {}, "fp", _questions)
    (root / "wh" / "runs.csv").write_text("x\n1\n")
    values = {"home": str(wh.home), "tables": str(wh.tables_dir), "other": str(other.home),
              "other_file": str(other.partition_files("questions")[0])}
    return wh, values


@pytest.mark.parametrize("wrapper", WRAPPED)
@pytest.mark.parametrize("statement", WRITES)
def test_every_write_is_refused_however_wrapped(homes, statement, wrapper):
    wh, values = homes
    before = snapshot(wh.home.parent)
    with pytest.raises(ValueError) as refused:  # ReadOnlyError, or a parse error where the wrapping is not SQL
        query(wh, wrapper.format(statement.format(**values)))
    assert "\n" not in str(refused.value)
    assert str(refused.value).startswith("refused" if isinstance(refused.value, ReadOnlyError) else "SQL does not parse")
    assert snapshot(wh.home.parent) == before


@pytest.mark.parametrize("sql", FILE_READS)
def test_files_outside_the_warehouse_tables_cannot_be_read_or_listed(homes, sql):
    wh, values = homes
    before = snapshot(wh.home.parent)
    with pytest.raises(ReadOnlyError) as refused:
        query(wh, sql.format(**values))
    assert "\n" not in str(refused.value) and str(refused.value).startswith("refused")
    assert snapshot(wh.home.parent) == before


@pytest.mark.parametrize("sql", ["SELECT question FROM questions", "FROM questions", "DESCRIBE questions",
                                 "SUMMARIZE questions", "SHOW TABLES", "EXPLAIN SELECT * FROM questions",
                                 "WITH q AS (SELECT * FROM questions) SELECT count(*) FROM q",
                                 "SELECT count(*) FROM runs", "SELECT * FROM metrics", "SELECT * FROM ssm_examples",
                                 "SELECT * FROM query('SELECT question FROM questions')"])
def test_the_warehouse_tables_and_views_still_answer(homes, sql):
    wh, _ = homes
    assert query(wh, sql).num_rows >= 0


def test_tables_read_through_the_sandbox_equal_the_files(homes):
    wh, _ = homes
    assert query(wh, "SELECT question_id, answers FROM questions").to_pylist() == [
        {"question_id": "d/train/1", "answers": ["Ada"]}]
    assert query(wh, "SELECT stage FROM runs").column("stage").to_pylist() == ["questions"]
