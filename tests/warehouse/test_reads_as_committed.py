"""A read never returns bytes, or an absence of bytes, that differ from what a run committed: through `nkb sql` and
through the plain `duckdb` CLI on the warehouse file, on the warehouse or on a copy of it, filtered or not."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from warehouse import DamagedFileError, Warehouse, query, run_stage

CLI = shutil.which("duckdb") or str(Path(sys.executable).parent / "duckdb")
needs_cli = pytest.mark.skipif(not os.path.exists(CLI), reason="duckdb CLI not installed (pip install duckdb-cli)")


def docs(corpus: str, n: int) -> dict:
    return {"doc_id": [f"{corpus}-{i}" for i in range(n)], "title": [f"T{i}" for i in range(n)],
            "text": [f"Person {i} was born in Town{i}." for i in range(n)], "corpus": [corpus] * n}


@pytest.fixture
def wh(tmp_path):
    """Two corpora in `documents`: k1 (20 rows) and k2 (10 rows), each its own partition."""
    wh = Warehouse(tmp_path / "wh")
    for corpus, n in (("k1", 20), ("k2", 10)):
        run_stage(wh, "ingest", {"corpus": corpus}, f"fp-{corpus}", lambda run, c=corpus, n=n:
                  run.write("documents", c, docs(c, n)))
    return wh


def k1(wh) -> Path:
    return wh.tables_dir / "documents" / "k1.parquet"


def cli(db: Path, sql: str, cwd="/") -> subprocess.CompletedProcess:
    return subprocess.run([CLI, "-csv", "-noheader", str(db), "-c", sql], capture_output=True, text=True, cwd=cwd,
                          timeout=60)


def flip(path: Path, at: int) -> None:
    """Flip one byte in place, keeping the file's size."""
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


DAMAGE = {
    "flipped in its data": lambda p: flip(p, 40),
    "flipped in its footer": lambda p: flip(p, p.stat().st_size - 30),
    "cut": lambda p: p.write_bytes(p.read_bytes()[:-30]),
    "deleted": lambda p: p.unlink(),
    "dangling link": lambda p: (p.unlink(), p.symlink_to(p.with_name("gone.parquet"))),
}
FILTERED = ["SELECT count(*) FROM documents WHERE corpus = 'k2'",
            "SELECT EXISTS (SELECT 1 FROM documents WHERE corpus = 'k2')",
            "SELECT max(doc_id) FROM documents WHERE corpus IN ('k2')",
            "SELECT count(*) FROM documents WHERE corpus = 'k2' AND title IS NOT NULL",
            "SELECT count(*) FROM documents"]


@pytest.mark.parametrize("damage", [d for d in DAMAGE if d != "flipped in its data"])
def test_a_filter_on_a_table_with_a_damaged_file_fails_and_never_answers_short(wh, damage):
    DAMAGE[damage](k1(wh))
    fresh = Warehouse(wh.home)
    for sql in FILTERED:
        with pytest.raises(DamagedFileError, match=r"documents/k1\.parquet is (damaged|missing)"):
            query(fresh, sql)


def test_a_flip_in_pages_a_filter_skips_leaves_the_committed_answer(wh):
    """`nkb sql` checks the footer (the statistics a filter skips row groups by) before the read and each page it
    decodes: a filter that never decodes the flipped page answers what was committed; one that does fails."""
    flip(k1(wh), 40)
    fresh = Warehouse(wh.home)
    assert query(fresh, FILTERED[0]).to_pylist() == [{"count_star()": 10}]
    with pytest.raises(DamagedFileError, match=r"k1\.parquet is damaged"):
        query(fresh, "SELECT max(doc_id) FROM documents WHERE corpus = 'k1'")


@needs_cli
@pytest.mark.parametrize("damage", DAMAGE)
def test_the_duckdb_cli_fails_on_a_damaged_file_filtered_or_not(wh, damage):
    Warehouse(wh.home)._refresh()  # views as the last nkb command left them, before the damage
    DAMAGE[damage](k1(wh))
    for sql in FILTERED:
        out = cli(wh.db_path, sql)
        assert out.returncode != 0 and "k1.parquet" in out.stderr, (sql, out.stdout, out.stderr)
    # A view an nkb command redid after the damage fails with nkb's own line, filtered too.
    Warehouse(wh.home)._refresh()
    out = cli(wh.db_path, FILTERED[0])
    assert out.returncode != 0 and "`nkb check`" in out.stderr and "k1.parquet" in out.stderr, out.stderr


@needs_cli
def test_the_duckdb_cli_reads_intact_tables_and_tells_a_change_within_the_commits_second(wh):
    assert cli(wh.db_path, "SELECT corpus, count(*) FROM documents GROUP BY ALL ORDER BY ALL").stdout.split() == [
        "k1,20", "k2,10"]
    flip(k1(wh), 732 % k1(wh).stat().st_size)  # at once: the same second as the commit
    out = cli(wh.db_path, "SELECT text FROM documents WHERE doc_id = 'k1-2'")
    assert out.returncode != 0 and "k1.parquet is damaged or missing" in out.stderr, out.stdout


@needs_cli
def test_what_nkb_check_found_fails_the_cli_even_where_size_and_time_are_kept(wh):
    stat = k1(wh).stat()
    flip(k1(wh), 40)
    os.utime(k1(wh), ns=(stat.st_atime_ns, stat.st_mtime_ns))  # a disk's bit flip: size and time as they were
    assert cli(wh.db_path, "SELECT count(*) FROM documents WHERE corpus = 'k2'").stdout.split() == ["10"]
    assert [p.name for p, _, _ in Warehouse(wh.home).check_files()] == ["k1.parquet"]
    out = cli(wh.db_path, "SELECT count(*) FROM documents WHERE corpus = 'k2'")
    assert out.returncode != 0 and "k1.parquet is damaged" in out.stderr
    with pytest.raises(DamagedFileError, match="k1.parquet"):
        query(Warehouse(wh.home), "SELECT count(*) FROM documents WHERE corpus = 'k2'")


def test_a_file_found_intact_again_reads_again(wh):
    original = k1(wh).read_bytes()
    flip(k1(wh), 40)
    Warehouse(wh.home).check_files()
    k1(wh).write_bytes(original)  # restored from a backup: the same bytes, another time
    assert not Warehouse(wh.home).check_files()
    assert query(Warehouse(wh.home), "SELECT count(*) AS n FROM documents").to_pylist() == [{"n": 30}]


@needs_cli
def test_a_touched_file_is_hashed_and_its_new_time_registered(wh):
    os.utime(k1(wh))  # its bytes unchanged
    out = cli(wh.db_path, "SELECT count(*) FROM documents")
    assert out.returncode != 0 and "modification time" in out.stderr
    Warehouse(wh.home)._refresh()  # any write: the file is hashed whole and found as committed
    assert cli(wh.db_path, "SELECT count(*) FROM documents").stdout.split() == ["30"]


@needs_cli
@pytest.mark.parametrize("keep_times", [True, False])
def test_a_copied_warehouse_never_reads_the_originals_files_through_the_cli(wh, tmp_path, keep_times):
    copy = tmp_path / "copy"
    if keep_times:
        shutil.copytree(wh.home, copy)  # cp -a: times kept
    else:
        subprocess.run(["cp", "-r", str(wh.home), str(copy)], check=True)  # new times
    run_stage(wh, "ingest", {"corpus": "k2", "more": 1}, "fp-more",
              lambda run: run.write("documents", "k2", docs("k2", 60_000)))  # the original changes after the copy
    out = cli(copy / "warehouse.duckdb", "SELECT count(*) FROM documents")
    assert out.returncode != 0 and "a copy or a move" in out.stderr and "60" not in out.stdout
    Warehouse(copy)  # an nkb command points the copy's views at its own files
    assert cli(copy / "warehouse.duckdb", "SELECT count(*) FROM documents").stdout.split() == ["30"]


def test_check_adopt_refuses_a_file_whose_pages_fail_their_checksums(wh, tmp_path):
    data = bytearray(k1(wh).read_bytes())
    data[40] ^= 0x01  # inside the first data page, which its CRC-32 covers
    k1(wh).write_bytes(bytes(data))
    wh.db_path.unlink()
    out = subprocess.run([sys.executable, "-m", "flows.cli", "--home", str(wh.home), "check", "--adopt"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "registered 1 table file " in out.stdout  # k2, intact
    assert "k1.parquet: its pages cannot be read as written" in out.stdout
    assert "every table file" not in out.stdout


def test_a_page_that_fails_its_checksum_is_named_when_its_digest_matches(wh):
    """A file registered as it is (adopted by an earlier version) whose pages fail: the read names it."""
    flip(k1(wh), 40)
    fresh = Warehouse(wh.home)
    record = fresh.registry()[("documents", "k1")]
    from warehouse.store import PartitionRecord
    with fresh.write_connection() as con:
        fresh.record_partitions(con, [PartitionRecord.of_file("documents", k1(wh))])
    assert fresh.registry()[("documents", "k1")].sha256 != record.sha256
    with pytest.raises(DamagedFileError, match=r"k1\.parquet is damaged \(its pages cannot be read as written"):
        query(Warehouse(wh.home), "SELECT * FROM documents")
