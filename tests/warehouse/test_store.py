import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest

from warehouse import Warehouse, WarehouseError, get_run, list_runs, query, row_counts, run_stage
from warehouse.sql import sandbox

DOCS = {"doc_id": ["1", "2"], "title": ["A", "B"], "text": ["x", "y"], "corpus": ["c", "c"]}


def write_docs(wh, partition="c", data=DOCS, fp="fp1", force=False):
    return run_stage(wh, "ingest", {"corpus": partition}, fp, lambda run: run.write("documents", partition, data),
                     force=force)


def snapshot(wh: Warehouse) -> dict:
    """Every file under tables/ with its bytes, plus every table's rows except runs."""
    files = {str(p.relative_to(wh.home)): p.read_bytes() for p in wh.tables_dir.rglob("*") if p.is_file()}
    with sandbox(wh) as con:  # one connection for all tables
        rows = {t: con.sql(f'SELECT * FROM "{t}"').to_arrow_table().to_pylist()
                for t, _, _ in row_counts(wh) if t != "runs"}
    return {"files": files, "rows": rows}


def test_write_read_and_views(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    result = write_docs(wh)
    assert not result.skipped and result.run.outputs == {"documents": 2}
    assert wh.read("documents").column("doc_id").to_pylist() == ["1", "2"]
    rows = query(wh, "SELECT doc_id, run_id FROM documents ORDER BY doc_id").to_pylist()
    assert rows == [{"doc_id": "1", "run_id": result.run.run_id}, {"doc_id": "2", "run_id": result.run.run_id}]
    # An empty table still has its columns.
    assert query(wh, "SELECT * FROM retrievals").column_names[:3] == ["question_id", "dataset", "rank"]


def test_views_use_absolute_paths(tmp_path, monkeypatch):
    wh = Warehouse(tmp_path / "wh")
    write_docs(wh)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    con = duckdb.connect(str(wh.db_path), read_only=True)
    assert con.execute("SELECT count(*) FROM documents").fetchone() == (2,)
    con.close()


def test_a_moved_warehouse_still_answers_queries(tmp_path):
    import shutil
    wh = Warehouse(tmp_path / "wh")
    write_docs(wh)
    shutil.move(tmp_path / "wh", tmp_path / "moved")
    moved = Warehouse(tmp_path / "moved")  # its views are redone to point at the new place
    assert query(moved, "SELECT count(*) AS n FROM documents").to_pylist() == [{"n": 2}]
    assert Warehouse(tmp_path / "moved")._views_point_here()


def test_plain_duckdb_cli_opens_the_file(tmp_path):
    cli = shutil.which("duckdb") or str(Path(sys.executable).parent / "duckdb")
    if not os.path.exists(cli):
        pytest.skip("duckdb CLI not installed (pip install duckdb-cli)")
    wh = Warehouse(tmp_path / "wh")
    write_docs(wh)
    out = subprocess.run([cli, "-csv", str(wh.db_path), "-c", "SHOW TABLES; SELECT count(*) AS n FROM documents;"],
                         capture_output=True, text=True, cwd="/", timeout=60)
    assert out.returncode == 0, out.stderr
    for name, _, _ in row_counts(wh):
        assert name in out.stdout.split()
    assert out.stdout.strip().endswith("n\n2")


def test_partition_replaced_not_appended(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    write_docs(wh)
    write_docs(wh, data={k: v[:1] for k, v in DOCS.items()}, fp="fp2")
    write_docs(wh, partition="other", data=dict(DOCS, corpus=["other"] * 2), fp="fp3")
    counts = query(wh, "SELECT corpus, count(*) AS n FROM documents GROUP BY 1 ORDER BY 1").to_pylist()
    assert counts == [{"corpus": "c", "n": 1}, {"corpus": "other", "n": 2}]


def test_rerun_is_skipped_unless_forced(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    first = write_docs(wh)
    again = write_docs(wh)
    assert again.skipped and again.run.run_id == first.run.run_id
    forced = write_docs(wh, force=True)
    assert not forced.skipped and forced.run.run_id != first.run.run_id
    changed = write_docs(wh, fp="fp-new")
    assert not changed.skipped
    assert [r.status for r in list_runs(wh)] == ["success"] * 3


def test_still_valid_can_veto_a_skip(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    body = lambda run: None  # noqa: E731
    run_stage(wh, "s", {}, "fp", body)
    assert run_stage(wh, "s", {}, "fp", body, still_valid=lambda r: True).skipped
    assert not run_stage(wh, "s", {}, "fp", body, still_valid=lambda r: False).skipped


def test_failing_stage_leaves_tables_as_they_were(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    write_docs(wh)
    before = snapshot(wh)

    def body(run):
        run.write("documents", "c", {k: v * 3 for k, v in DOCS.items()})
        run.write("questions", "q.train", {"question_id": ["q"], "dataset": ["q"], "split": ["train"],
                                           "question": ["?"], "answers": [["a"]]})
        run.metric("m", 1.0)
        raise RuntimeError("bad input")

    with pytest.raises(RuntimeError):
        run_stage(wh, "ingest", {}, "fp-bad", body)
    assert snapshot(wh) == before
    failed = list_runs(wh)[0]
    assert failed.status == "failed" and failed.error == "RuntimeError: bad input" and failed.outputs == {}
    assert not list(wh.tables_dir.glob("*/.staging/*"))


def test_a_stage_that_writes_a_table_it_did_not_declare_fails_and_leaves_the_tables_as_they_were(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    write_docs(wh)
    before = snapshot(wh)

    def body(run):
        run.write("documents", "c", {k: v * 2 for k, v in DOCS.items()})
        run.write("retrievals", "q", {"question_id": ["q"], "dataset": ["q"], "rank": [1], "doc_id": ["1"],
                                      "score": [1.0], "index_id": ["i"]})

    with pytest.raises(ValueError, match="ingest writes retrievals, which it does not declare .it writes documents"):
        run_stage(wh, "ingest", {}, "fp-undeclared", body, writes=frozenset({"documents"}))
    assert snapshot(wh) == before


def test_every_stage_declares_only_tables_there_are():
    from stages.registry import STAGES
    from warehouse import PARQUET_TABLES
    assert all(stage.writes <= set(PARQUET_TABLES) for stage in STAGES.values())


@pytest.mark.slow
def test_killed_writer_leaves_previous_table_intact(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    write_docs(wh)
    before = snapshot(wh)
    script = textwrap.dedent(f"""
        import sys, time
        from warehouse import Warehouse, run_stage
        wh = Warehouse({str(wh.home)!r})
        def body(run):
            with run.writer("documents", "c") as w:
                for i in range(10**6):
                    w.write({{"doc_id": [str(i)], "title": ["t"], "text": ["x" * 1000], "corpus": ["c"]}})
                    if i == 50:
                        print("writing", flush=True)
        run_stage(wh, "ingest", {{}}, "fp-killed", body)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    assert list(wh.tables_dir.glob("documents/.staging/*/c.parquet")), "expected a staged file mid-write"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert snapshot(wh)["rows"] == before["rows"]
    assert wh.partition_files("documents") == [wh.partition_path("documents", "c")]
    assert [r.run_id for r in list_runs(wh)] == [r.run_id for r in list_runs(wh)[:1]]  # no row for the killed run
    write_docs(wh, fp="fp-after")  # the next run sweeps the dead run's staging files
    assert not list(wh.tables_dir.glob("*/.staging/*"))


def publish(wh, text, fp, fail=False, force=False):
    """A stage that publishes files/models/m holding `text`, with a training checkpoint it supersedes."""
    work = wh.files_dir / "models" / ".train-m"
    work.mkdir(parents=True, exist_ok=True)

    def body(run):
        run.publish_folder(wh.files_dir / "models" / "m", lambda d: (d / "weights").write_text(text), drop=work)
        if fail:
            raise RuntimeError("failed after publishing")

    return run_stage(wh, "model", {}, fp, body, force=force)


def test_a_published_folder_appears_only_when_the_run_commits(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    final = wh.files_dir / "models" / "m"
    with pytest.raises(RuntimeError):
        publish(wh, "first", "fp1", fail=True)
    assert not final.exists() and (wh.files_dir / "models" / ".train-m").is_dir()  # the checkpoint stays
    publish(wh, "first", "fp1")
    assert (final / "weights").read_text() == "first" and not (wh.files_dir / "models" / ".train-m").exists()
    with pytest.raises(RuntimeError):
        publish(wh, "second", "fp1", fail=True, force=True)
    assert (final / "weights").read_text() == "first"
    publish(wh, "second", "fp1", force=True)
    assert (final / "weights").read_text() == "second"
    assert sorted(p.name for p in final.parent.iterdir()) == [".staging", "m"] and not any((final.parent / ".staging").iterdir())


@pytest.mark.slow
def test_a_killed_run_leaves_its_folder_unpublished_and_the_next_run_sweeps_it(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from warehouse import Warehouse, run_stage
        wh = Warehouse({str(wh.home)!r})
        def fill(d):
            (d / "weights").write_text("half")
            print("writing", flush=True)
            time.sleep(60)
        run_stage(wh, "model", {{}}, "fp-killed", lambda run: run.publish_folder(wh.files_dir / "models" / "m", fill))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert not (wh.files_dir / "models" / "m").exists()
    assert list(wh.files_dir.glob("models/.staging/*/m/weights"))
    publish(wh, "next", "fp2")
    assert not list(wh.files_dir.glob("models/.staging/*"))


def test_a_published_file_appears_at_commit_and_the_scratch_folder_goes_with_the_run(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    plot = wh.files_dir / "analysis" / "p.png"
    scratches = []

    def body(text, fail):
        def run_body(run):
            scratch = run.scratch(plot)
            (scratch / "export").write_text("temporary")
            scratches.append(scratch)
            run.publish_file(plot, lambda path: path.write_text(text))
            assert not plot.exists() or plot.read_text() != text  # nothing new before the commit
            with pytest.raises(ValueError, match="twice"):
                run.publish_file(plot, lambda path: None)
            if fail:
                raise RuntimeError("failed after publishing")
        return run_body

    with pytest.raises(RuntimeError):
        run_stage(wh, "analyze", {}, "fp1", body("first", fail=True))
    assert not plot.exists() and not scratches[-1].exists()
    run_stage(wh, "analyze", {}, "fp1", body("first", fail=False))
    assert plot.read_text() == "first" and not scratches[-1].exists()
    with pytest.raises(RuntimeError):
        run_stage(wh, "analyze", {}, "fp1", body("second", fail=True), force=True)
    assert plot.read_text() == "first"
    run_stage(wh, "analyze", {}, "fp1", body("second", fail=False), force=True)
    assert plot.read_text() == "second"
    assert sorted(p.name for p in plot.parent.iterdir()) == [".staging", "p.png"]
    assert not any((plot.parent / ".staging").iterdir())


@pytest.mark.slow
def test_writers_wait_for_the_lock(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    ready = tmp_path / "imported"
    script = textwrap.dedent(f"""
        import pathlib
        from warehouse import Warehouse, run_stage
        wh = Warehouse({str(wh.home)!r})
        pathlib.Path({str(ready)!r}).touch()
        run_stage(wh, "ingest", {{}}, "fp-wait", lambda run: run.write("documents", "c", {DOCS!r}))
    """)
    with wh.lock(exclusive=True):
        proc = subprocess.Popen([sys.executable, "-c", script])
        deadline = time.monotonic() + 60
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1)  # the writer is past its imports: a second is ample to reach the lock and wait there
        assert proc.poll() is None, "the second writer should block while the lock is held"
    assert proc.wait(timeout=60) == 0
    assert query(wh, "SELECT count(*) AS n FROM documents").to_pylist() == [{"n": 2}]


@pytest.mark.parametrize("bad", ["../x", "a/b", "", ".hidden", "a b"])
def test_bad_partition_names_are_refused(tmp_path, bad):
    wh = Warehouse(tmp_path / "wh")
    with pytest.raises(WarehouseError, match="partition name"):
        wh.partition_path("documents", bad)


def test_unknown_table(tmp_path):
    with pytest.raises(WarehouseError, match="unknown table 'nope'"):
        Warehouse(tmp_path / "wh").read("nope")


def test_run_record_has_provenance(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    run = write_docs(wh).run
    stored = get_run(wh, run.run_id)
    assert stored.config == {"corpus": "c"} and stored.inputs_fingerprint == "fp1"
    assert stored.code_version and stored.host and stored.finished_at >= stored.started_at


def test_a_warehouse_made_before_metrics_named_their_model_takes_new_metrics_and_keeps_its_old_ones(tmp_path):
    """`metrics` gained a `model` column: a warehouse from before keeps its rows (model NULL) and records new ones."""
    wh = Warehouse(tmp_path / "wh")
    write_docs(wh)
    con = duckdb.connect(str(wh.db_path))
    con.execute("ALTER TABLE metrics DROP COLUMN model")  # the table as the code before wrote it
    con.execute("INSERT INTO metrics VALUES ('old-run', NULL, NULL, 'em', 1.0, NULL)")
    con.close()
    run_stage(wh, "evaluate", {}, "fp-new", lambda run: run.metric("em", 2.0), model="base+nkb.5shot")
    rows = query(wh, "SELECT run_id = 'old-run' AS old, model, value FROM metrics ORDER BY value").to_pylist()
    assert rows == [{"old": True, "model": None, "value": 1.0}, {"old": False, "model": "base+nkb.5shot", "value": 2.0}]
