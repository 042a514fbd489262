"""Readers for general-generation data (the NKB paper's Table 4 check that injection does not hurt it).

Summarisation: JSON Lines, XSum-style: `{"id"?, "document": str, "summary": str}` per line.
Translation: WMT-style records `{"translation": {"<src>": str, "<tgt>": str}}`, as JSON Lines, or one
JSON file holding a list of them (or `{"data": [...]}`, as Hugging Face's JSON exports do).

Each reader yields `Example(local_id, source, target)`; ids default to the line (or list) number.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Iterator

from corpus.errors import InputFileError
from corpus.files import id_field, iter_jsonl, open_input, text_field
from corpus.qa import load_json

KINDS = ("summarization", "translation")


@dataclass(frozen=True)
class Example:
    local_id: str
    source: str
    target: str
    where: str = field(default="", compare=False)  # e.g. "line 12", "record 3": for error messages


def _text(path, where: str, obj: dict, name: str) -> str:
    return text_field(path, where, obj, name, allow_empty=False).strip()


def read_summaries(path: str | os.PathLike) -> Iterator[Example]:
    for lineno, obj in iter_jsonl(path):
        where = f"line {lineno}"
        local_id = id_field(path, where, obj) if "id" in obj else str(lineno)
        yield Example(local_id, _text(path, where, obj, "document"), _text(path, where, obj, "summary"), where)


def _translation_records(path) -> Iterator[tuple[str, dict]]:
    """(where, record): JSON Lines when the first line is a whole record, else one JSON document."""
    with open_input(path) as stream:
        first = stream.readline().strip()
    try:
        jsonl = isinstance(json.loads(first), dict) and "translation" in json.loads(first)
    except (json.JSONDecodeError, UnicodeDecodeError):
        jsonl = False
    if jsonl:
        for lineno, obj in iter_jsonl(path):
            yield f"line {lineno}", obj
        return
    data = load_json(path)
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
        local_id = id_field(path, where, obj) if "id" in obj else str(n)
        yield Example(local_id, _text(path, where, pair, langs[0]), _text(path, where, pair, langs[1]), where)


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
