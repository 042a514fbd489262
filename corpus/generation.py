"""Readers for general-generation data (the NKB paper's Table 4 check that injection does not hurt it).

Summarisation: JSON Lines, XSum-style: `{"id"?, "document": str, "summary": str}` per line.
Translation: WMT-style records `{"translation": {"<src>": str, "<tgt>": str}}`, as JSON Lines, or one
JSON file holding a list of them (or `{"data": [...]}`, as Hugging Face's JSON exports do).

Each reader yields `Example(local_id, source, target)`; ids default to the line (or list) number.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterator

from corpus.documents import iter_jsonl
from corpus.errors import InputFileError, require_file

KINDS = ("summarization", "translation")


@dataclass(frozen=True)
class Example:
    local_id: str
    source: str
    target: str


def _text(path, where: str, obj: dict, field: str) -> str:
    value = obj.get(field)
    if not isinstance(value, str) or not value.strip():
        raise InputFileError(path, where, f"field {field!r} is missing or not a non-empty string")
    return value.strip()


def read_summaries(path: str | os.PathLike) -> Iterator[Example]:
    for lineno, obj in iter_jsonl(path):
        where = f"line {lineno}"
        yield Example(str(obj.get("id", lineno)), _text(path, where, obj, "document"), _text(path, where, obj, "summary"))


def _translation_records(path) -> Iterator[tuple[str, dict]]:
    """(where, record): JSON Lines when the first line is a whole record, else one JSON document."""
    require_file(path)
    with open(path, "rb") as fh:
        first = fh.readline().strip()
    try:
        jsonl = isinstance(json.loads(first), dict) and "translation" in json.loads(first)
    except json.JSONDecodeError:
        jsonl = False
    if jsonl:
        for lineno, obj in iter_jsonl(path):
            yield f"line {lineno}", obj
        return
    try:
        data = json.loads(open(path, "rb").read())
    except json.JSONDecodeError as exc:
        raise InputFileError(path, f"line {exc.lineno}", f"not valid JSON ({exc.msg})") from None
    records = data.get("data") if isinstance(data, dict) else data
    if not isinstance(records, list):
        raise InputFileError(path, None, "expected translation records: JSON Lines, a JSON list, or {\"data\": [...]}")
    for i, obj in enumerate(records, start=1):
        if not isinstance(obj, dict):
            raise InputFileError(path, f"record {i}", f"expected a JSON object, found {type(obj).__name__}")
        yield f"record {i}", obj


def read_translations(path: str | os.PathLike, source_lang: str | None = None,
                      target_lang: str | None = None) -> Iterator[Example]:
    """Pairs from `translation` records. With no languages given, a record must hold exactly two, and the
    file's first record fixes their order (source first)."""
    langs = (source_lang, target_lang) if source_lang and target_lang else None
    for n, (where, obj) in enumerate(_translation_records(path), start=1):
        pair = obj.get("translation")
        if not isinstance(pair, dict):
            raise InputFileError(path, where, "missing object field 'translation' ({\"<src>\": ..., \"<tgt>\": ...})")
        if langs is None:
            if len(pair) != 2:
                raise InputFileError(path, where, f"'translation' has languages {sorted(pair)}; name the source "
                                                  "and target languages")
            langs = tuple(pair)
        missing = [lang for lang in langs if lang not in pair]
        if missing:
            raise InputFileError(path, where, f"'translation' lacks language {missing[0]!r} (has {sorted(pair)})")
        yield Example(str(obj.get("id", n)), _text(path, where, pair, langs[0]), _text(path, where, pair, langs[1]))


def translation_languages(path: str | os.PathLike) -> tuple[str, str]:
    """(source, target) of a file whose records hold exactly two languages, in the first record's order."""
    for where, obj in _translation_records(path):
        pair = obj.get("translation")
        if not isinstance(pair, dict) or len(pair) != 2:
            raise InputFileError(path, where, "cannot tell the languages: 'translation' must hold exactly two; "
                                              "name the source and target languages")
        return tuple(pair)
    raise InputFileError(path, None, "no translation records")


def read_examples(path: str | os.PathLike, kind: str, source_lang: str | None = None,
                  target_lang: str | None = None) -> Iterator[Example]:
    if kind == "summarization":
        return read_summaries(path)
    if kind == "translation":
        return read_translations(path, source_lang, target_lang)
    raise InputFileError(path, None, f"unknown generation kind {kind!r}; expected one of {', '.join(KINDS)}")


def model_input(kind: str, source: str, source_lang: str | None = None, target_lang: str | None = None) -> str:
    """T5's task prefixes: `summarize: …`, `translate <src> to <tgt>: …`."""
    if kind == "summarization":
        return f"summarize: {source}"
    return f"translate {source_lang or 'source'} to {target_lang or 'target'}: {source}"
