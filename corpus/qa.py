"""Readers for closed-book QA datasets: NQ-open, WebQuestions, HEAD-QA and a generic JSONL.

Each yields `Question`s with a local id unique within the file; `make_question_id` turns it into the
warehouse's `question_id`. Answers longer than a few tokens are filtered as in the NKB paper.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Iterable, Iterator

from corpus.documents import iter_jsonl
from corpus.errors import InputFileError, require_file

FORMATS = ("nq_open", "webquestions", "headqa", "jsonl")


@dataclass(frozen=True)
class Question:
    local_id: str
    question: str
    answers: tuple[str, ...]


def make_question_id(dataset: str, split: str, local_id: str) -> str:
    return f"{dataset}/{split}/{local_id}"


def read_questions(path: str | os.PathLike, format: str) -> Iterator[Question]:
    readers = {"nq_open": read_nq_open, "webquestions": read_webquestions, "headqa": read_headqa,
               "jsonl": read_jsonl_questions}
    if format not in readers:
        raise InputFileError(path, None, f"unknown QA format {format!r}; expected one of {', '.join(FORMATS)}")
    return readers[format](path)


def _answers(path, where: str, value) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(a, (str, int, float)) for a in value):
        raise InputFileError(path, where, f"answers must be a list of strings, found {json.dumps(value)[:80]}")
    return tuple(str(a) for a in value)


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
            raise InputFileError(path, where, "missing field 'answer'")
        yield Question(str(lineno), _question_text(path, where, obj.get("question")),
                       _answers(path, where, obj["answer"]))


def read_jsonl_questions(path: str | os.PathLike) -> Iterator[Question]:
    """Generic JSONL: `{"id"?: str, "question": str, "answers": [str, ...]}` per line."""
    for lineno, obj in iter_jsonl(path):
        where = f"line {lineno}"
        if "answers" not in obj:
            raise InputFileError(path, where, "missing field 'answers'")
        yield Question(str(obj.get("id", lineno)), _question_text(path, where, obj.get("question")),
                       _answers(path, where, obj["answers"]))


# ---- WebQuestions ---------------------------------------------------------------------------

def _load_json(path: str | os.PathLike):
    require_file(path)
    with open(path, "rb") as fh:
        try:
            return json.load(fh)
        except UnicodeDecodeError:
            raise InputFileError(path, None, "not UTF-8 text") from None
        except json.JSONDecodeError as exc:
            raise InputFileError(path, f"line {exc.lineno}, column {exc.colno}", f"not valid JSON ({exc.msg})") from None


def read_webquestions(path: str | os.PathLike) -> Iterator[Question]:
    """WebQuestions JSON: a list of `{"utterance", "targetValue": "(list (description X) ...)"}`."""
    records = _load_json(path)
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
        yield Question(str(i), _question_text(path, where, rec.get("utterance")), tuple(answers))


def parse_target_value(value: str) -> list[str]:
    """Answers of a WebQuestions `targetValue`, e.g. `(list (description Paris) (description "Rock, \\"n\\" roll"))`.

    Values are bare (up to the closing parenthesis, nested parentheses allowed) or double-quoted with
    backslash escapes, so they may hold quotes, parentheses and commas."""
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
            i, text = _quoted(s, i)
            i = expect(i, ")")
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


def _quoted(s: str, i: int) -> tuple[int, str]:
    """Parse a double-quoted string starting at s[i] == '"'; returns (index after it, text)."""
    out, i = [], i + 1
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            out.append(s[i + 1])
            i += 2
        elif c == '"':
            return i + 1, "".join(out)
        else:
            out.append(c)
            i += 1
    raise ValueError(f"unterminated quoted value in {s!r}")


# ---- HEAD-QA ----------------------------------------------------------------------------------

def read_headqa(path: str | os.PathLike) -> Iterator[Question]:
    """HEAD-QA JSON: `{"exams": {name: {"questions": [...]}}}`, a list of exams, or a bare list of
    questions `{"qid", "qtext", "ra", "answers": [{"aid", "atext"}]}`; the answer is the right option's text."""
    data = _load_json(path)
    for exam_name, questions in _headqa_exams(path, data):
        for i, q in enumerate(questions, start=1):
            where = f"exam {exam_name!r}, question {i}" if exam_name else f"question {i}"
            if not isinstance(q, dict):
                raise InputFileError(path, where, "expected a JSON object")
            missing = [k for k in ("qid", "qtext", "ra", "answers") if k not in q]
            if missing:
                raise InputFileError(path, where, f"missing field(s) {', '.join(missing)}")
            options = {str(a.get("aid")): a.get("atext") for a in q["answers"] if isinstance(a, dict)}
            right = options.get(str(q["ra"]))
            if not isinstance(right, str):
                raise InputFileError(path, where, f"right answer ra={q['ra']!r} is not among the options' aid values")
            local = f"{exam_name}-{q['qid']}" if exam_name else str(q["qid"])
            yield Question(local, _question_text(path, where, q["qtext"]), (right.strip(),))


def _headqa_exams(path, data) -> Iterator[tuple[str, list]]:
    if isinstance(data, dict) and "exams" in data:
        exams = data["exams"]
        items = exams.items() if isinstance(exams, dict) else ((e.get("name", str(i)), e) for i, e in enumerate(exams, 1))
        for name, exam in items:
            if not isinstance(exam, dict) or not isinstance(exam.get("questions"), list):
                raise InputFileError(path, f"exam {name!r}", "expected an object with a 'questions' list")
            yield str(name), exam["questions"]
    elif isinstance(data, list) and (not data or "questions" not in data[0]):
        yield "", data
    elif isinstance(data, list):
        for i, exam in enumerate(data, start=1):
            yield str(exam.get("name", i)), exam.get("questions", [])
    elif isinstance(data, dict) and isinstance(data.get("questions"), list):
        yield str(data.get("name", "")), data["questions"]
    else:
        raise InputFileError(path, None, "expected {'exams': ...}, a list of exams, or a list of questions")


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
