"""What a warehouse does when its files or its disk let it down: a damaged or foreign Parquet file, a full disk, a
read-only mount, a mistyped home. Each case ends in one line that names what is wrong, and loses nothing."""

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from warehouse import DamagedFileError, Warehouse, WarehouseError, list_runs, query, row_counts, run_stage
from warehouse.store import PartitionRecord

DOCS = {"doc_id": ["1", "2", "3"], "title": ["A", "B", "C"], "text": ["x " * 500, "y " * 500, "z"],
        "corpus": ["c"] * 3}
QUESTIONS = {"question_id": ["q1"], "dataset": ["nq"], "split": ["train"], "question": ["?"], "answers": [["a"]]}


def ingest(wh, fp="fp1", force=False):
    return run_stage(wh, "ingest", {"corpus": "c"}, fp, lambda run: run.write("documents", "c", DOCS), force=force)


def load_questions(wh):
    return run_stage(wh, "questions", {}, "fq", lambda run: run.write("questions", "nq.train", QUESTIONS))


@pytest.fixture
def wh(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    ingest(wh)
    load_questions(wh)
    return wh


def documents_file(wh) -> Path:
    return wh.tables_dir / "documents" / "c.parquet"


@pytest.mark.slow
def test_random_bytes_in_place_of_a_file_break_only_that_table_and_a_rerun_repairs_it(wh):
    documents_file(wh).write_bytes(os.urandom(5000))
    # Other tables keep answering, in a fresh object (as a new command would) and in a copy whose views are redone.
    assert query(Warehouse(wh.home), "SELECT count(*) AS n FROM questions").to_pylist() == [{"n": 1}]
    copy = Warehouse(shutil.copytree(wh.home, wh.home.with_name("copy")))
    assert query(copy, "SELECT count(*) AS n FROM questions").to_pylist() == [{"n": 1}]
    assert dict((t, n) for t, _, n in row_counts(copy))["documents"] is None  # not read, not counted as empty
    with pytest.raises(DamagedFileError, match=r"documents/c\.parquet is damaged .*run ingest-.*`nkb check`"):
        Warehouse(wh.home).read("documents")
    # The stage that wrote it sees its output gone and writes it again; the registry takes the new file.
    rerun = ingest(Warehouse(wh.home))
    assert not rerun.skipped
    assert Warehouse(wh.home).read("documents").num_rows == 3 and not Warehouse(wh.home).check_files()


def test_flipped_bytes_inside_a_file_are_named_by_digest_when_read(wh):
    data = bytearray(documents_file(wh).read_bytes())
    for i in range(100, 400):
        data[i] ^= 0xFF
    documents_file(wh).write_bytes(bytes(data))  # same size: only the digest tells
    fresh = Warehouse(wh.home)
    with pytest.raises(DamagedFileError, match=r"documents/c\.parquet is damaged \(its bytes differ"):
        list(fresh.scan("documents", ["text"]))
    with pytest.raises(DamagedFileError, match=r"documents/c\.parquet"):
        query(fresh, "SELECT max(length(text)) FROM documents")
    assert [(p.name, why) for p, why, _ in fresh.check_files()] == [("c.parquet", "its bytes differ from what was "
                                                                                  "written")]


def test_a_file_no_run_wrote_is_reported_and_never_read(wh, capsys):
    shutil.copy(wh.tables_dir / "questions" / "nq.train.parquet", wh.tables_dir / "documents" / "foreign.parquet")
    fresh = Warehouse(wh.home)
    assert query(fresh, "SELECT count(*) AS n FROM documents").to_pylist() == [{"n": 3}]
    assert "foreign.parquet: no run of this warehouse wrote this file" in capsys.readouterr().err
    assert [p.name for p, _, record in fresh.check_files() if record is None] == ["foreign.parquet"]


def test_quarantine_moves_files_aside_and_the_tables_read_without_them(wh):
    shutil.copy(wh.tables_dir / "questions" / "nq.train.parquet", wh.tables_dir / "documents" / "foreign.parquet")
    documents_file(wh).write_bytes(b"garbage")
    fresh = Warehouse(wh.home)
    aside = fresh.quarantine(fresh.check_files())
    assert sorted(p.name for p in (aside / "tables" / "documents").iterdir()) == [
        "c.parquet", "foreign.parquet"]
    assert not fresh.check_files()
    assert fresh.read("documents").num_rows == 0 and fresh.read("questions").num_rows == 1


def test_a_warehouse_made_before_the_registry_adopts_the_files_its_runs_wrote(wh):
    foreign = wh.tables_dir / "documents" / "foreign.parquet"
    shutil.copy(wh.tables_dir / "questions" / "nq.train.parquet", foreign)
    con = duckdb.connect(str(wh.db_path))
    con.execute("DROP TABLE partitions")
    con.close()
    old = Warehouse(wh.home)
    adopted = old.registry()
    # The foreign file's footer names the questions run, but for another table: adopted under its own name, so
    # the check compares it as written; what matters is that the documents partition is registered again.
    assert adopted[("documents", "c")].rows == 3 and adopted[("questions", "nq.train")].rows == 1
    assert old.read("documents", partitions=["c"]).num_rows == 3


# ---- a commit that fails, a full disk -------------------------------------------------------------------

def test_a_commit_that_fails_in_the_database_puts_every_file_back(wh, monkeypatch):
    import warehouse.commit as commit
    before = {p.name: p.read_bytes() for p in (wh.tables_dir / "documents").glob("*.parquet")}

    real = commit.insert_run

    def full_disk_at_the_commit(con, run, home):  # the failure row afterwards finds space again
        if run.status == "success":
            raise duckdb.IOException('Could not write file "warehouse.duckdb.wal": No space left on device')
        real(con, run, home)

    monkeypatch.setattr(commit, "insert_run", full_disk_at_the_commit)
    with pytest.raises(duckdb.IOException):
        run_stage(wh, "ingest", {"corpus": "c"}, "fp2", lambda run: run.write("documents", "c", {
            k: v[:1] for k, v in DOCS.items()}))
    monkeypatch.undo()
    after = {p.name: p.read_bytes() for p in (wh.tables_dir / "documents").glob("*.parquet")}
    assert after == before and not list((wh.tables_dir / "documents" / ".staging").iterdir())
    assert Warehouse(wh.home).read("documents").num_rows == 3
    assert [r.status for r in list_runs(wh, stage="ingest")] == ["failed", "success"]


@contextlib.contextmanager
def small_disk(path: Path, size: str):
    """A real tmpfs of `size` at `path` (needs root and mount; else the test is skipped)."""
    path.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                                           capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path, leave_kb: int) -> Path:
    stat = os.statvfs(disk)
    filler = disk / "filler"
    filler.write_bytes(b"\0" * max(0, stat.f_bavail * stat.f_frsize - leave_kb * 1024))
    return filler


@pytest.mark.slow
@pytest.mark.parametrize("leave_kb", [0, 16, 64, 512])
def test_on_a_full_disk_nothing_committed_is_lost_or_hidden_and_nothing_half_done_shows(tmp_path, leave_kb):
    """Issue 37, case 5: whatever point of a commit the disk fills at, the warehouse reads as its last committed
    state, during the shortage and after it: every file a run row, every run row its files."""
    with small_disk(tmp_path / "disk", "3m") as disk:
        wh = Warehouse(disk / "wh")
        for corpus in ("a", "b"):
            run_stage(wh, "ingest", {"corpus": corpus}, corpus, lambda run, c=corpus: run.write(
                "documents", c, dict(DOCS, corpus=[c] * 3)))
        filler = fill(disk, leave_kb)
        outcomes = []
        for corpus in ("c", "d"):
            try:
                run_stage(Warehouse(wh.home), "ingest", {"corpus": corpus}, corpus, lambda run, c=corpus: run.write(
                    "documents", c, dict(DOCS, corpus=[c] * 3)))
                outcomes.append("ok")
            except (OSError, duckdb.Error, WarehouseError):
                outcomes.append("failed")

        def consistent():
            fresh = Warehouse(wh.home)
            corpora = sorted(r[0] for r in query(fresh, "SELECT DISTINCT corpus FROM documents").to_pylist()
                             for r in [tuple(r.values())])
            succeeded = sorted(r.config["corpus"] for r in list_runs(fresh) if r.status == "success")
            return corpora, succeeded

        during = consistent()
        filler.unlink()
        after = consistent()
        assert during == after, (outcomes, during, after)
        corpora, succeeded = after
        assert corpora == succeeded and corpora[:2] == ["a", "b"]
        assert len(corpora) == 2 + outcomes.count("ok")


# ---- where the warehouse is -------------------------------------------------------------------------

@contextlib.contextmanager
def read_only(path: Path):
    """`path` made read-only: a read-only bind mount for root (which ignores permissions), else chmod."""
    if os.geteuid() == 0:
        mounted = path.with_name(path.name + "-ro")
        mounted.mkdir()
        ok = subprocess.run(["mount", "--bind", str(path), str(mounted)], capture_output=True).returncode == 0 and \
            subprocess.run(["mount", "-o", "remount,ro,bind", str(mounted)], capture_output=True).returncode == 0
        if not ok:
            subprocess.run(["umount", str(mounted)], capture_output=True)
            pytest.skip("cannot make a read-only mount here")
        try:
            yield mounted
        finally:
            subprocess.run(["umount", "-l", str(mounted)], check=False)
    else:
        modes = {p: p.stat().st_mode for p in [path, *path.rglob("*")]}
        for p in modes:
            p.chmod(modes[p] & ~0o222)
        try:
            yield path
        finally:
            for p, mode in modes.items():
                p.chmod(mode)


def test_a_read_only_warehouse_answers_reads_and_refuses_writes_in_one_line(wh):
    with read_only(wh.home) as home:
        ro = Warehouse(home, create=False)
        assert query(ro, "SELECT count(*) AS n FROM documents").to_pylist() == [{"n": 3}]
        assert [r.stage for r in list_runs(ro)] == ["questions", "ingest"]
        assert not ro.check_files()
        with pytest.raises(WarehouseError, match=r"cannot be written \((it is on a read-only file system|no write "
                                                 r"permission)\): reading it works"):
            Warehouse(home)


def test_a_missing_home_or_a_file_as_home_is_refused_and_nothing_is_created(tmp_path):
    with pytest.raises(WarehouseError, match="no warehouse at .*typo"):
        Warehouse(tmp_path / "typo", create=False)
    assert not (tmp_path / "typo").exists()
    (tmp_path / "file").write_text("x")
    for create in (True, False):
        with pytest.raises(WarehouseError, match="is a file, not a warehouse directory"):
            Warehouse(tmp_path / "file", create=create)


def test_a_partition_record_is_read_from_the_file_itself(wh):
    record = PartitionRecord.of_file("documents", documents_file(wh))
    assert record == Warehouse(wh.home).registry()[("documents", "c")]


# ---- the second sweep (issue 53): nothing read that its run did not commit ---------------------------------------

def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))  # the same size: only the bytes tell


@pytest.mark.slow
def test_a_byte_flipped_anywhere_in_a_file_is_never_read_as_data(wh):
    """The sweep's case: a byte flipped inside a page, and a read returned "Analytn" + "cal Engine" as the text."""
    path, reader = documents_file(wh), Warehouse(wh.home)
    original, expected = path.read_bytes(), reader.read("documents")
    misread = []  # flips that a reader taking the file as it is returns as other data
    for offset in range(0, len(original), 3):
        flip(path, offset)
        with contextlib.suppress(OSError, pa.ArrowException):
            if pq.read_table(path).to_pylist() != expected.to_pylist():
                misread.append(offset)
        try:
            assert reader.read("documents").equals(expected), offset
        except DamagedFileError:
            pass
        path.write_bytes(original)
    assert misread  # the case is met
    flip(path, misread[len(misread) // 2])
    with pytest.raises(DamagedFileError, match=r"documents/c\.parquet is damaged \(its bytes differ"):
        query(Warehouse(wh.home), "SELECT * FROM documents")
    assert query(Warehouse(wh.home), "SELECT count(*) AS n FROM questions").to_pylist() == [{"n": 1}]


def test_a_file_written_before_page_checksums_is_checked_by_its_whole_digest(wh):
    con = duckdb.connect(str(wh.db_path))
    con.execute("ALTER TABLE partitions DROP COLUMN footer_sha256")  # a registry made before it had one
    con.close()
    assert Warehouse(wh.home).read("documents").num_rows == 3
    flip(documents_file(wh), 350)
    with pytest.raises(DamagedFileError, match=r"documents/c\.parquet is damaged \(its bytes differ"):
        Warehouse(wh.home).read("documents", ["doc_id"])
    ingest(Warehouse(wh.home), force=True)  # the next commit adds the column back and fills it for its file
    assert Warehouse(wh.home).registry()[("documents", "c")].footer_sha256


@pytest.mark.slow
def test_a_file_cut_to_nothing_fails_its_table_instead_of_reading_empty(wh):
    documents_file(wh).write_bytes(b"")
    with pytest.raises(DamagedFileError, match=r"documents/c\.parquet is damaged \(its size differs"):
        query(Warehouse(wh.home), "SELECT count(*) FROM documents")
    assert query(Warehouse(wh.home), "SELECT count(*) AS n FROM questions").to_pylist() == [{"n": 1}]
    assert query(Warehouse(wh.home), "DESCRIBE documents").num_rows == 5  # its columns still show


def test_a_deleted_partition_fails_its_table_and_check_names_it(wh):
    run_stage(wh, "questions", {}, "fv", lambda run: run.write("questions", "nq.validation", dict(
        QUESTIONS, question_id=["q2"], split=["validation"])))
    (wh.tables_dir / "questions" / "nq.validation.parquet").unlink()
    fresh = Warehouse(wh.home)
    with pytest.raises(DamagedFileError, match=r"questions/nq\.validation\.parquet is missing .*run questions-"):
        query(fresh, "SELECT split, count(*) FROM questions GROUP BY split")
    with pytest.raises(DamagedFileError, match="is missing"):
        fresh.read("questions")
    assert fresh.read("questions", partitions=["nq.train"]).num_rows == 1  # what a stage asks for by name reads
    assert [(p.name, why) for p, why, _ in fresh.check_files()] == [("nq.validation.parquet", "it is missing")]


@pytest.mark.slow
def test_two_repairs_in_the_same_second_keep_every_file_they_moved(wh):
    moved = []
    for _ in range(2):
        documents_file(wh).write_bytes(b"garbage")  # damaged again under the same name
        fresh = Warehouse(wh.home)
        moved.append(fresh.quarantine(fresh.check_files()))
        ingest(fresh, force=True)
    assert moved[0] != moved[1] and moved[0].parent == moved[1].parent
    for folder in moved:
        assert (folder / "tables" / "documents" / "c.parquet").read_bytes() == b"garbage"
        assert json.loads((folder / "moved.json").read_text())[0]["file"] == "tables/documents/c.parquet"


@pytest.mark.slow
def test_repair_says_which_tables_lack_the_data_it_moved_until_a_run_rebuilds_it(wh):
    documents_file(wh).write_bytes(b"garbage")
    fresh = Warehouse(wh.home)
    fresh.quarantine(fresh.check_files())
    assert not fresh.check_files()
    assert [e["file"] for e in Warehouse(wh.home).unrebuilt()] == ["tables/documents/c.parquet"]
    ingest(Warehouse(wh.home))
    assert Warehouse(wh.home).unrebuilt() == []


def test_after_two_rounds_of_damage_and_repair_the_latest_move_is_named(wh):
    documents_file(wh).write_bytes(b"garbage")
    fresh = Warehouse(wh.home)
    first = fresh.quarantine(fresh.check_files())
    ingest(fresh, fp="fp2")  # rebuilt by another run, damaged again, moved again
    documents_file(wh).write_bytes(b"garbage again")
    fresh = Warehouse(wh.home)
    second = fresh.quarantine(fresh.check_files())
    rebuilt_by = json.loads((second / "moved.json").read_text())[0]["run_id"]
    [entry] = Warehouse(wh.home).unrebuilt()
    assert first != second and entry["folder"] == str(second) and entry["run_id"] == rebuilt_by


def test_two_repairs_at_once_move_each_file_once_and_leave_no_empty_folder(wh):
    documents_file(wh).write_bytes(b"garbage")
    first, second = Warehouse(wh.home), Warehouse(wh.home)
    problems = [first.check_files(), second.check_files()]  # both found it before either moved it
    moved = first.quarantine(problems[0])
    assert second.quarantine(problems[1]) is None
    assert [p.name for p in (wh.home / "quarantine").iterdir()] == [moved.name]
    assert [e["file"] for e in json.loads((moved / "moved.json").read_text())] == ["tables/documents/c.parquet"]


def test_runs_limit_refuses_a_negative_count_in_one_line(wh):
    out = subprocess.run([sys.executable, "-m", "flows.cli", "--home", str(wh.home), "runs", "--limit", "-1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--limit: takes a whole number, 0 or more" in out.stderr
    assert "Binder" not in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_a_dangling_link_breaks_only_its_own_table_and_repair_moves_the_link(wh):
    segments = wh.tables_dir / "segments" / "s.parquet"
    run_stage(wh, "salient-spans", {}, "fs", lambda run: run.write("segments", "s", {
        "segment_id": ["a#0"], "doc_id": ["a"], "text": ["x"]}))
    segments.unlink()
    segments.symlink_to(wh.home / "nowhere.parquet")
    fresh = Warehouse(wh.home)
    assert query(fresh, "SELECT count(*) AS n FROM documents").to_pylist() == [{"n": 3}]
    assert dict((t, n) for t, _, n in row_counts(fresh))["segments"] is None
    with pytest.raises(DamagedFileError, match=r"segments/s\.parquet is missing \(it is missing: a link"):
        query(fresh, "SELECT * FROM segments")
    assert [(p.name, why) for p, why, _ in fresh.check_files()] == [("s.parquet", "it is missing: a link to a "
                                                                                  "file that is not there")]
    ingest(fresh, fp="fp2")  # another stage still commits
    aside = fresh.quarantine(fresh.check_files())
    assert (aside / "tables" / "segments" / "s.parquet").is_symlink() and not os.path.lexists(segments)
    assert not Warehouse(wh.home).check_files() and Warehouse(wh.home).read("segments").num_rows == 0


@pytest.mark.slow
def test_random_bytes_of_the_same_size_do_not_stop_another_stage_or_a_copy(wh):
    path = wh.tables_dir / "questions" / "nq.train.parquet"
    path.write_bytes(os.urandom(path.stat().st_size))
    run_stage(Warehouse(wh.home), "ingest", {"corpus": "c2"}, "c2", lambda run: run.write(
        "documents", "c2", dict(DOCS, corpus=["c2"] * 3)))
    copy = Warehouse(shutil.copytree(wh.home, wh.home.with_name("copy")), create=False)
    assert query(copy, "SELECT count(*) AS n FROM documents").to_pylist() == [{"n": 6}]
    with pytest.raises(DamagedFileError, match=r"questions/nq\.train\.parquet is damaged"):
        query(copy, "SELECT * FROM questions")
    con = duckdb.connect(str(copy.db_path), read_only=True)  # the duckdb CLI's view fails in the same line
    with pytest.raises(duckdb.InvalidInputException, match=r"nq\.train\.parquet is damaged"):
        con.execute("SELECT * FROM questions").fetchall()
    assert con.execute("SELECT count(*) FROM documents").fetchone() == (6,)
    con.close()


def test_a_lost_warehouse_file_is_named_and_adopt_registers_what_tables_still_hold(wh):
    wh.db_path.unlink()
    for create in (False, True):  # neither a read nor a stage run starts a registry that would disown them
        with pytest.raises(WarehouseError, match=r"warehouse\.duckdb is gone, but .*tables still holds 2 Parquet "
                                                 r"files that runs committed: `nkb --home .* check --adopt`"):
            Warehouse(wh.home, create=create)
    adopted = Warehouse(wh.home, create=False, adopt=True).adopted
    assert sorted((r.table, r.partition, r.rows) for r in adopted) == [("documents", "c", 3),
                                                                       ("questions", "nq.train", 1)]
    fresh = Warehouse(wh.home, create=False)
    assert not fresh.check_files() and fresh.read("documents").num_rows == 3
    assert not ingest(fresh).skipped  # the run records went with the file: the stage runs once more


def sharded_ingest(wh, written: list, crash_after: int | None = None):
    """An ingest of three shards of one document each (`written` gets each shard it writes), stopped by Ctrl-C
    after `crash_after` of them."""
    def body(run):
        shards = run.shards("documents", "c")
        for index in range(3):
            if index == crash_after:
                raise KeyboardInterrupt("simulated crash")
            if not shards.is_done(index):
                shards.write(index, {key: values[index:index + 1] for key, values in DOCS.items()})
                written.append(index)
    return run_stage(wh, "ingest", {"corpus": "c"}, "sharded", body, resumable=True)


def test_an_interrupted_run_resumes_its_shards_under_the_same_code_and_writes_them_again_under_other_code(
        tmp_path, monkeypatch):
    import warehouse.commit as commit
    for version, resumed in (("abc123", True), ("def456", False)):
        wh, written = Warehouse(tmp_path / version), []
        monkeypatch.setattr(commit, "code_version", lambda: "abc123")
        with pytest.raises(KeyboardInterrupt):
            sharded_ingest(wh, written, crash_after=1)
        monkeypatch.setattr(commit, "code_version", lambda: version)  # the code updated between the two
        result = sharded_ingest(wh, written)
        assert written == ([0, 1, 2] if resumed else [0, 0, 1, 2])
        assert result.run.code_version == version
        assert query(wh, "SELECT doc_id FROM documents ORDER BY 1").column("doc_id").to_pylist() == ["1", "2", "3"]
        assert ("not_resumed" in result.run.outputs) is not resumed
        assert not list(wh.tables_dir.glob(".resume-*")) and not list(wh.tables_dir.glob("*/.staging/resume-*"))
