"""The Prefect flows, run for real under Prefect's test harness (a temporary local server)."""

import warnings

import pytest
from prefect import flow
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from prefect.testing.utilities import prefect_test_harness

from corpus import ner
from flows.flows import STAGE_FLOWS, pipeline
from stages.configs import IngestConfig, SalientSpansConfig
from tests.experiments import tiny_experiment
from warehouse import Warehouse, list_runs, query

pytestmark = pytest.mark.slow  # every test runs flows under a temporary Prefect server


@pytest.fixture(scope="module", autouse=True)
def prefect_harness():
    # Without heartbeats, as `nkb demo` runs its flows (flows.cli.local_flow_settings): each costs a second.
    with prefect_test_harness(server_startup_timeout=120), \
            temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


def test_pipeline_flow_runs_every_stage_and_then_skips(tmp_path):
    home = str(tmp_path / "wh")
    experiment = tiny_experiment("sample_world.background_people=5")
    rows = pipeline(experiment, home=home, train_models=False)
    assert [r["stage"] for r in rows] == (["sample-world", "ingest", "ingest"] + ["questions"] * 6
                                          + ["generation-data"] * 4 + ["index", "retrieve", "salient-spans"])
    assert not any(r["skipped"] for r in rows)
    counts = {t: n for t, _, n in Warehouse(home).row_counts()}
    assert counts["documents"] > 20 and counts["questions"] == 50 and counts["runs"] == 16
    assert counts["gen_examples"] > 0
    assert counts["retrievals"] > 100 and counts["segments"] > 20 and counts["salient_spans"] > 100
    again = pipeline(experiment, home=home, train_models=False)
    assert all(r["skipped"] for r in again)
    assert len(list_runs(Warehouse(home))) == 16


def test_stage_flow_validates_and_fails_on_bad_input(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    with pytest.raises(Exception, match="line 1: not valid JSON"):
        STAGE_FLOWS["ingest"](IngestConfig(path=str(bad)), home=str(tmp_path / "wh"))
    assert query(Warehouse(tmp_path / "wh"), "SELECT count(*) AS n FROM documents").to_pylist() == [{"n": 0}]


def test_multiprocess_ner_inside_a_flow_neither_warns_nor_loses_documents():
    texts = [(f"Ada Lovelace was born in London on 10 December 1815, note {i}.", str(i)) for i in range(300)]

    @flow
    def spans(n_process: int) -> list:
        return [(key, [s.text for s in found]) for key, found in ner.salient_spans(texts, n_process=n_process)]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        forked = spans(2)
    assert [str(w.message) for w in caught if "W127" in str(w.message)] == []
    assert forked == spans(1) and len(forked) == 300


def test_an_experiment_file_of_the_users_own_files_runs_its_data_stages(tmp_path):
    """No sample world: a corpus and QA files beside the experiment file, named by relative paths."""
    import json
    data = tmp_path / "exp" / "data"
    data.mkdir(parents=True)
    people = [("Ada Lovelace", "London", "1815"), ("Alan Turing", "Maida Vale", "1912"),
              ("Grace Hopper", "New York", "1906")]
    lines = [{"id": str(i), "title": n, "text": f"{n} was born in {p} in {y}."} for i, (n, p, y) in enumerate(people)]
    (data / "wiki.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    for split, chosen in (("train", people[:2]), ("dev", people[2:])):
        lines = [{"question": f"where was {n} born", "answer": [p]} for n, p, _ in chosen]
        (data / f"nq.{split}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    experiment = tmp_path / "exp" / "mine.yaml"
    experiment.write_text("name: mine\nknowledge: [{path: data/wiki.jsonl, corpus: wiki}]\nbase_model: models/t5\n"
                          "questions:\n  - {path: data/nq.train.jsonl, format: nq_open, dataset: nq, split: train}\n"
                          "  - {path: data/nq.dev.jsonl, format: nq_open, dataset: nq, split: validation}\n")
    home = str(tmp_path / "wh")
    rows = pipeline(experiment_file=str(experiment), home=home, train_models=False)
    assert [r["stage"] for r in rows] == ["ingest", "questions", "questions", "index", "retrieve", "salient-spans"]
    top = query(Warehouse(home), "SELECT q.question, r.doc_id FROM retrievals r JOIN questions q USING (question_id) "
                                 "WHERE r.rank = 1 ORDER BY r.doc_id").to_pylist()
    assert [(t["question"], t["doc_id"]) for t in top] == [(f"where was {n} born", str(i))
                                                          for i, (n, _, _) in enumerate(people)]
    with pytest.raises(ValueError, match="an experiment or an experiment_file"):
        pipeline(home=home)


def test_pipeline_trains_every_row_and_reports(tmp_path):
    home = str(tmp_path / "wh")
    rows = pipeline(tiny_experiment(), home=home)
    stages = [r["stage"] for r in rows]
    models = stages[stages.index("pretraining-data"):]
    assert models[:3] == ["pretraining-data", "salient-spans", "base-model"]  # the pretraining text's spans first
    # QA for 5 rows, Kformer and concat, and 2 generation tasks for base, base+NKB and base+NKB-a
    assert stages.count("finetune") == 5 + 2 + 6 and stages[-3:] == ["report", "analyze", "surgery"]
    qa_formats = query(Warehouse(home), "SELECT config::JSON->>'answer_format' AS f FROM runs WHERE stage = 'finetune' "
                                        "AND config::JSON->>'task' IS NULL").column("f").to_pylist()
    assert qa_formats == ["plain"] * 7  # every QA row, Kformer and concat included, in the models' one format
    report = query(Warehouse(home), "SELECT DISTINCT model FROM report").column("model").to_pylist()
    assert sorted(report) == sorted(["Transformer", "base", "base+NKB", "base+NKB-a", "large", "Kformer", "concat"])
    generation = query(Warehouse(home), "SELECT model, task FROM report_generation").to_pylist()
    assert len(generation) == 6 and {g["model"] for g in generation} == {"base", "base+NKB", "base+NKB-a"}
    assert all(r["skipped"] for r in pipeline(tiny_experiment(), home=home))


def test_salient_spans_on_a_local_dask_cluster_equal_the_in_process_run(tmp_path):
    from flows.flows import salient_spans_flow
    home = str(tmp_path / "wh")
    pipeline(tiny_experiment("sample_world.background_people=5"), home=home, train_models=False)
    spans = "SELECT * EXCLUDE (run_id) FROM salient_spans ORDER BY ALL"
    in_process = query(Warehouse(home), spans).to_pylist()
    # A 2-worker local cluster; small shards so that both workers get some.
    config = SalientSpansConfig(corpus="sampleworld", max_words=15, shard_size=10, dask="local:2")  # as the pipeline's
    row = salient_spans_flow(config, home, force=True)
    assert not row["skipped"] and row["shards"] > 2
    assert query(Warehouse(home), spans).to_pylist() == in_process


def test_an_input_error_through_prefect_is_one_line_not_a_traceback(tmp_path):
    """As a user runs it: `nkb run --prefect` in a process of its own, under Prefect's temporary server."""
    import os
    import subprocess
    import sys
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")} | {
        "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    done = subprocess.run([sys.executable, "-m", "flows.cli", "--home", str(tmp_path / "wh"), "run", "ingest",
                           "--set", f"path={bad}", "--prefect"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stderr
    assert f"error: {bad}, line 1: not valid JSON" in done.stderr
