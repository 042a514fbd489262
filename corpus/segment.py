"""Split documents into segments on sentence boundaries, each short enough for one T5 input."""

from __future__ import annotations

import re
from typing import Iterator

# A sentence ends at . ! ? (optionally followed by closing quotes/brackets) before whitespace and an
# uppercase letter, digit or opening quote — or at a line break (headings, list items).
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9À-ÖØ-Þ])|\n+")
# Abbreviations that end with a period but do not end a sentence.
_ABBREVIATIONS = ("Mr.", "Mrs.", "Ms.", "Dr.", "Prof.", "St.", "Jr.", "Sr.", "vs.", "e.g.", "i.e.", "etc.", "No.",
                  "Mt.", "Ft.", "Gen.", "Col.", "Lt.", "Inc.", "Ltd.", "Co.", "U.S.", "U.K.")

# T5's input is 512 SentencePiece tokens; English prose averages about 1.3-1.5 tokens per word, so
# 300 words leaves room for the sentinel and the occasional long word.
DEFAULT_MAX_WORDS = 300


def sentences(text: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of the sentences of `text`, whitespace excluded."""
    spans, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        candidate = text[start:m.start()].rstrip()
        if "\n" not in m.group(0) and candidate.endswith(_ABBREVIATIONS):
            continue
        _append(text, start, m.start(), spans)
        start = m.end()
    _append(text, start, len(text), spans)
    return spans


def _append(text: str, start: int, end: int, spans: list[tuple[int, int]]) -> None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    if end > start:
        spans.append((start, end))


def segment(text: str, max_words: int = DEFAULT_MAX_WORDS) -> Iterator[str]:
    """Consecutive sentences packed into segments of at most `max_words` words.

    A single sentence longer than that is cut at word boundaries (rare: tables turned to text)."""
    current: list[str] = []
    words = 0
    for start, end in sentences(text):
        sentence = text[start:end]
        n = len(sentence.split())
        if n > max_words:
            if current:
                yield " ".join(current)
                current, words = [], 0
            tokens = sentence.split()
            for i in range(0, len(tokens), max_words):
                yield " ".join(tokens[i:i + max_words])
            continue
        if words + n > max_words and current:
            yield " ".join(current)
            current, words = [], 0
        current.append(sentence)
        words += n
    if current:
        yield " ".join(current)
