"""The command line where a user's input or machine is at fault (issue 37): every case is one line that says what
is wrong and what to do, and changes nothing."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from flows.cli import main
from tests.flows.test_cli import home, run_cli  # noqa: F401 (the fixture)
from warehouse import Warehouse

ENDLESS = "SELECT count(*) FROM range(1000000000000) t(i) WHERE hash(i) = 42"


def hears_ctrl_c() -> None:
    """In the child, before it starts: Ctrl-C as a terminal delivers it. A suite started in the background
    (`make test &`) runs with SIGINT ignored, which a child inherits, and Python then installs no handler of its own."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_ctrl_c_stops_a_query_at_once(home):
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "--home", home, "sql", ENDLESS],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=hears_ctrl_c)
    try:
        time.sleep(4)  # start-up and the query under way
        assert proc.poll() is None
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()  # a query that did not stop would run on, endless, on one of the machine's cores
    assert proc.returncode == 130 and time.monotonic() - sent < 5
    assert err.strip() == "interrupted; the query was stopped"


@pytest.mark.slow
def test_a_query_stops_at_its_timeout(capsys, home, monkeypatch):
    started = time.monotonic()
    code, _, err = run_cli(capsys, "--home", home, "sql", "--timeout", "1", ENDLESS)
    assert code == 1 and "ran longer than its timeout of 1 s" in err and time.monotonic() - started < 10
    monkeypatch.setenv("NKB_SQL_TIMEOUT", "1")  # a shared machine's default
    code, _, err = run_cli(capsys, "--home", home, "sql", ENDLESS)
    assert code == 1 and "timeout of 1 s" in err


def test_read_commands_on_a_mistyped_home_say_so_and_create_nothing(capsys, tmp_path):
    for argv in (["sql", "SELECT 1"], ["tables"], ["runs"], ["report"], ["check"]):
        code, _, err = run_cli(capsys, "--home", str(tmp_path / "typo"), *argv)
        assert code == 1 and f"no warehouse at {tmp_path / 'typo'}" in err, argv
    assert not (tmp_path / "typo").exists()
    (tmp_path / "file").write_text("")
    code, _, err = run_cli(capsys, "--home", str(tmp_path / "file"), "run", "ingest", "--set", "path=x")
    assert code == 1 and "is a file, not a warehouse directory" in err


def test_sql_shows_no_path_runs_several_statements_and_pivots(capsys, home, tmp_path):
    for query in ("SELECT * FROM duckdb_settings()", "SELECT * FROM duckdb_databases()"):
        code, out, _ = run_cli(capsys, "--home", home, "sql", query, "--format", "json")
        assert code == 0 and home not in out and str(Path.home()) not in out, out
    code, out, _ = run_cli(capsys, "--home", home, "sql", "SELECT 1 AS a; SELECT 2 AS b", "--format", "json")
    assert code == 0 and json.loads(out) == [{"b": 2}]
    code, out, err = run_cli(capsys, "--home", home, "sql",
                             "PIVOT (SELECT * FROM (VALUES ('x', 1), ('y', 2)) t(k, v)) ON k USING sum(v)",
                             "--format", "json")
    assert code == 0 and json.loads(out) == [{"x": 1, "y": 2}], err


def test_sql_writes_parquet_where_asked(capsys, home, tmp_path):
    code, _, _ = run_cli(capsys, "--home", home, "sql", "SELECT 1 AS a, 'x' AS b", "--output", str(tmp_path / "r.parquet"))
    assert code == 0 and pq.read_table(tmp_path / "r.parquet").to_pylist() == [{"a": 1, "b": "x"}]


@pytest.mark.slow
def test_check_lists_damage_with_the_command_that_rebuilds_it_and_repair_moves_it_aside(capsys, home, tmp_path):
    path = tmp_path / "wiki.jsonl"
    path.write_text('{"id": "a", "title": "A", "text": "Ada."}\n')
    assert run_cli(capsys, "--home", home, "run", "ingest", "--set", f"path={path}")[0] == 0
    assert run_cli(capsys, "--home", home, "check")[0] == 0
    (Path(home) / "tables" / "documents" / "wiki.parquet").write_bytes(b"junk")
    code, out, _ = run_cli(capsys, "--home", home, "check")
    assert code == 2 and "tables/documents/wiki.parquet: its size differs from what was written" in out
    rebuild = out.split("rebuild it: ")[1].strip()
    assert f" --home {home} run ingest " in rebuild and f"--set path={path}" in rebuild
    code, out, _ = run_cli(capsys, "--home", home, "check", "--repair")
    assert code == 2 and "Moved what was there to" in out
    code, out, _ = run_cli(capsys, "--home", home, "check")  # the files are as committed, the data is not back
    assert code == 2 and "Not rebuilt since --repair moved it aside, so its table lacks its rows" in out
    assert f"tables/documents/wiki.parquet (in quarantine/" in out and "rebuild it: " in out
    code, out, _ = run_cli(capsys, "--home", home, "run", "ingest", "--set", f"path={path}")
    assert code == 0 and "documents=1" in out  # rebuilt, not skipped as unchanged
    assert run_cli(capsys, "--home", home, "check")[0] == 0


def test_help_names_each_fields_kind_and_edit_errors_read_as_sentences(capsys, home, tmp_path):
    with pytest.raises(SystemExit):
        main(["run", "ingest", "--help"])
    out = capsys.readouterr().out
    assert "corpus=str" in out and "Annotated" not in out
    with pytest.raises(SystemExit) as refused:
        main(["--home", home, "edit", "--model", "m"])
    assert str(refused.value.code) == ("error: give a question and its answer, or edits (a JSONL file): none is "
                                       "given (or each is empty)")


@pytest.mark.parametrize("given, wrong", [
    (["--question", "who wrote it?", "--answer", ""], "the question needs an answer: answer is empty or not given"),
    (["--question", "who wrote it?"], "the question needs an answer: answer is empty or not given"),
    (["--question", " ", "--answer", "Kim"], "the answer needs a question: question is empty or not given"),
    (["--question", "", "--answer", ""], "give a question and its answer, or edits (a JSONL file): none is given "
                                         "(or each is empty)"),
    (["--question", "q", "--answer", "a", "--edits", "e.jsonl"], "give question and answer, or edits (a JSONL "
                                                                  "file), not both"),
    (["--answer", "a", "--edits", "e.jsonl"], "give question and answer, or edits (a JSONL file), not both"),
])
def test_an_edit_says_which_of_question_answer_and_edits_is_wrong(capsys, home, given, wrong):
    """Issue 100: `edit --answer ""` said "not both"."""
    with pytest.raises(SystemExit) as refused:
        main(["--home", home, "edit", "--model", "m", *given])
    assert str(refused.value.code) == f"error: {wrong}"


def test_edit_reads_its_edits_file_before_looking_for_the_model(capsys, home, tmp_path):
    edits = tmp_path / "edits.jsonl"
    edits.write_text('{"question": "q"}\n')
    code, _, err = run_cli(capsys, "--home", home, "edit", "--model", "no-such-model", "--edits", str(edits))
    assert code == 1 and str(edits) in err and "no-such-model" not in err


def test_schedule_checks_cron_and_zone_before_looking_for_a_server(capsys, tmp_path):
    experiment = Path(__file__).resolve().parents[2] / "experiments" / "sample-world.yaml"
    for flags, wrong in ((["--cron", "61 * * * *"], "cron '61 * * * *'"), (["--timezone", "Mars/Olympus"],
                                                                            "'Mars/Olympus'")):
        code, _, err = run_cli(capsys, "schedule", str(experiment), "--project", str(tmp_path), *flags)
        assert code == 1 and wrong in err and "no server" not in err, err


def test_a_pipeline_is_refused_before_prefect_starts(capsys, tmp_path):
    """Missing input files, an unreadable experiment and a warehouse that cannot be written: one line each, in
    about a second, with no Prefect state made."""
    experiment = tmp_path / "mine.yaml"
    experiment.write_text("name: mine\nknowledge: [{path: k.jsonl, corpus: k}]\npretrain: {size: tiny}\n"
                          "questions: [{path: t.jsonl, format: nq_open, dataset: nq, split: train},\n"
                          "            {path: v.jsonl, format: nq_open, dataset: nq, split: validation}]\n")
    (tmp_path / "t.jsonl").write_text("")
    home = str(tmp_path / "wh")
    started = time.monotonic()
    code, _, err = run_cli(capsys, "--home", home, "pipeline", str(experiment))
    assert code == 1 and "no such file for knowledge[0]: " in err and "questions[1]: " in err
    assert "questions[0]" not in err and not (tmp_path / "wh").exists()
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    code, _, err = run_cli(capsys, "--home", home, "pipeline", str(latin))
    assert code == 1 and f"{latin}: not UTF-8 text (byte 0xe9 at offset 9)" in err
    huge = tmp_path / "huge.yaml"
    huge.write_text("name: x\n" + "# padding\n" * 200_000)
    code, _, err = run_cli(capsys, "--home", home, "pipeline", str(huge))
    assert code == 1 and "is not an experiment file" in err and len(err) < 300
    assert time.monotonic() - started < 10 and not (tmp_path / "wh").exists()


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_the_warehouse_keeps_its_state(capsys, tmp_path):
    from tests.warehouse.test_faults import fill, small_disk
    corpus = tmp_path / "wiki.jsonl"
    rng = __import__("random").Random(0)
    words = lambda n: " ".join(f"{rng.getrandbits(40):x}" for _ in range(n))  # noqa: E731 (incompressible)
    corpus.write_text("".join(json.dumps({"id": str(i), "title": f"T{i}", "text": words(1000)}) + "\n"
                              for i in range(50)))
    with small_disk(tmp_path / "disk", "3m") as disk:
        home = str(disk / "wh")
        Warehouse(home)
        filler = fill(disk, 40)
        code, _, err = run_cli(capsys, "--home", home, "run", "ingest", "--set", f"path={corpus}")
        assert code == 1 and err.startswith("error: the disk is full") and len(err.strip().splitlines()) == 1, err
        filler.unlink()
        tables = run_cli(capsys, "--home", home, "tables")[1]
        assert len(re.findall(r"^documents +parquet +0$", tables, re.M)) == 1
        code, out, _ = run_cli(capsys, "--home", home, "run", "ingest", "--set", f"path={corpus}")
        assert code == 0 and "documents=50" in out


def test_a_base_model_that_is_not_here_is_refused_before_the_first_stage(capsys, tmp_path):
    experiment = tmp_path / "mine.yaml"
    experiment.write_text("name: mine\nbase_model: models/t5-bse\nknowledge: [{path: k.jsonl, corpus: k}]\n"
                          "questions: [{path: k.jsonl, format: nq_open, dataset: nq, split: train},\n"
                          "            {path: k.jsonl, format: nq_open, dataset: nq, split: validation}]\n")
    (tmp_path / "k.jsonl").write_text("")
    started = time.monotonic()
    code, _, err = run_cli(capsys, "--home", str(tmp_path / "wh"), "pipeline", str(experiment))
    assert code == 1 and "base_model: models/t5-bse: no such folder or file" in err and "hub:NAME" in err, err
    assert time.monotonic() - started < 10 and not (tmp_path / "wh").exists()


def test_a_device_this_machine_lacks_is_refused_before_any_stage_runs(capsys, tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    home = str(tmp_path / "wh")
    for argv in (["run", "inject", "--set", "device=cuda"], ["demo", "--set", "device=cuda"]):
        code, _, err = run_cli(capsys, "--home", home, *argv)
        assert code == 1 and err.startswith("error: device=cuda was asked for, but this machine has no CUDA GPU")
        assert len(err.strip().splitlines()) == 1 and not Path(home).exists(), argv


def test_a_timeout_that_would_never_stop_or_means_nothing_is_refused(capsys, home, monkeypatch):
    for value in ("-1", "nan", "inf", "soon"):
        with pytest.raises(SystemExit) as refused:
            main(["--home", home, "sql", "SELECT 1", "--timeout", value])
        assert refused.value.code == 2 and f"takes seconds, 0 or more (0: no limit), not '{value}'" in \
            capsys.readouterr().err
    monkeypatch.setenv("NKB_SQL_TIMEOUT", "-5")
    code, _, err = run_cli(capsys, "--home", home, "sql", "SELECT 1")
    assert code == 1 and "$NKB_SQL_TIMEOUT takes seconds" in err


def test_an_output_file_on_a_full_disk_is_not_left_behind_empty(capsys, home, tmp_path):
    from tests.warehouse.test_faults import fill, small_disk
    with small_disk(tmp_path / "disk", "1m") as disk:
        fill(disk, 0)
        for name in ("x.csv", "x.parquet"):
            code, _, err = run_cli(capsys, "--home", home, "sql", "SELECT * FROM range(100000)", "--output",
                                   str(disk / "out" / name))
            assert code == 1 and err.startswith("error: the disk is full"), err
        assert sorted(p.name for p in disk.rglob("*")) == ["filler", "out"]


@pytest.mark.slow
def test_ctrl_c_during_torchs_import_waits_for_it_and_then_interrupts():
    """Issue 53: Ctrl-C that landed inside torch's import left it half made, and the next import of it failed with
    `could not parse dispatch key: MPS` in place of the "interrupted" line. Here the signal comes 0.3 s into it."""
    script = ("import os, signal, sys, threading\n"
              "from flows.cli_common import import_uninterrupted\n"
              "assert 'torch' not in sys.modules\n"
              "threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
              "try:\n    import_uninterrupted('torch', 'transformers')\n"
              "except KeyboardInterrupt:\n    import torch.nn\n"
              "    print('interrupted after the import', torch.nn.Linear)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2], preexec_fn=hears_ctrl_c)
    assert done.stdout.startswith("interrupted after the import <class 'torch.nn.modules.linear.Linear'>"), done.stderr


def test_an_empty_rows_list_is_refused_before_anything_runs(capsys, tmp_path):
    """Issue 100: `--set rows=[]` exited 0 after training every row the plan knows."""
    experiment = Path(__file__).resolve().parents[2] / "experiments" / "sample-world.yaml"
    home = str(tmp_path / "wh")
    started = time.monotonic()
    for argv in (["pipeline", str(experiment)], ["demo"]):
        code, _, err = run_cli(capsys, "--home", home, *argv, "--set", "rows=[]")
        assert code == 1 and "rows: [] names no row to train" in err and len(err.strip().splitlines()) == 1, err
    assert time.monotonic() - started < 10 and not Path(home).exists()


def test_server_up_without_a_prefect_yaml_is_refused_before_anything_starts(capsys, tmp_path):
    """Issue 100: it started a server, then printed Prefect's raw deploy failure."""
    import socket
    with socket.socket() as probe:  # a port no one listens on: the old code started a server there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    code, _, err = run_cli(capsys, "server", "up", "--project", str(tmp_path), "--port", str(port))
    ours = Path(__file__).resolve().parents[2]
    assert code == 1 and err == (f"error: {tmp_path} has no prefect.yaml (the deployments to start): give --project "
                                 f"the folder that holds it (this installation's: --project {ours})\n"), err
    assert list(tmp_path.iterdir()) == [] and time.monotonic() - started < 5  # no state, no server


def test_shots_beyond_the_train_split_are_refused_before_the_first_stage(capsys, tmp_path):
    """Issue 100: `shots=1000` was refused only after six data stages ran (~14 s)."""
    home = str(tmp_path / "wh")
    started = time.monotonic()
    code, _, err = run_cli(capsys, "--home", home, "demo", "--set", "shots=1000")
    assert code == 1 and "shots=1000 draws 1000 solved examples" in err and "(nothing was run)" in err, err
    assert len(err.strip().splitlines()) == 1 and time.monotonic() - started < 10 and not Path(home).exists()


@pytest.mark.slow
def test_ctrl_c_during_injection_after_lucene_exits_130_records_the_run_and_leaves_no_crash_report(tmp_path):
    """The pipeline has searched Lucene (the JVM is in the process) and is injecting when Ctrl-C comes: the JVM
    once took the signal and exited the process from a Java thread under the training, a SIGSEGV and a JVM crash
    report in the user's folder."""
    import yaml

    from stages.experiment import SAMPLE_WORLD, apply_sets
    from tests.experiments import TINY_SETS
    experiment = tmp_path / "tiny.yaml"
    experiment.write_text(yaml.safe_dump(apply_sets(yaml.safe_load(open(SAMPLE_WORLD)),
                                                    TINY_SETS + ["stages.inject.steps=100000"])))
    workdir = tmp_path / "work"
    workdir.mkdir()
    home = tmp_path / "wh"
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "--home", str(home), "pipeline", str(experiment)],
                            cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=hears_ctrl_c, env=os.environ | {"NKB_PROGRESS": "1",
                                                                        "PYTHONPATH": str(Path.cwd())})
    output = []
    try:
        for line in proc.stdout:  # until the injection's steps are under way
            output.append(line)
            if line.startswith("inject base+nkb:"):  # its progress bar: the steps have begun
                break
        time.sleep(2)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    text = "".join(output) + rest
    assert proc.returncode == 130, text[-3000:]
    assert "interrupted; the warehouse is unchanged by the unfinished stage" in text
    assert "fatal error" not in text and "SIGSEGV" not in text and "Traceback" not in text
    assert list(workdir.iterdir()) == []  # no hs_err_pid*.log, nothing else
    failed = [r for r in __import__("warehouse").list_runs(Warehouse(home)) if r.status == "failed"]
    assert [r.stage for r in failed] == ["inject"] and "KeyboardInterrupt" in failed[0].error
