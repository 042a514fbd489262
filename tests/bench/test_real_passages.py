"""The real-passage experiment's files, from a fixture with the structure of lost-in-the-middle's
nq-open-oracle.jsonl.gz: a question, its answers, its gold passage in `ctxs` and NQ's annotation beside it."""

import gzip
import json

import pytest

from bench.real_passages import (EXPERIMENT, REAL_CORPUS_TEMPLATE, REAL_STEPS, REAL_TEXT_SETTINGS, main, read_oracle,
                                 split, steps_for)
from stages.experiment import SAMPLE_WORLD_SMOLLM2, Experiment


def oracle_row(n: int, title: str, hasanswer: bool = True) -> dict:
    text = f"{title} was founded in {1900 + n} by person {n}."
    return {"question": f"when was thing {n} founded", "answers": [str(1900 + n)],
            "ctxs": [{"title": title, "text": text, "hasanswer": hasanswer, "isgold": True}],
            "nq_annotated_gold": {"title": title, "long_answer": text, "chunked_long_answer": text}}


@pytest.fixture
def oracle(tmp_path):
    rows = [oracle_row(n, f"Article {n}") for n in range(12)]
    rows.append({**oracle_row(3, "Article 3"), "question": "who founded thing 3"})  # the same passage twice
    rows.append(oracle_row(99, "Unanswerable", hasanswer=False))
    path = tmp_path / "nq-open-oracle.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def test_questions_and_passages_are_split_without_overlap(oracle):
    rows = read_oracle(oracle)
    assert len(rows) == 14 and rows[0]["title"] == "Article 0" and rows[-1]["hasanswer"] is False
    parts = split(rows, questions=8, validation=3, general=10, seed=0)
    assert len(parts["train"]) == 5 and len(parts["validation"]) == 3
    assert "Unanswerable" not in {r["title"] for r in parts["train"] + parts["validation"]}
    passages = {(p["title"], p["text"]) for p in parts["passages"]}
    assert len(passages) == len(parts["passages"])  # each passage once
    assert passages == {(r["title"], r["text"]) for r in parts["train"] + parts["validation"]}
    assert not passages & {(p["title"], p["text"]) for p in parts["general"]}  # held-out text is not knowledge
    again = split(read_oracle(oracle), questions=8, validation=3, general=10, seed=0)
    assert again == parts


def test_the_steps_follow_the_draws_passages_as_measured():
    assert steps_for(598) == REAL_STEPS == 1800  # the default draw: docs/results.md's runs
    assert steps_for(796) == 2400  # twice the questions: the same passes over the passages
    assert steps_for(3) == 100


def test_steps_asked_for_are_written(oracle, tmp_path):
    out = tmp_path / "real"
    assert main([str(oracle), "--out", str(out), "--questions", "8", "--validation", "3", "--steps", "250"]) == 0
    assert Experiment.load(out / EXPERIMENT).stages["inject"]["steps"] == 250


def test_asking_for_more_questions_than_answerable_ones_is_refused(oracle):
    with pytest.raises(ValueError, match="13 whose passage holds an answer"):
        split(read_oracle(oracle), questions=20, validation=5, general=0, seed=0)


def test_a_line_without_its_passage_is_named(tmp_path):
    path = tmp_path / "oracle.jsonl"
    path.write_text(json.dumps(oracle_row(0, "A")) + "\n" + json.dumps({"question": "q", "answers": ["a"]}) + "\n")
    with pytest.raises(ValueError, match=r"oracle.jsonl, line 2"):
        read_oracle(path)


def test_the_experiment_keeps_the_demos_settings_but_real_texts_and_reads_the_written_files(oracle, tmp_path, capsys):
    out = tmp_path / "real"
    assert main([str(oracle), "--out", str(out), "--questions", "8", "--validation", "3", "--general", "4"]) == 0
    assert "5 train and 3 validation questions" in capsys.readouterr().out
    experiment = Experiment.load(out / EXPERIMENT)
    demo = Experiment.load(SAMPLE_WORLD_SMOLLM2)
    assert experiment.stages["inject"].pop("steps") == steps_for(8) == 100  # 8 passages: the floor
    demo.stages["inject"].pop("steps")
    real_text = Experiment.load(REAL_CORPUS_TEMPLATE).stages["inject"]
    for key in REAL_TEXT_SETTINGS:  # the real-corpus template's, where the demo's differ
        assert experiment.stages["inject"][key] == real_text[key] != demo.stages["inject"].get(key)
        demo.stages["inject"][key] = real_text[key]
    assert experiment.stages == demo.stages and experiment.rows == demo.rows and experiment.shots == demo.shots
    assert experiment.sample_world is None and experiment.probes is None
    assert [q.path for q in experiment.questions] == [str(out / "train.jsonl"), str(out / "validation.jsonl")]
    assert len((out / "validation.jsonl").read_text().splitlines()) == 3
