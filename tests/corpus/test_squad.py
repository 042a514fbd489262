"""SQuAD's official JSON, v1.1 and v2.0, on files written here that reproduce its structure and quirks: a dev file's
three annotators' answers (often the same), titles with underscores and percent-encoding, v2.0's unanswerable
questions with plausible answers, questions with stray spaces, and the errors a damaged file gives."""

import json

import pytest

from corpus.documents import infer_format, read_documents
from corpus.errors import InputFileError
from corpus.qa import read_questions
from corpus.squad import read_squad, title_text


def qa(qid: str, question: str, *answers: str, impossible: bool | None = None, plausible: tuple = ()) -> dict:
    entry = {"answers": [{"answer_start": 0, "text": a} for a in answers], "question": question, "id": qid}
    if impossible is not None:
        entry["is_impossible"] = impossible
    if plausible:
        entry["plausible_answers"] = [{"answer_start": 0, "text": a} for a in plausible]
    return entry


V11 = {"data": [  # the dev set's form: several annotators' answers a question, and no `version` key in a cut copy
    {"title": "Super_Bowl_50", "paragraphs": [
        {"context": "The Broncos beat the Panthers.", "qas": [
            qa("a1", "Who won Super Bowl 50? ", "Broncos", "Broncos", "The Broncos"),
            qa("a2", "Who lost?", "Panthers ")]},
        {"context": "It was played in Santa Clara.", "qas": [qa("a3", "Where?", "Santa Clara")]}]},
    {"title": "Beyonc%C3%A9", "paragraphs": [{"context": "Beyoncé sings.", "qas": []}]}]}
V20 = {"version": "v2.0", "data": [
    {"title": "Normans", "paragraphs": [
        {"context": "The Normans gave their name to Normandy, a region in France.", "qas": [
            qa("b1", "In what country is Normandy located?", "France", "France", impossible=False),
            qa("b2", "Who gave their name to Normandy in the 1000's?", impossible=True, plausible=("Normans",))]}]}]}


def write(tmp_path, name: str, data) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_a_v11_file_gives_paragraphs_as_titled_documents_and_each_question_its_distinct_answers(tmp_path):
    path = write(tmp_path, "dev-v1.1.json", V11)
    squad = read_squad(path)
    assert (squad.version, squad.articles, len(squad.paragraphs)) == ("", 2, 3)
    questions = list(read_questions(path, "squad"))
    assert [(q.local_id, q.question, q.answers) for q in questions] == [
        ("a1", "Who won Super Bowl 50?", ("Broncos", "The Broncos")), ("a2", "Who lost?", ("Panthers",)),
        ("a3", "Where?", ("Santa Clara",))]
    documents = list(read_documents(path, "squad"))
    assert [(d.doc_id, d.title, d.text) for d in documents] == [
        ("0.0", "Super Bowl 50", "The Broncos beat the Panthers."),
        ("0.1", "Super Bowl 50", "It was played in Santa Clara."), ("1.0", "Beyoncé", "Beyoncé sings.")]


def test_v20s_unanswerable_questions_are_counted_and_left_out_their_plausible_answers_unread(tmp_path):
    path = write(tmp_path, "dev-v2.0.json", V20)
    squad = read_squad(path)
    assert squad.version == "v2.0" and [q.qid for q in squad.questions(answerable=False)] == ["b2"]
    assert [(q.local_id, q.answers) for q in read_questions(path, "squad")] == [("b1", ("France",))]


def test_a_squad_file_is_told_from_its_name_and_first_keys(tmp_path):
    assert infer_format(write(tmp_path, "dev-v2.0.json", V20)) == "squad"
    assert infer_format(write(tmp_path, "cut.json", V11)) == "squad"
    assert infer_format(write(tmp_path, "passages.json", {"id": "1", "title": "t", "text": "x"})) == "jsonl"


@pytest.mark.parametrize("damage, where, problem", [
    (lambda d: d["data"][0]["paragraphs"][1].pop("context"), "data[0].paragraphs[1]", "no `context`"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][1].update(answers=[]), "data[0].paragraphs[0].qas[1]",
     "an answerable question (no `is_impossible`) without an answer"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0].update(question="  "), "data[0].paragraphs[0].qas[0]",
     "the question is empty"),
    (lambda d: d["data"][1].update(paragraphs="none"), "data[1]", "`paragraphs` must be a list, found a string"),
])
def test_a_damaged_file_is_refused_naming_the_place(tmp_path, damage, where, problem):
    data = json.loads(json.dumps(V11))
    damage(data)
    with pytest.raises(InputFileError) as caught:
        read_squad(write(tmp_path, "dev.json", data))
    assert (caught.value.where, caught.value.problem) == (where, problem)


def test_a_file_that_is_not_squads_says_what_it_found(tmp_path):
    with pytest.raises(InputFileError, match="not SQuAD's JSON: an object with a `data` list of articles is expected, "
                                             "found a list"):
        read_squad(write(tmp_path, "x.json", [1, 2]))


def test_titles_read_as_text():
    assert title_text("Sino-Tibetan_relations_during_the_Ming") == "Sino-Tibetan relations during the Ming"
    assert title_text("Bras%C3%ADlia") == "Brasília"
