"""The Prefect flows, run for real under Prefect's test harness (a temporary local server)."""

import json
import warnings

import pytest
from prefect import flow
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from prefect.testing.utilities import prefect_test_harness

from corpus import ner
from flows.cli_pipeline import suggested_queries
from flows.flows import STAGE_FLOWS, pipeline
from stages.configs import IngestConfig, SalientSpansConfig
from stages.experiment import FULL_DEMO, arch_demo
from tests.experiments import tiny_experiment
from tests.fingerprints import GOLDEN, make_deterministic, plan_fingerprints
from warehouse import Warehouse, list_runs, query, row_counts

pytestmark = pytest.mark.slow  # every test runs flows under a temporary Prefect server


@pytest.fixture(scope="module", autouse=True)
def prefect_harness():
    # Without heartbeats, as `nkb demo` runs its flows (flows.cli_common.local_flow_settings): each costs a second.
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
    counts = {t: n for t, _, n in row_counts(Warehouse(home))}
    assert counts["documents"] > 20 and counts["questions"] == 50 and counts["runs"] == 16
    assert counts["gen_examples"] > 0
    assert counts["retrievals"] > 100 and counts["segments"] > 20 and counts["salient_spans"] > 100
    suggested = suggested_queries({t for t, n in counts.items() if n})
    assert len(suggested) == 3 and all(query(Warehouse(home), sql).num_rows for sql in suggested)  # the end's "Try:"
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


def test_an_experiment_of_the_users_own_files_and_hugging_face_t5_then_a_knowledge_refresh(tmp_path):
    """No sample world: a corpus, general text, QA files and a Hugging Face T5 directory beside the experiment
    file, named by relative paths; the data stages first, then every row a brought base has; then the knowledge
    file changes, and a rerun redoes exactly what depends on it, the slots starting from the previous ones."""
    import json

    import torch
    from transformers import T5ForConditionalGeneration

    from nkb_model.base_model import new_t5, train_tokenizer
    from nkb_model.checkpoint import read_info
    folder = tmp_path / "exp"
    (folder / "data").mkdir(parents=True)
    people = [("Ada Lovelace", "London", "1815"), ("Alan Turing", "Maida Vale", "1912"),
              ("Grace Hopper", "New York", "1906")]

    def jsonl(name: str, records: list[dict]) -> None:
        (folder / "data" / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    jsonl("wiki.jsonl", [{"id": str(i), "title": n, "text": f"{n} was born in {p} in {y}."}
                         for i, (n, p, y) in enumerate(people)])
    general = [f"The river number {i} runs through a valley with {i % 7} bridges and old mills." for i in range(60)]
    jsonl("general.jsonl", [{"id": str(i), "title": f"River {i}", "text": t} for i, t in enumerate(general)])
    for split, chosen in (("train", people[:2]), ("dev", people[2:])):
        jsonl(f"nq.{split}.jsonl", [{"question": f"where was {n} born", "answer": [p]} for n, p, _ in chosen])
    tokenizer = train_tokenizer(general + [f"{n} {p} {y}" for n, p, y in people], vocab_size=200)
    brought = new_t5(tokenizer, "tiny")
    brought.save_pretrained(folder / "models" / "t5")
    tokenizer.save_pretrained(folder / "models" / "t5")
    experiment = folder / "mine.yaml"
    experiment.write_text(
        "name: mine\nknowledge: [{path: data/wiki.jsonl, corpus: wiki}]\n"
        "general: [{path: data/general.jsonl, corpus: prose}]\nbase_model: models/t5\ndevice: cpu\n"
        "questions:\n  - {path: data/nq.train.jsonl, format: nq_open, dataset: nq, split: train}\n"
        "  - {path: data/nq.dev.jsonl, format: nq_open, dataset: nq, split: validation}\n"
        "stages: {inject: {steps: 2, batch_size: 2, start: previous}, nkb-a: {steps: 1},\n"
        "         finetune: {epochs: 1, batch_size: 2},\n"
        "         surgery: {questions: 1, lambdas: [1.0]}}\n")
    home = str(tmp_path / "wh")
    rows = pipeline(experiment_file=str(experiment), home=home, train_models=False)
    assert [r["stage"] for r in rows] == ["ingest", "ingest", "questions", "questions", "index", "retrieve",
                                          "salient-spans"]
    top = query(Warehouse(home), "SELECT q.question, r.doc_id FROM retrievals r JOIN questions q USING (question_id) "
                                 "WHERE r.rank = 1 ORDER BY r.doc_id").to_pylist()
    assert [(t["question"], t["doc_id"]) for t in top] == [(f"where was {n} born", str(i))
                                                          for i, (n, _, _) in enumerate(people)]
    rows = pipeline(experiment_file=str(experiment), home=home)
    assert all(r["skipped"] for r in rows[:7]) and not any(r["skipped"] for r in rows[7:])
    assert [r["stage"] for r in rows[7:]] == ["base-model", "inject", "inject"] + ["finetune", "evaluate"] * 5 + [
        "report", "analyze", "surgery"]
    # the base is the brought model, unchanged, with held-out rows of the general text for the no-forgetting check
    (base,) = [r for r in list_runs(Warehouse(home), stage="base-model")]
    imported = T5ForConditionalGeneration.from_pretrained(base.checkpoint)
    assert all(torch.equal(a, b) for a, b in zip(imported.state_dict().values(), brought.state_dict().values()))
    report = query(Warehouse(home), "SELECT DISTINCT model FROM report").column("model").to_pylist()
    assert sorted(report) == sorted(["base", "base+NKB", "base+NKB-a", "Kformer", "concat"])
    losses = {r["model"]: r["heldout_loss"] for r in query(Warehouse(home), "SELECT model, heldout_loss FROM report "
                                                                             "WHERE dataset = 'average'").to_pylist()}
    assert losses["base"] is not None and losses["base+NKB"] is not None
    first_injections = [r.run_id for r in list_runs(Warehouse(home), stage="inject")]

    # A newer dump: one more article. What depends on the knowledge reruns; the base and its QA row do not.
    newer = people + [("Katherine Johnson", "White Sulphur Springs", "1918")]
    jsonl("wiki.jsonl", [{"id": str(i), "title": n, "text": f"{n} was born in {p} in {y}."}
                         for i, (n, p, y) in enumerate(newer)])
    refresh = pipeline(experiment_file=str(experiment), home=home)
    reran = [(r["stage"], r.get("model") or r.get("corpus")) for r in refresh if not r["skipped"]]
    assert [stage for stage, _ in reran] == ["ingest", "index", "retrieve", "salient-spans", "inject", "inject"] + \
        ["finetune", "evaluate"] * 4 + ["report", "analyze", "surgery"]
    assert ("finetune", "base.qa") not in reran and {r["stage"] for r in refresh if r["skipped"]} == {
        "ingest", "questions", "base-model", "finetune", "evaluate"}
    injections = [r for r in list_runs(Warehouse(home), stage="inject") if r.run_id not in first_injections]
    started = {read_info(r.checkpoint)["started_from"] for r in injections}
    assert started == set(first_injections)  # each from its own previous slots
    compared = query(Warehouse(home), "SELECT model, dataset, em_before, em_after, newly_right + newly_wrong <= 1 "
                                      "AS counted FROM report_refresh ORDER BY ALL").to_pylist()
    assert {c["model"] for c in compared} == {"base+NKB", "base+NKB-a", "Kformer", "concat"}
    assert {c["dataset"] for c in compared} == {"nq", "average", "probe"}
    assert all(c["counted"] for c in compared if c["dataset"] != "probe")  # one validation question
    assert all(r["skipped"] for r in pipeline(experiment_file=str(experiment), home=home))  # the same start again
    with pytest.raises(ValueError, match="an experiment or an experiment_file"):
        pipeline(home=home)


def test_pipeline_trains_every_row_and_reports_and_an_upgrade_reruns_nothing(tmp_path, monkeypatch):
    home = str(tmp_path / "wh")
    make_deterministic(monkeypatch, tmp_path / "wh")
    rows = pipeline(tiny_experiment(*FULL_DEMO), home=home)  # every row of the paper's tables
    # Every run's inputs fingerprint is what the code before stages declared their inputs gave (run ids counted,
    # the warehouse's path neutral): a user's warehouse is skipped after the upgrade, not rebuilt.
    assert plan_fingerprints(tmp_path / "wh") == json.loads(GOLDEN.read_text())
    stages = [r["stage"] for r in rows]
    models = stages[stages.index("pretraining-data"):]
    assert models[:3] == ["pretraining-data", "salient-spans", "base-model"]  # the pretraining text's spans first
    # QA for 5 rows, Kformer and concat, and 2 generation tasks for base, base+NKB and base+NKB-a
    assert stages.count("finetune") == 5 + 2 + 6 and stages[-4:] == ["report", "analyze", "surgery", "edit"]
    qa_formats = query(Warehouse(home), "SELECT config::JSON->>'answer_format' AS f FROM runs WHERE stage = 'finetune' "
                                        "AND config::JSON->>'task' IS NULL").column("f").to_pylist()
    assert qa_formats == ["plain"] * 7  # every QA row, Kformer and concat included, in the models' one format
    report = query(Warehouse(home), "SELECT DISTINCT model FROM report").column("model").to_pylist()
    assert sorted(report) == sorted(["Transformer", "base", "base+NKB", "base+NKB-a", "large", "Kformer", "concat"])
    generation = query(Warehouse(home), "SELECT model, task FROM report_generation").to_pylist()
    assert len(generation) == 6 and {g["model"] for g in generation} == {"base", "base+NKB", "base+NKB-a"}
    assert all(r["skipped"] for r in pipeline(tiny_experiment(*FULL_DEMO), home=home))


def test_a_decoder_only_experiment_trains_every_row_that_applies_and_reports(tmp_path):
    home = str(tmp_path / "wh")
    rows = pipeline(tiny_experiment(*FULL_DEMO, *arch_demo("llama")), home=home)
    stages = [r["stage"] for r in rows]
    assert stages[-4:] == ["report", "analyze", "surgery", "edit"]
    wh = Warehouse(home)
    bases = query(wh, "SELECT config::JSON->>'arch' AS arch FROM runs WHERE stage = 'base-model'").column("arch")
    assert bases.to_pylist() == ["llama"] * 3  # base, Transformer (0 steps) and large
    formats = query(wh, "SELECT DISTINCT config::JSON->>'answer_format' AS f FROM runs WHERE stage = 'finetune' "
                        "AND config::JSON->>'task' IS NULL").column("f").to_pylist()
    assert formats == ["plain"]  # asked of a causal LM as a prompt (the model's card and info say so)
    report = query(wh, "SELECT DISTINCT model FROM report").column("model").to_pylist()
    assert sorted(report) == sorted(["Transformer", "base", "RAG", "base+NKB", "base+NKB-a", "large"])  # RAG: 0-shot
    shares = query(wh, "SELECT model, retrieval_share AS r, retrieval_share_low AS lo, retrieval_share_high AS hi "
                       "FROM report").to_pylist()  # each trained row against the base and RAG, where RAG gains
    assert all(s["r"] is None for s in shares if s["model"] in ("base", "RAG"))
    assert all(s["lo"] is None or s["lo"] <= s["r"] <= s["hi"] for s in shares)
    held_out = {r["model"]: r["heldout_loss"] for r in query(wh, "SELECT DISTINCT model, heldout_loss FROM report")
                .to_pylist()}
    unmounted = query(wh, "SELECT value FROM metrics WHERE metric = 'heldout_loss_nkb_unmounted' AND dataset = "
                          "'base+NKB'").column("value").to_pylist()
    assert unmounted == [held_out["base"]]  # no forgetting, exactly: without its slots base+NKB is the base
    generation = query(wh, "SELECT model, task FROM report_generation").to_pylist()
    assert {g["model"] for g in generation} == {"base", "base+NKB", "base+NKB-a"}


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


def test_a_split_dump_cleaned_on_a_local_dask_cluster_equals_the_in_process_ingest(tmp_path):
    from flows.flows import ingest_flow
    from stages import data
    from stages.configs import IngestConfig
    from tests.stages.test_data import split_dump
    folder = split_dump(tmp_path / "dump", parts=4)
    config = IngestConfig(path=str(folder / "*.bz2"), corpus="wiki")
    data.ingest(Warehouse(tmp_path / "here"), config)
    row = ingest_flow(config.model_copy(update={"dask": "local:2"}), str(tmp_path / "dask"))
    assert not row["skipped"] and row["files"] == 4 and row["documents"] == 16
    table = "SELECT * EXCLUDE (run_id) FROM documents"
    assert query(Warehouse(tmp_path / "dask"), table).to_pylist() == query(Warehouse(tmp_path / "here"), table).to_pylist()
