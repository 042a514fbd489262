"""bench.squad_protocol on a SQuAD-shaped file written here: which questions train, which are held out, and what is
general text."""

import json

import pytest

from bench import squad_protocol
from corpus.squad import read_squad
from stages.experiment import Experiment


def article(title: str, paragraphs: int, questions: int, impossible: int = 0) -> dict:
    return {"title": title, "paragraphs": [
        {"context": f"{title} paragraph {p}.", "qas": [
            {"id": f"{title}-{p}-{q}", "question": f"What of {title} {p} {q}?",
             "answers": [{"text": f"answer {q}", "answer_start": 0}]} for q in range(questions)] + [
            {"id": f"{title}-{p}-x{q}", "question": "Unanswerable?", "answers": [], "is_impossible": True,
             "plausible_answers": [{"text": "no", "answer_start": 0}]} for q in range(impossible)]}
        for p in range(paragraphs)]}


@pytest.fixture
def squad_file(tmp_path):
    path = tmp_path / "train-v2.0.json"
    path.write_text(json.dumps({"version": "v2.0", "data": [article(f"A{a}", 2, 4, impossible=1)
                                                            for a in range(6)]}))
    return read_squad(path).paragraphs


def test_by_paragraph_each_validation_questions_paragraph_also_trains_one(squad_file):
    parts = squad_protocol.protocol(squad_file, validation=8, by="paragraph", general=1)
    assert len(parts["validation"]) == 8 and len(parts["train"]) == 8  # two articles of 2 x 4, alternating
    trained = {q.qid.rsplit("-", 1)[0] for q in parts["train"]}
    assert {q.qid.rsplit("-", 1)[0] for q in parts["validation"]} == trained
    assert not any("-x" in q.qid for q in parts["train"] + parts["validation"])  # unanswerable: left out
    knowledge = {p.title for p in parts["knowledge"]}
    assert knowledge == {"A0", "A1"} and {p.title for p in parts["general"]} == {"A2"}


def test_by_article_a_validation_articles_questions_never_train(squad_file):
    parts = squad_protocol.protocol(squad_file, validation=16, by="article", general=2)
    train_articles = {q.qid.split("-")[0] for q in parts["train"]}
    held_articles = {q.qid.split("-")[0] for q in parts["validation"]}
    assert held_articles == {"A1", "A3"} and train_articles == {"A0", "A2"}
    assert {p.title for p in parts["knowledge"]} == {"A0", "A1", "A2", "A3"}  # held-out articles are read all the same
    assert {p.title for p in parts["general"]} == {"A4", "A5"}


def test_too_few_questions_or_no_article_left_for_general_text_is_refused(squad_file):
    with pytest.raises(ValueError, match="give 24 validation questions, fewer than the 100 asked"):
        squad_protocol.protocol(squad_file, validation=100, by="paragraph", general=1)
    with pytest.raises(ValueError, match="no article is left after the knowledge's 6"):
        squad_protocol.protocol(squad_file, validation=24, by="paragraph", general=1)


def test_the_written_experiment_plans_the_demos_rows_over_squads_files(squad_file, tmp_path):
    parts = squad_protocol.protocol(squad_file, validation=8, by="paragraph", general=1)
    squad_protocol.write(tmp_path / "out", parts, steps=200, name="squad-test")
    experiment = Experiment.load(tmp_path / "out" / squad_protocol.EXPERIMENT)
    assert experiment.name == "squad-test" and "base+nkb" in experiment.rows
    inject = next(config for stage, config in experiment.plan() if stage == "inject")
    assert inject.steps == 200 and inject.qa_eos  # the settings measured on real text
    lines = (tmp_path / "out" / "validation.jsonl").read_text().splitlines()
    assert len(lines) == 8 and json.loads(lines[0])["answers"] == ["answer 1"]
