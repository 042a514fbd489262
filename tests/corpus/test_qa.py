import json

import pytest

from corpus.errors import InputFileError
from corpus.qa import Question, filter_long_answers, parse_target_value, read_questions, repeated_questions


@pytest.mark.parametrize("value,expected", [
    ("(list (description Jamaica))", ["Jamaica"]),
    ('(list (description "Jazmyn Bieber") (description "Jaxon Bieber"))', ["Jazmyn Bieber", "Jaxon Bieber"]),
    ("(list (description Paris (France)) (description 1923))", ["Paris (France)", "1923"]),
    ("  (list\n (description X)  )  ", ["X"]),
    # The official files' quirks: quotes inside a quoted description are not escaped.
    ('(list (description "Orvel Medley ("Can You Hear It?"): A Theme") (description "Good Night"))',
     ['Orvel Medley ("Can You Hear It?"): A Theme', "Good Night"]),
    ('(list (description ""A line that someone once said.""))', ['"A line that someone once said."']),
    ('(list (description "Two songs") (description ""Hope" is a word") (description Bells))',
     ["Two songs", '"Hope" is a word', "Bells"]),
    ('(list (description "Temperance "Tempie" Quint"))', ['Temperance "Tempie" Quint']),
    ('(list (description "a\\b"))', ["a\\b"]),  # no escapes: a backslash is a backslash
])
def test_parse_target_value(value, expected):
    assert parse_target_value(value) == expected


@pytest.mark.parametrize("value", ["(description X)", "(list (description X)", '(list (description "X))',
                                   '(list (description "X) (description Y)', "(list)", "(list (description X)) extra"])
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


def _triviaqa(path, data, **top):
    path.write_text(json.dumps({"Data": data, "Domain": "Web", "Version": 1.0} | top, indent=2))
    return path


def _trivia_record(qid, question, value, aliases):
    """The release's record layout: answer value and aliases, normalised forms, and evidence lists."""
    return {"Answer": {"Aliases": aliases, "MatchedWikiEntityName": value, "NormalizedAliases": [a.lower() for a in aliases],
                       "NormalizedValue": value.lower(), "Type": "WikipediaEntity", "Value": value},
            "EntityPages": [{"DocSource": "TagMe", "Filename": "X.txt", "Title": "X"}], "Question": question,
            "QuestionId": qid, "QuestionSource": "http://example.org/", "SearchResults": [{"Rank": 0, "Title": "T"}]}


def test_triviaqa_answers_are_the_value_and_its_aliases(tmp_path):
    path = _triviaqa(tmp_path / "web-dev.json", [
        _trivia_record("tc_1", "Which river runs through Velmora?", "Orvel", ["Orvel", "Orvel River", "River Orvel"]),
        _trivia_record("tc_2", "Who painted the Silver Lantern?", "Ada Quint", ["Quint"])])
    qs = list(read_questions(path, "triviaqa"))
    assert [(q.local_id, q.answers) for q in qs] == [("tc_1", ("Orvel", "Orvel River", "River Orvel")),
                                                     ("tc_2", ("Ada Quint", "Quint"))]


def test_triviaqa_data_may_come_after_the_other_keys_and_is_streamed(tmp_path):
    path = tmp_path / "wikipedia-train.json"
    records = [_trivia_record(f"q{i}", f"Question {i}?", f"A{i}", [f"A{i}"]) for i in range(300)]
    path.write_text(json.dumps({"Domain": "Wikipedia", "Split": "train", "Data": records}))
    from corpus import files
    streamed = list(files.json_array_items(path, "Data", chunk=512))  # items cross many chunk boundaries
    assert len(streamed) == 300 and streamed[-1][1]["QuestionId"] == "q299"
    assert [q.local_id for q in read_questions(path, "triviaqa")][-1] == "q299"


def test_triviaqa_test_files_without_answers_are_refused_by_name(tmp_path):
    record = _trivia_record("tc_9", "Q?", "A", ["A"])
    del record["Answer"]
    path = _triviaqa(tmp_path / "web-test-without-answers.json", [record])
    with pytest.raises(InputFileError, match="record 1: no 'Answer' \\(a release without answers"):
        list(read_questions(path, "triviaqa"))


def test_nq_open_files_released_without_answers_say_so(tmp_path):
    path = tmp_path / "NQ-open.efficientqa.dev.1.1.no-annotations.jsonl"
    path.write_text('{"question": "who painted the silver lantern"}\n')
    with pytest.raises(InputFileError, match="line 1: missing field 'answer' \\(a release without answers"):
        list(read_questions(path, "nq_open"))


def test_efficientqa_test_records_use_their_gold_answers(tmp_path):
    path = tmp_path / "NQ-open.efficientqa.test.1.1.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": ["Ada"], "def_correct_predictions": ["Ada Quint"],
                                "poss_correct_predictions": [], "def_incorrect_predictions": ["Bo"],
                                "answer_and_def_correct_predictions": ["Ada", "Ada Quint"]}) + "\n")
    assert [q.answers for q in read_questions(path, "nq_open")] == [("Ada",)]


def test_headqa_official_layout_exams_hold_their_questions_under_data(tmp_path):
    """The official files: {version, language, exams: {name: {name, category, year, data: [{qid (a string),
    qtext, ra (a string), answers: [{aid (a number), atext}], image}]}}}."""
    exam = {"name": "Cuaderno_2099_1_X", "category": "biology", "year": "2099", "data": [
        {"qid": "1", "qtext": "Which organ filters blood?", "ra": "2", "image": "",
         "answers": [{"aid": 1, "atext": "The heart."}, {"aid": 2, "atext": "The kidney."}]}]}
    path = tmp_path / "dev_HEAD_EN.json"
    path.write_text(json.dumps({"version": "1.0", "language": "en", "exams": {"Cuaderno_2099_1_X": exam}}))
    assert [(q.local_id, q.answers) for q in read_questions(path, "headqa")] == [
        ("Cuaderno_2099_1_X-1", ("The kidney.",))]


def test_repeated_questions_are_found_with_their_places_case_and_spacing_aside():
    asked = [Question("1", "Who wrote it?", ("a",), "line 1"), Question("2", "where?", ("b",), "line 2"),
             Question("3", "who  wrote it?", ("a",), "line 3"), Question("4", "Who wrote it?", ("c",), "line 4"),
             Question("5", "Where?", ("b",), "line 5"), Question("6", "when?", ("d",), "line 6")]
    assert repeated_questions(asked) == {"Who wrote it?": ["line 1", "line 3", "line 4"], "where?": ["line 2", "line 5"]}
    assert repeated_questions(asked[:2]) == {}
