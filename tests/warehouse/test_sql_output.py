"""What `nkb sql` writes: rows streamed as they are computed (memory flat however large the result, a closed pipe
ending it at once), strict JSON, exact integers and CSV that ends with its last record."""

import json
import resource
import subprocess
import sys
import textwrap

import pyarrow.parquet as pq
import pytest

from warehouse import Warehouse

# The command, run in a child of a child whose largest resident size is then the command's alone; its address space
# capped at 3 GB, which holding 50 million rows whole (about 18 GB) would pass.
MEASURED = textwrap.dedent("""
    import json, resource, subprocess, sys
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    child = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=cap)
    head = [child.stdout.readline().decode() for _ in range(3)]
    child.stdout.close()  # as `| head -3` does
    err = child.stderr.read().decode()
    child.wait()
    print(json.dumps({"head": head, "rc": child.returncode, "err": err,
                      "peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024}))
""")


def nkb(home, *args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", "--home", str(home), *args], capture_output=True,
                          text=True, timeout=120, **kwargs)


@pytest.fixture
def home(tmp_path):
    return Warehouse(tmp_path / "wh").home


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_fifty_million_rows_stream_and_a_closed_pipe_ends_the_query_quietly(home, fmt):
    out = subprocess.run([sys.executable, "-c", MEASURED, sys.executable, "-m", "flows.cli", "--home", str(home),
                          "sql", "SELECT range FROM range(50000000)", "--format", fmt],
                         capture_output=True, text=True, timeout=120)
    result = json.loads(out.stdout)
    assert result["rc"] == 141 and result["err"] == "", result
    assert {"table": "range\n", "csv": "range\n", "json": "[\n"}[fmt] == result["head"][0]
    assert result["peak_mb"] < 1000, result


def test_json_is_strict_and_integers_exact(home):
    out = nkb(home, "sql", "SELECT 'nan'::DOUBLE AS a, 'inf'::DOUBLE AS b, '-inf'::DOUBLE AS c, "
                           "12345678901234567890::HUGEINT AS h, [1.5, 'nan'::DOUBLE] AS l, 2.50::DECIMAL(10,2) AS d",
              "--format", "json")
    assert out.returncode == 0, out.stderr

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    rows = json.loads(out.stdout, parse_constant=refuse)
    assert rows == [{"a": "NaN", "b": "Infinity", "c": "-Infinity", "h": 12345678901234567890, "l": [1.5, "NaN"],
                     "d": 2.5}]
    assert nkb(home, "sql", "SELECT 1 AS x WHERE false", "--format", "json").stdout == "[]\n"


def test_csv_on_standard_output_ends_with_its_last_record(home):
    out = nkb(home, "sql", "SELECT * FROM (VALUES (1, 'a'), (2, 'b')) t(n, s)", "--format", "csv")
    assert out.stdout == "n,s\n1,a\n2,b\n"
    assert nkb(home, "sql", "SELECT 12345678901234567890::HUGEINT AS h", "--format", "csv").stdout == \
        "h\n12345678901234567890\n"


def test_two_columns_of_one_name_both_come_out(home):
    assert nkb(home, "sql", "SELECT 1 AS a, 2 AS a", "--format", "csv").stdout == "a,a\n1,2\n"


def test_a_result_written_to_a_file_streams_into_it_whole(home, tmp_path):
    target = tmp_path / "out" / "r.parquet"
    out = nkb(home, "sql", "SELECT range AS n FROM range(100000)", "--output", str(target))
    assert out.returncode == 0, out.stderr
    assert pq.read_table(target).column("n").to_pylist() == list(range(100000))
    assert nkb(home, "sql", "SELECT 1 AS x", "--output", str(tmp_path / "r.csv")).returncode == 0
    assert (tmp_path / "r.csv").read_text() == "x\n1\n"
