"""Readers for closed-book QA datasets: NQ-open, WebQuestions, HEAD-QA and a generic JSONL.

Each yields `Question`s with a local id unique within the file; `make_question_id` turns it into the
warehouse's `question_id`. Answers longer than a few tokens are filtered as in the NKB paper.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Iterable, Iterator

from corpus.errors import InputFileError
from corpus.files import id_field, iter_jsonl, json_array_items, kind, open_input, parse_json

FORMATS = ("nq_open", "webquestions", "headqa", "triviaqa", "squad", "jsonl")
NO_ANSWERS = "a release without answers (a test file) cannot train or evaluate a model"


@dataclass(frozen=True)
class Question:
    local_id: str
    question: str
    answers: tuple[str, ...]
    where: str = field(default="", compare=False)  # e.g. "line 12", "record 3": for error messages


def make_question_id(dataset: str, split: str, local_id: str) -> str:
    return f"{dataset}/{split}/{local_id}"


def read_questions(path: str | os.PathLike, format: str) -> Iterator[Question]:
    readers = {"nq_open": read_nq_open, "webquestions": read_webquestions, "headqa": read_headqa,
               "triviaqa": read_triviaqa, "squad": read_squad_questions, "jsonl": read_jsonl_questions}
    if format not in readers:
        raise InputFileError(path, None, f"unknown QA format {format!r}; expected one of {', '.join(FORMATS)}")
    return readers[format](path)


def _answers(path, where: str, value) -> tuple[str, ...]:
    """A record's gold answers: a non-empty list of non-empty strings (a single string is one answer)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise InputFileError(path, where, f"answers must be a list of strings, found {kind(value)}")
    if not value:
        raise InputFileError(path, where, "the answer list is empty")
    for answer in value:
        if not isinstance(answer, str):
            raise InputFileError(path, where, f"answers must be strings, found {kind(answer)}")
        if not answer.strip():
            raise InputFileError(path, where, "an answer is empty")
    return tuple(value)


def _question_text(path, where: str, value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputFileError(path, where, "question text is missing or empty")
    return value.strip()


# ---- NQ-open and generic JSONL -------------------------------------------------------------------

def read_nq_open(path: str | os.PathLike) -> Iterator[Question]:
    """NQ-open JSONL: `{"question": str, "answer": [str, ...]}` per line; ids are line numbers."""
    for lineno, obj in iter_jsonl(path):
        where = f"line {lineno}"
        if "answer" not in obj:
            raise InputFileError(path, where, f"missing field 'answer' ({NO_ANSWERS}, e.g. EfficientQA's "
                                              "no-annotations files)")
        yield Question(str(lineno), _question_text(path, where, obj.get("question")),
                       _answers(path, where, obj["answer"]), where)


def read_jsonl_questions(path: str | os.PathLike) -> Iterator[Question]:
    """Generic JSONL: `{"id"?: str, "question": str, "answers": [str, ...]}` per line."""
    for lineno, obj in iter_jsonl(path):
        where = f"line {lineno}"
        if "answers" not in obj:
            raise InputFileError(path, where, "missing field 'answers'")
        local_id = id_field(path, where, obj) if "id" in obj else str(lineno)
        yield Question(local_id, _question_text(path, where, obj.get("question")), _answers(path, where, obj["answers"]),
                       where)


# ---- WebQuestions ---------------------------------------------------------------------------

def load_json(path: str | os.PathLike):
    """A whole JSON file (plain, .gz or .bz2)."""
    with open_input(path) as stream:
        return parse_json(stream.read(), path, None)


def read_squad_questions(path: str | os.PathLike) -> Iterator[Question]:
    """SQuAD's official JSON (v1.1, v2.0; `corpus.squad`): each answerable question with its distinct answers, by
    SQuAD's id; v2.0's unanswerable ones left out."""
    from corpus.squad import read_squad
    for paragraph in read_squad(path).paragraphs:
        for q in paragraph.questions:
            if q.answers:
                yield Question(q.qid, q.question, q.answers, where=f"question {q.qid}")


def read_webquestions(path: str | os.PathLike) -> Iterator[Question]:
    """WebQuestions JSON: a list of `{"utterance", "targetValue": "(list (description X) ...)"}`."""
    records = load_json(path)
    if not isinstance(records, list):
        raise InputFileError(path, None, "expected a JSON list of question records")
    for i, rec in enumerate(records, start=1):
        where = f"record {i}"
        if not isinstance(rec, dict):
            raise InputFileError(path, where, "expected a JSON object")
        if "targetValue" not in rec:
            raise InputFileError(path, where, "missing field 'targetValue'")
        try:
            answers = parse_target_value(rec["targetValue"])
        except ValueError as exc:
            raise InputFileError(path, where, f"bad targetValue: {exc}") from None
        yield Question(str(i), _question_text(path, where, rec.get("utterance")), _answers(path, where, answers), where)


# A quoted description ends at the quote that closes it: the one followed by `)` and then the next description or
# the list's end. The official files never escape a quote inside a description (`(description "Pinocchio
# Medley ("Do You See the Noses Growing?"): …")`, `(description ""A quotation."")`), so an inner quote is text.
_QUOTED_END = re.compile(r'"\s*\)(?=\s*(?:\(description\b|\)\s*$))')


def parse_target_value(value: str) -> list[str]:
    """Answers of a WebQuestions `targetValue`, e.g. `(list (description Paris) (description "Rock and roll"))`.

    Values are bare (up to the closing parenthesis, nested parentheses allowed) or double-quoted; a quoted
    value may hold quotes, parentheses and commas, unescaped, as the official files write them."""
    if not isinstance(value, str):
        raise ValueError(f"expected a string, found {type(value).__name__}")
    s, i, n = value, 0, len(value)

    def skip_ws(j):
        while j < n and s[j].isspace():
            j += 1
        return j

    def expect(j, token):
        j = skip_ws(j)
        if not s.startswith(token, j):
            raise ValueError(f"expected {token!r} at character {j + 1} of {s!r}")
        return j + len(token)

    i = expect(i, "(list")
    answers = []
    while True:
        i = skip_ws(i)
        if i < n and s[i] == ")":
            i += 1
            break
        i = expect(i, "(description")
        i = skip_ws(i)
        if i < n and s[i] == '"':
            end = _QUOTED_END.search(s, i + 1)
            if end is None:
                raise ValueError(f"unterminated quoted description at character {i + 1} of {s!r}")
            text, i = s[i + 1:end.start()], end.end()
        else:
            start, depth = i, 0
            while i < n and not (s[i] == ")" and depth == 0):
                depth += {"(": 1, ")": -1}.get(s[i], 0)
                i += 1
            if i >= n:
                raise ValueError(f"unclosed (description at character {start + 1} of {s!r}")
            text = s[start:i].strip()
            i += 1
        answers.append(text)
    if skip_ws(i) != n:
        raise ValueError(f"unexpected text after the list: {s[i:]!r}")
    if not answers:
        raise ValueError("empty answer list")
    return answers


# ---- HEAD-QA ----------------------------------------------------------------------------------

def read_headqa(path: str | os.PathLike) -> Iterator[Question]:
    """HEAD-QA JSON: `{"exams": {name: {"questions" or "data": [...]}}}`, a list of exams, one exam, or a bare
    list of questions `{"qid", "qtext", "ra", "answers": [{"aid", "atext"}]}`; the answer is the right option's text."""
    data = load_json(path)
    for exam_name, questions in _headqa_exams(path, data):
        for i, q in enumerate(questions, start=1):
            where = f"exam {exam_name!r}, question {i}" if exam_name else f"question {i}"
            if not isinstance(q, dict):
                raise InputFileError(path, where, f"expected a JSON object, found {kind(q)}")
            missing = [k for k in ("qid", "qtext", "ra", "answers") if k not in q]
            if missing:
                raise InputFileError(path, where, f"missing field(s) {', '.join(missing)}")
            if not isinstance(q["answers"], list) or not all(isinstance(a, dict) for a in q["answers"]):
                raise InputFileError(path, where, f"'answers' must be a list of {{aid, atext}} objects, "
                                                  f"found {kind(q['answers'])}")
            options = {str(a.get("aid")): a.get("atext") for a in q["answers"]}
            right = options.get(str(q["ra"]))
            if not isinstance(right, str) or not right.strip():
                raise InputFileError(path, where, f"right answer ra={q['ra']!r} is not among the options' aid values")
            local = f"{exam_name}-{q['qid']}" if exam_name else str(q["qid"])
            yield Question(local, _question_text(path, where, q["qtext"]), (right.strip(),), where)


def _exam_questions(exam) -> list | None:
    """An exam's question list (the official files call it `data`), or None when it has none."""
    if not isinstance(exam, dict):
        return None
    questions = exam.get("questions", exam.get("data"))
    return questions if isinstance(questions, list) else None


def _headqa_exams(path, data) -> Iterator[tuple[str, list]]:
    """(exam name, its questions) for each exam of a HEAD-QA file ("" for a bare list of questions)."""
    def exam_error(where: str):
        return InputFileError(path, where, "expected an object with a 'questions' or 'data' list")

    if isinstance(data, dict) and "exams" in data:
        exams = data["exams"]
        if isinstance(exams, dict):
            items = [(f"exam {name!r}", str(name), exam) for name, exam in exams.items()]
        elif isinstance(exams, list):
            items = [(f"exam {i}", str(exam.get("name", i)) if isinstance(exam, dict) else str(i), exam)
                     for i, exam in enumerate(exams, start=1)]
        else:
            raise InputFileError(path, None, f"'exams' must be an object or a list, found {kind(exams)}")
        for where, name, exam in items:
            if _exam_questions(exam) is None:
                raise exam_error(where)
            yield name, _exam_questions(exam)
    elif isinstance(data, list) and data and all(_exam_questions(e) is not None for e in data):
        for i, exam in enumerate(data, start=1):
            yield str(exam.get("name", i)), _exam_questions(exam)
    elif isinstance(data, list):
        yield "", data
    elif _exam_questions(data) is not None:
        yield str(data.get("name", "")), _exam_questions(data)
    else:
        raise InputFileError(path, None, "expected {'exams': ...}, a list of exams, one exam, or a list of questions")


# ---- TriviaQA ---------------------------------------------------------------------------------

def read_triviaqa(path: str | os.PathLike) -> Iterator[Question]:
    """TriviaQA JSON (the rc and unfiltered releases): `{"Data": [{"QuestionId", "Question", "Answer": {"Value",
    "Aliases", ...}, ...}], "Domain", "Version", ...}`, read as a stream; the answers are the value and its aliases."""
    for n, rec in json_array_items(path, "Data"):
        where = f"record {n}"
        if not isinstance(rec, dict):
            raise InputFileError(path, where, f"expected a JSON object, found {kind(rec)}")
        if "Answer" not in rec:
            raise InputFileError(path, where, f"no 'Answer' ({NO_ANSWERS})")
        answer = rec["Answer"]
        if not isinstance(answer, dict) or "Value" not in answer:
            raise InputFileError(path, where, f"'Answer' must be an object with a 'Value', found {kind(answer)}")
        aliases = answer.get("Aliases", [])
        if not isinstance(aliases, list):
            raise InputFileError(path, where, f"'Aliases' must be a list of strings, found {kind(aliases)}")
        answers = _answers(path, where, list(dict.fromkeys([answer["Value"], *aliases])))
        yield Question(id_field(path, where, rec, "QuestionId"), _question_text(path, where, rec.get("Question")),
                       answers, where)


# ---- repeated questions ----------------------------------------------------------------------

def repeated_questions(questions: Iterable[Question]) -> dict[str, list[str]]:
    """The questions a file asks more than once (case and spacing aside: the same question to a reader), each as
    first worded, with the places it occurs, in file order."""
    places: dict[str, list[Question]] = {}
    for q in questions:
        places.setdefault(" ".join(q.question.casefold().split()), []).append(q)
    return {found[0].question: [q.where for q in found] for found in places.values() if len(found) > 1}


# ---- answer-length filter ------------------------------------------------------------------

def answer_tokens(answer: str) -> int:
    return len(answer.split())


def filter_long_answers(questions: Iterable[Question], max_tokens: int | None) -> tuple[list[Question], int]:
    """Drop answers longer than `max_tokens` whitespace tokens, then questions left with none.

    Returns the kept questions and how many questions were dropped. `None` keeps everything."""
    kept, dropped = [], 0
    for q in questions:
        answers = q.answers if max_tokens is None else tuple(a for a in q.answers if answer_tokens(a) <= max_tokens)
        if answers:
            kept.append(replace(q, answers=answers))
        else:
            dropped += 1
    return kept, dropped
