import json

import pytest

from warehouse import ReadOnlyError, Warehouse, query, run_stage
from warehouse.sql import check_read_only, to_csv, to_json, to_text_table


@pytest.fixture
def wh(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    run_stage(wh, "questions", {}, "fp", lambda run: run.write("questions", "d.train", {
        "question_id": ["d/train/1", "d/train/2"], "dataset": ["d", "d"], "split": ["train", "train"],
        "question": ["who, \"really\"?", "when?"], "answers": [["Ada Quint", "Ada"], ["1901"]]}))
    return wh


@pytest.mark.parametrize("sql", [
    "DELETE FROM questions", "CREATE TABLE t AS SELECT 1", "ATTACH 'other.db'", "COPY questions TO 'out.csv'",
    "INSTALL httpfs", "LOAD httpfs", "INSERT INTO metrics VALUES ('r', NULL, NULL, 'm', 1, NULL)",
    "UPDATE runs SET status = 'x'", "DROP VIEW questions", "EXPORT DATABASE 'dir'", "SET threads = 1",
    "PRAGMA enable_profiling", "SELECT 1; DELETE FROM runs", "CALL pragma_version()", "DETACH wh",
])
def test_writes_are_refused(wh, sql):
    with pytest.raises(ReadOnlyError, match="read-only"):
        query(wh, sql)


@pytest.mark.parametrize("sql", ["SELECT 1", "WITH a AS (SELECT 1) SELECT * FROM a", "DESCRIBE questions",
                                 "SHOW TABLES", "SUMMARIZE questions", "EXPLAIN SELECT 1", "FROM questions"])
def test_reads_are_allowed(sql):
    check_read_only(sql)


def test_refusal_message_names_the_statement():
    with pytest.raises(ReadOnlyError, match="DELETE statement"):
        check_read_only("DELETE FROM runs")


def test_json_keeps_lists_as_arrays(wh):
    rows = json.loads(to_json(query(wh, "SELECT question_id, answers, 1.5 AS x FROM questions ORDER BY 1")))
    assert rows == [{"question_id": "d/train/1", "answers": ["Ada Quint", "Ada"], "x": 1.5},
                    {"question_id": "d/train/2", "answers": ["1901"], "x": 1.5}]


def test_csv_quotes_and_lists(wh):
    text = to_csv(query(wh, "SELECT question, answers FROM questions ORDER BY question_id"))
    assert text.splitlines() == ["question,answers", '"who, ""really""?","[""Ada Quint"", ""Ada""]"',
                                 'when?,"[""1901""]"']


def test_text_table_is_aligned(wh):
    lines = to_text_table(query(wh, "SELECT question_id, length(question) AS n FROM questions ORDER BY 1")).splitlines()
    assert lines[0].split() == ["question_id", "n"]
    assert len({len(line) for line in lines[:4]}) == 1  # right-aligned last column: equal widths
    assert lines[2].endswith("14") and lines[3].endswith(" 5")  # numbers right-aligned
    assert lines[-1] == "(2 rows)"


def test_text_table_cuts_long_cells():
    import pyarrow as pa
    out = to_text_table(pa.table({"t": ["x" * 100]}), max_width=10)
    assert "xxxxxxxxx…" in out and "x" * 11 not in out
