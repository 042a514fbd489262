"""Questions written from the knowledge itself: each salient span of a segment asked for by the rest of its
sentence, as question and answer (`who designed the eiffel tower` → `Gustave Eiffel`).

Salient span masking asks a causal LM for a span from the words before it, so a fact is learnt tied to them (Allen-Zhu
& Li, *Physics of Language Models 3.1*), and a span that opens its sentence is not asked for at all (`cued_spans`).
A question names the fact by the rest of its sentence, words before and after the span alike, in the form the model
is then asked in. Mecklenburg et al. 2024 (arXiv 2404.00213) inject new facts by fine-tuning on question-answer
pairs generated fact by fact from the documents, every fact covered; pre-instruction-tuning (Jiang et al. 2024, arXiv
2402.12847) trains on QA pairs before the documents.

The questions are made by rule, not by a model: the span's entity label chooses the question word (PERSON → who,
DATE → when, GPE → where, CARDINAL → how many, else what), which takes the span's place (a place's or a date's
preposition with it; a place with no place's preposition, or `from`, before it is asked by `what`: `the capital of
France` is no answer to `where`, and spaCy's GPE takes in some people); the rest of the sentence stays in its order
(less a comma the span leaves on its own), lower-cased as NQ-open's questions are. Each is an echo question (`when
the eiffel tower was completed for the world's fair`), not English a person would write, but it holds the words a
real question about the fact shares with the sentence, and its answer is the span word for word.
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator

from corpus.segment import sentences

# The question word for each of spaCy's entity labels (corpus.ner's salient spans); a label not here is not asked.
QUESTION_WORDS = {
    "PERSON": "who", "NORP": "what", "FAC": "where", "ORG": "what", "GPE": "where", "LOC": "where",
    "PRODUCT": "what", "EVENT": "what", "WORK_OF_ART": "what", "LAW": "what", "LANGUAGE": "what language",
    "DATE": "when", "TIME": "when", "PERCENT": "what percentage", "MONEY": "how much", "QUANTITY": "how much",
    "ORDINAL": "which", "CARDINAL": "how many",
}
# Prepositions that go with a place's or a time's question word (`born in 1867` → `when ... born`).
_ABSORBED = {"where": {"in", "at", "on", "near", "into", "inside"},
             "when": {"in", "on", "at", "during", "since"}}
_STRANDED = {",", ";", ":"}  # a separator the span's removal leaves on its own
_EDGE_PUNCTUATION = " \t\n.,;:!?\"'“”‘’()[]–—-"
_WORD = re.compile(r"\w")
MIN_WORDS = 3  # the rest of a sentence shorter than this (`who he met`) names no fact


def question_for(sentence: str, start: int, end: int, label: str) -> str | None:
    """The question that `sentence[start:end]`, a salient span of that label, answers; None where there is none: a
    label with no question word, a span that the rest of the sentence names again (it would be copied, not
    recalled), or too few words left to name a fact."""
    word = QUESTION_WORDS.get(label)
    span = sentence[start:end].strip()
    if word is None or not _WORD.search(span):
        return None
    before, after = sentence[:start].split(), sentence[end:].split()
    if after and after[0].startswith(("'s", "’s")):  # a possessive (`Union's forces`): no question word stands so
        return None
    if after and after[0] in _STRANDED:  # the comma that followed the span (`a native of Lyon, worked for`)
        after = after[1:]
    if before and before[-1].lower() in _ABSORBED.get(word, ()):
        before = before[:-1]
    elif word == "where" and not (before and before[-1].lower() == "from"):  # `where ... a composer from` stays
        word = "what"  # not a place the fact happens at (`the capital of France`, `Vienna hosted ...`)
    rest = " ".join(before + after).strip(_EDGE_PUNCTUATION)
    if span.lower() in rest.lower() or len(rest.split()) < MIN_WORDS:
        return None
    return f"{word} {rest}".lower()


def knowledge_questions(texts: dict[str, str], spans: Iterable[tuple[str, int, int, str]]) -> list[dict]:
    """{segment_id, question, answer, label} for each salient span (segment_id, start, end, label) of the segments
    `texts` (segment_id → text) that `question_for` can ask; each (question, answer) once, in the spans' order. A
    question the knowledge answers in more than one way (`who was born in zasvoufam`) is left out: trained on, it
    would teach one of its answers for all."""
    asked = list(_asked(texts, spans))
    answers: dict[str, set[str]] = {}
    for row in asked:
        answers.setdefault(row["question"], set()).add(row["answer"].lower())
    return [row for row in asked if len(answers[row["question"]]) == 1]


def _asked(texts: dict[str, str], spans: Iterable[tuple[str, int, int, str]]) -> Iterator[dict]:
    seen: set[tuple[str, str]] = set()
    bounds: dict[str, list[tuple[int, int]]] = {}
    for segment_id, start, end, label in spans:
        text = texts.get(segment_id)
        if text is None:
            continue
        if segment_id not in bounds:
            bounds[segment_id] = sentences(text)
        sentence = next(((a, b) for a, b in bounds[segment_id] if a <= start and end <= b), None)
        if sentence is None:  # a span across a sentence boundary (NER over a cut): no one sentence to ask it by
            continue
        a, b = sentence
        question = question_for(text[a:b], start - a, end - a, label)
        answer = text[start:end].strip()
        if question and (question, answer) not in seen:
            seen.add((question, answer))
            yield {"segment_id": segment_id, "question": question, "answer": answer, "label": label}
