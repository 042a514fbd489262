"""SQuAD's official JSON (v1.1 and v2.0, as rajpurkar.github.io/SQuAD-explorer publishes them): articles of
Wikipedia paragraphs, each paragraph with the questions crowdworkers asked of it.

    {"version": "1.1" | "v2.0", "data": [{"title": "Super_Bowl_50", "paragraphs": [{"context": "...", "qas": [
        {"id": "56be4db0acb8001400a502ec", "question": "...", "answers": [{"text": "Denver Broncos",
         "answer_start": 177}, ...], "is_impossible": false, "plausible_answers": [...]}]}]}]}

What the project reads of it: each paragraph as a knowledge document with its article's title (the title's
underscores as spaces, any percent-encoding decoded), and each answerable question with its distinct answers (the
dev sets give three annotators' answers, often the same). v2.0's unanswerable questions (`is_impossible`, no
`answers`: their `plausible_answers` are not answers) are counted and left out. v1.1 has no `is_impossible`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import unquote

from corpus.errors import InputFileError, require_file
from corpus.files import kind, open_input, parse_json


@dataclass(frozen=True)
class SquadQuestion:
    qid: str
    question: str
    answers: tuple[str, ...]  # distinct, in the file's order; empty: unanswerable (v2.0)


@dataclass(frozen=True)
class Paragraph:
    article: int  # the article's place in the file
    index: int    # the paragraph's place in its article
    title: str
    context: str
    questions: tuple[SquadQuestion, ...]

    @property
    def doc_id(self) -> str:
        return f"{self.article}.{self.index}"


@dataclass(frozen=True)
class SquadFile:
    version: str
    paragraphs: tuple[Paragraph, ...]

    @property
    def articles(self) -> int:
        return len({p.article for p in self.paragraphs})

    def questions(self, answerable: bool = True) -> list[SquadQuestion]:
        return [q for p in self.paragraphs for q in p.questions if bool(q.answers) == answerable]


def title_text(title: str) -> str:
    """An article's title as text: `Super_Bowl_50` is Super Bowl 50, `Beyonc%C3%A9` Beyoncé."""
    return unquote(title).replace("_", " ").strip()


def read_squad(path: str | os.PathLike) -> SquadFile:
    """The whole file; an `InputFileError` names the JSON place at fault (data[3].paragraphs[2].qas[5])."""
    require_file(path)
    with open_input(path) as stream:
        top = parse_json(stream.read(), path, None)
    if not isinstance(top, dict) or not isinstance(top.get("data"), list):
        raise InputFileError(path, None, f"not SQuAD's JSON: an object with a `data` list of articles is expected, "
                                         f"found {kind(top)}" + (f" with keys {', '.join(top)}" if isinstance(top, dict)
                                                                 else ""))
    paragraphs = []
    for a, article in enumerate(top["data"]):
        where = f"data[{a}]"
        title = _field(path, where, article, "title", str)
        for p, paragraph in enumerate(_field(path, where, article, "paragraphs", list)):
            at = f"{where}.paragraphs[{p}]"
            context = _field(path, at, paragraph, "context", str)
            questions = tuple(_question(path, f"{at}.qas[{q}]", qa)
                              for q, qa in enumerate(_field(path, at, paragraph, "qas", list)))
            paragraphs.append(Paragraph(a, p, title_text(title), context, questions))
    return SquadFile(str(top.get("version", "")), tuple(paragraphs))


def _field(path, where: str, obj, key: str, expected: type):
    if not isinstance(obj, dict) or key not in obj:
        raise InputFileError(path, where, f"no `{key}`" + ("" if isinstance(obj, dict) else f" (found {kind(obj)})"))
    if not isinstance(obj[key], expected):
        raise InputFileError(path, where, f"`{key}` must be {kind(expected())}, found {kind(obj[key])}")
    return obj[key]


def _question(path, where: str, qa) -> SquadQuestion:
    question = _field(path, where, qa, "question", str).strip()
    if not question:
        raise InputFileError(path, where, "the question is empty")
    answers = []
    for n, answer in enumerate(_field(path, where, qa, "answers", list)):
        text = _field(path, f"{where}.answers[{n}]", answer, "text", str).strip()
        if text and text not in answers:
            answers.append(text)
    if qa.get("is_impossible") is True:
        answers = []  # v2.0: a question the paragraph does not answer
    elif not answers:
        raise InputFileError(path, where, "an answerable question (no `is_impossible`) without an answer")
    return SquadQuestion(_field(path, where, qa, "id", str), question, tuple(answers))
