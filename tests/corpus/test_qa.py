import json

import pytest

from corpus.errors import InputFileError
from corpus.qa import Question, filter_long_answers, parse_target_value, read_questions


@pytest.mark.parametrize("value,expected", [
    ("(list (description Jamaica))", ["Jamaica"]),
    ('(list (description "Jazmyn Bieber") (description "Jaxon Bieber"))', ["Jazmyn Bieber", "Jaxon Bieber"]),
    ('(list (description "Rock, \\"n\\" roll (band)"))', ['Rock, "n" roll (band)']),
    ("(list (description Paris (France)) (description 1923))", ["Paris (France)", "1923"]),
    ('(list (description "a\\\\b"))', ["a\\b"]),
    ("  (list\n (description X)  )  ", ["X"]),
])
def test_parse_target_value(value, expected):
    assert parse_target_value(value) == expected


@pytest.mark.parametrize("value", ["(description X)", "(list (description X)", '(list (description "X))',
                                   "(list)", "(list (description X)) extra"])
def test_parse_target_value_rejects(value):
    with pytest.raises(ValueError):
        parse_target_value(value)


def test_nq_open(tmp_path):
    path = tmp_path / "nq.jsonl"
    path.write_text('{"question": "who wrote blue", "answer": ["Ada Quint", "Ada"]}\n'
                    '{"question": "when", "answer": "1901"}\n')
    assert list(read_questions(path, "nq_open")) == [
        Question("1", "who wrote blue", ("Ada Quint", "Ada")), Question("2", "when", ("1901",))]


def test_webquestions(tmp_path):
    path = tmp_path / "wq.json"
    path.write_text(json.dumps([{"url": "u", "utterance": "what is x?",
                                 "targetValue": '(list (description "A, B") (description C))'}]))
    assert list(read_questions(path, "webquestions")) == [Question("1", "what is x?", ("A, B", "C"))]


def test_webquestions_record_without_target_value(tmp_path):
    path = tmp_path / "wq.json"
    path.write_text(json.dumps([{"utterance": "a?", "targetValue": "(list (description A))"}, {"utterance": "b?"}]))
    with pytest.raises(InputFileError) as err:
        list(read_questions(path, "webquestions"))
    assert str(err.value) == f"{path}, record 2: missing field 'targetValue'"


def test_webquestions_invalid_json_names_line(tmp_path):
    path = tmp_path / "wq.json"
    path.write_text('[\n{"utterance": "a?",\n "targetValue": }\n]')
    with pytest.raises(InputFileError, match=r"line 3: not valid JSON at column \d+"):
        list(read_questions(path, "webquestions"))


HEADQA_Q = {"qid": 7, "qtext": "Which organ?", "ra": 2,
            "answers": [{"aid": 1, "atext": "Liver"}, {"aid": 2, "atext": "Heart"}, {"aid": 3, "atext": "Lung"}]}


def test_headqa_exams_and_bare_list(tmp_path):
    exams = tmp_path / "exams.json"
    exams.write_text(json.dumps({"version": "1", "exams": {"MIR_2013": {"name": "MIR_2013", "questions": [HEADQA_Q]}}}))
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps([HEADQA_Q]))
    assert list(read_questions(exams, "headqa")) == [Question("MIR_2013-7", "Which organ?", ("Heart",))]
    assert list(read_questions(bare, "headqa")) == [Question("7", "Which organ?", ("Heart",))]


def test_headqa_right_answer_missing(tmp_path):
    path = tmp_path / "h.json"
    path.write_text(json.dumps([dict(HEADQA_Q, ra=9)]))
    with pytest.raises(InputFileError, match="question 1: right answer ra=9"):
        list(read_questions(path, "headqa"))


def test_generic_jsonl_uses_given_ids(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"id": "q9", "question": "x?", "answers": ["y"]}\n{"question": "z?", "answers": ["w"]}\n')
    assert [q.local_id for q in read_questions(path, "jsonl")] == ["q9", "2"]


def test_question_without_text(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": " ", "answers": ["y"]}\n')
    with pytest.raises(InputFileError, match="line 1: question text is missing"):
        list(read_questions(path, "jsonl"))


def test_long_answers_filtered_and_counted():
    questions = [Question("1", "a", ("one two three four five",)), Question("2", "b", ("one two three four five six",)),
                 Question("3", "c", ("a b c d e f", "short"))]
    kept, dropped = filter_long_answers(questions, 5)
    assert [q.local_id for q in kept] == ["1", "3"] and kept[1].answers == ("short",)
    assert dropped == 1
    assert filter_long_answers(questions, None) == (questions, 0)
