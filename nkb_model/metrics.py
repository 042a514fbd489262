"""Exact match with SQuAD's answer normalisation (lower case, no punctuation, no articles, single spaces)."""

from __future__ import annotations

import re
import string
from typing import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold_answers: Iterable[str]) -> bool:
    """True when the normalised prediction equals any normalised gold answer."""
    pred = normalize_answer(prediction)
    return any(pred == normalize_answer(gold) for gold in gold_answers)
