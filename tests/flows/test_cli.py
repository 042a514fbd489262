import json
import re
import subprocess
import sys

import pytest

from flows.cli import main


@pytest.fixture
def home(tmp_path):
    """An empty warehouse's folder (read commands refuse a folder without one)."""
    from warehouse import Warehouse
    return str(Warehouse(tmp_path / "wh").home)


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_stage_help_lists_config_fields(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "questions", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for field in ("path=str", "format=nq_open|webquestions|headqa|triviaqa|jsonl", "dataset=str", "split=str",
                  "max_answer_tokens=int  (default 5)", "Drop answers longer than"):
        assert field in out


@pytest.mark.slow
def test_run_ingest_then_skip(capsys, home, tmp_path):
    path = tmp_path / "wiki.jsonl"
    path.write_text('{"id": "a", "title": "A", "text": "Ada."}\n')
    code, out, _ = run_cli(capsys, "--home", home, "run", "ingest", "--set", f"path={path}")
    assert code == 0 and "ingest corpus wiki: run ingest-" in out and "documents=1" in out
    code, out, _ = run_cli(capsys, "--home", home, "run", "ingest", "--set", f"path={path}")
    assert code == 0 and "skipped" in out
    code, out, _ = run_cli(capsys, "--home", home, "run", "ingest", "--set", f"path={path}", "--force")
    assert code == 0 and "skipped" not in out
    code, out, _ = run_cli(capsys, "--home", home, "sql", "SELECT corpus, title FROM documents", "--format", "json")
    assert json.loads(out) == [{"corpus": "wiki", "title": "A"}]
    code, out, _ = run_cli(capsys, "--home", home, "runs")
    assert out.count("ingest-") == 2 and "success" in out and "corpus wiki" in out
    code, out, _ = run_cli(capsys, "--home", home, "runs", "--format", "json")
    runs = json.loads(out)
    assert runs[0]["outputs"]["documents"] == 1 and runs[0]["config"]["corpus"] == "wiki"  # objects, not strings
    code, out, _ = run_cli(capsys, "--home", home, "tables")
    assert any(line.split()[:3] == ["documents", "parquet", "1"] for line in out.splitlines())


def test_unknown_field_and_bad_value(capsys, home):
    with pytest.raises(SystemExit, match="has no config field 'nope'"):
        main(["--home", home, "run", "ingest", "--set", "nope=1"])
    with pytest.raises(SystemExit, match="people: Input should be greater than or equal to 5"):
        main(["--home", home, "run", "sample-world", "--set", "people=2"])


def test_pipeline_names_the_experiment_file_and_key_at_fault(capsys, home, tmp_path):
    code, _, err = run_cli(capsys, "--home", home, "demo", "--set", "stages.inject.stepz=3")
    assert code == 1 and err.startswith("error: ") and "sample-world-smollm2.yaml: stages.inject: no setting" in err
    for arch in (["--arch", "t5"], ["--full"]):  # the paper's experiment on tiny T5 bases
        code, _, err = run_cli(capsys, "--home", home, "demo", *arch, "--set", "stages.inject.stepz=3")
        assert code == 1 and "/sample-world.yaml: stages.inject: no setting 'stepz'" in err
    code, _, err = run_cli(capsys, "--home", home, "demo", "--full", "--arch", "smollm2")
    assert code == 1 and err.startswith("error: --full adds the paper's rows on bases built here")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nknowledge: [{path: a.jsonl, corpus: a}\n")
    code, _, err = run_cli(capsys, "--home", home, "pipeline", str(broken))
    assert code == 1 and f"{broken}, line 3, column 1: not valid YAML" in err
    code, _, err = run_cli(capsys, "--home", home, "pipeline", str(tmp_path / "none.yaml"))
    assert code == 1 and "none.yaml: cannot read the experiment (No such file or directory)" in err


def test_missing_file_is_one_line(capsys, home, tmp_path):
    code, _, err = run_cli(capsys, "--home", home, "run", "ingest", "--set", f"path={tmp_path}/none.xml.bz2")
    assert code == 1 and err.strip() == f"error: {tmp_path}/none.xml.bz2: no such file"


def test_sql_refuses_writes_and_writes_output_files(capsys, home, tmp_path):
    code, _, err = run_cli(capsys, "--home", home, "sql", "DELETE FROM runs")
    assert code == 1 and "refused" in err and "read-only" in err
    target = tmp_path / "out.csv"
    code, _, _ = run_cli(capsys, "--home", home, "sql", "SELECT 1 AS one, [2, 3] AS l", "--format", "csv",
                         "--output", str(target))
    assert code == 0 and target.read_text() == 'one,l\n1,"[2, 3]"\n'


def test_sql_error_is_reported_not_raised(capsys, home):
    code, _, err = run_cli(capsys, "--home", home, "sql", "SELECT * FROM no_such_table")
    assert code == 1 and "no_such_table" in err


def test_every_stage_summary_is_a_whole_sentence():
    from stages.registry import STAGES
    analyze = STAGES["analyze"].summary
    assert analyze.endswith("keys by the questions that make them fire.") and "\n" not in analyze
    for stage in STAGES.values():
        assert stage.summary.endswith("."), stage.name


@pytest.mark.slow
def test_a_reader_that_stops_early_gets_no_traceback(home):
    query = "SELECT range AS n FROM range(200000)"
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "--home", home, "sql", query],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().split() == [b"n"]
    proc.stdout.close()  # like `| head -1`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and "Traceback" not in err, err


@pytest.mark.slow
def test_output_files_take_their_format_from_the_extension_and_their_folder_is_made(capsys, home, tmp_path):
    query = "SELECT 1 AS a, 'x' AS b"
    code, _, err = run_cli(capsys, "--home", home, "sql", query, "--output", str(tmp_path / "new" / "r.csv"))
    assert code == 0 and "wrote" in err
    assert (tmp_path / "new" / "r.csv").read_text() == "a,b\n1,x\n"
    code, _, _ = run_cli(capsys, "--home", home, "sql", query, "--output", str(tmp_path / "r.json"))
    assert json.loads((tmp_path / "r.json").read_text()) == [{"a": 1, "b": "x"}]
    code, _, _ = run_cli(capsys, "--home", home, "sql", query, "--output", str(tmp_path / "r.json"), "--format", "csv")
    assert (tmp_path / "r.json").read_text() == "a,b\n1,x\n"  # an explicit --format wins
    (tmp_path / "file").write_text("")
    code, _, err = run_cli(capsys, "--home", home, "sql", query, "--output", str(tmp_path / "file" / "r.csv"))
    assert code == 1 and err.startswith(f"error: cannot write {tmp_path / 'file' / 'r.csv'}: ")


def test_runs_of_an_unknown_stage_name_the_stages_that_have_runs(capsys, home, tmp_path):
    path = tmp_path / "wiki.jsonl"
    path.write_text('{"id": "a", "title": "A", "text": "Ada."}\n')
    assert run_cli(capsys, "--home", home, "run", "ingest", "--set", f"path={path}")[0] == 0
    code, _, err = run_cli(capsys, "--home", home, "runs", "--stage", "injest")
    assert code == 1 and "no runs of stage 'injest'; stages with runs: ingest" in err


def test_in_process_flows_skip_heartbeats_only_under_the_temporary_server():
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    from flows.cli_common import local_flow_settings
    default = get_current_settings().flows.heartbeat_frequency
    assert default  # Prefect's own default; a server uses it to tell crashed runs
    with temporary_settings(restore_defaults={PREFECT_API_URL}), local_flow_settings():
        assert get_current_settings().flows.heartbeat_frequency is None
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:4200/api"}), local_flow_settings():
        assert get_current_settings().flows.heartbeat_frequency == default


def test_server_down_where_no_server_was_started_fails_says_how_and_creates_nothing(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "server", "down")
    assert code == 1 and "no server was started from" in err and "--project" in err
    assert not (tmp_path / ".nkb").exists() and not (tmp_path / ".prefect").exists()


def test_server_hints_name_the_project_so_they_work_from_anywhere(tmp_path):
    from flows.cli_common import server_command
    assert server_command("down", tmp_path).endswith(f"server down --project {tmp_path.resolve()}")


def test_a_name_too_long_for_a_file_is_refused_in_one_line(home, tmp_path):
    path = tmp_path / "wiki.jsonl"
    path.write_text('{"id": "a", "title": "A", "text": "Ada."}\n')
    with pytest.raises(SystemExit) as refused:
        main(["--home", home, "run", "ingest", "--set", f"path={path}", "--set", f"corpus={'c' * 300}"])
    assert "invalid config for `nkb run ingest`: corpus" in str(refused.value.code)
    assert len(str(refused.value.code).splitlines()) == 2  # the error and where the help is


HEAVY = ("torch", "transformers", "spacy", "pyserini", "jnius", "prefect", "matplotlib")


@pytest.mark.parametrize("argv", [["--help"], ["run", "inject", "--help"], ["pipeline", "--help"], ["tables"],
                                  ["runs"], ["sql", "select 1"], ["report"], ["server", "status"]])
@pytest.mark.slow
def test_commands_that_answer_at_once_import_no_heavy_library(home, argv):
    # A command's start-up time is its imports: torch and transformers alone take ~15 s on a cold 2-core machine.
    script = ("import sys\nfrom flows.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
              f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    out = subprocess.run([sys.executable, "-c", script, "--home", home, *argv], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[]", (argv, out.stdout[-500:], out.stderr[-500:])


def test_pipeline_routes_adds_the_fields_routes_to_the_experiments_rows(capsys, home, monkeypatch):
    from flows import cli_pipeline
    from nkb_model.methods import of_kind
    ran = []
    monkeypatch.setattr(cli_pipeline, "run_experiment",
                        lambda experiment, args: ran.append([c.name for s, c in experiment.plan() if s == "inject"])
                        or 0)
    for extra in ([], ["--routes"]):
        assert run_cli(capsys, "--home", home, "pipeline", "experiments/sample-world-smollm2.yaml", *extra)[0] == 0
    routes = [m.row_key for m in of_kind("inject") if m.named_only]
    assert {"base+lora", "base+lora-8", "base+ft"} <= set(routes)
    assert ran == [["base+nkb"], ["base+nkb", *routes]]  # each route a training
    # the routes are rows before the experiment is checked: its zero_shot may name them
    zero_shot = f"zero_shot=[base,base+nkb,{','.join(routes)}]"
    code, _, err = run_cli(capsys, "--home", home, "pipeline", "experiments/sample-world-smollm2.yaml",
                           "--set", zero_shot)
    assert code != 0 and "zero_shot names rows the experiment does not have" in err
    assert run_cli(capsys, "--home", home, "pipeline", "experiments/sample-world-smollm2.yaml", "--routes",
                   "--set", zero_shot)[0] == 0


def _tiny_experiment_file(tmp_path):
    """The tiny sample-world experiment as a user's file (its data stages run in seconds)."""
    import yaml

    from stages.experiment import SAMPLE_WORLD, apply_sets
    from tests.experiments import TINY_SETS
    data = apply_sets(yaml.safe_load(open(SAMPLE_WORLD)), TINY_SETS)  # the same settings, written into the file
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _runs_of(capsys, home) -> list[dict]:
    return json.loads(run_cli(capsys, "--home", home, "runs", "--format", "json", "--limit", "0")[1])


@pytest.mark.slow
def test_one_stage_of_an_experiment_reruns_alone_with_the_experiments_settings(capsys, home, tmp_path):
    experiment = str(_tiny_experiment_file(tmp_path))
    code, out, _ = run_cli(capsys, "--home", home, "pipeline", experiment, "--no-models", "--plan")
    assert code == 0 and out.startswith("Plan: 16 of 16 runs to run (16 never run here and not timed)")  # a base made here
    assert "  run   sample-world" in out and _runs_of(capsys, home) == []  # --plan runs nothing
    code, out, _ = run_cli(capsys, "--home", home, "pipeline", experiment, "--no-models")
    assert code == 0 and out.startswith("Plan: 16 of 16 runs to run")  # the plan, printed as the pipeline starts
    before = _runs_of(capsys, home)
    code, out, _ = run_cli(capsys, "--home", home, "pipeline", experiment, "--no-models", "--plan",
                           "--set", "stages.retrieve.k=2")
    assert code == 0 and out.startswith("Plan: 2 of 16 runs to run (about ") and _runs_of(capsys, home) == before
    assert re.search(r"  run   retrieve corpus sampleworld +k 3 → 2  ~\d+ s \(run retrieve-", out), out
    assert re.search(r"  skip  index corpus sampleworld +unchanged since run index-", out), out
    assert run_cli(capsys, "--home", home, "pipeline", experiment, "--no-models", "--only", "retrieve")[0] == 0
    new = _runs_of(capsys, home)[: len(_runs_of(capsys, home)) - len(before)]
    assert [r["stage"] for r in new] == ["retrieve"] and new[0]["status"] == "success"
    # --from: the stage and every one after it, no earlier one
    count = len(_runs_of(capsys, home))
    assert run_cli(capsys, "--home", home, "pipeline", experiment, "--no-models", "--from", "retrieve")[0] == 0
    new = _runs_of(capsys, home)[: len(_runs_of(capsys, home)) - count]
    assert sorted(r["stage"] for r in new) == ["retrieve", "salient-spans"]
    # nkb run STAGE --experiment: its settings (its corpus), --set over them, forced
    code, out, _ = run_cli(capsys, "--home", home, "run", "retrieve", "--experiment", experiment, "--set", "k=5")
    assert code == 0 and "retrieve corpus sampleworld" in out and "done" in out, out
    latest = _runs_of(capsys, home)[0]
    assert latest["stage"] == "retrieve" and latest["config"]["k"] == 5 and latest["config"]["corpus"] == "sampleworld"
    code, _, err = run_cli(capsys, "--home", home, "pipeline", experiment, "--no-models", "--only", "inject")
    assert code == 1 and "stage 'inject' is not in this experiment's plan; its stages, in order: sample-world" in err


def test_the_demo_is_held_to_the_range_its_cpu_kind_recorded():
    from flows.cli_pipeline import where_in_record
    record = {"machine": {"name": "Xeon"}, "commit": "abc1234", "seeds": {
        str(s): {"rows": {"base+NKB (5-shot)": {"em": em}, "base+NKB (0-shot)": {"em": em + 5}}}
        for s, em in enumerate((44.8, 49.3, 47.0))}}
    rows = {"base+NKB (5-shot)": {"em": 49.3}, "base+NKB (0-shot)": {"em": 40.0}}
    assert where_in_record(rows, record) == (
        "On this kind of CPU (Xeon), the demo over injection seeds 0, 1, 2 at abc1234 gave a range: base+NKB (5-shot) "
        "49.3, inside 44.8-49.3; base+NKB (0-shot) 40.0, OUTSIDE 49.8-54.3")
