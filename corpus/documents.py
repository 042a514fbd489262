"""Streaming readers for Wikipedia-like corpora: MediaWiki XML dumps, DPR passage TSV, JSONL.

Each reader yields `Document`s one at a time, so memory does not grow with the input; errors are
`InputFileError`s naming the file and the line, record or byte offset.
"""

from __future__ import annotations

import bz2
import collections
import csv
import itertools
import json
import multiprocessing
import os
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from corpus.errors import InputFileError, require_file
from corpus.wikitext import is_disambiguation, wikitext_to_text

FORMATS = ("mediawiki", "dpr_tsv", "jsonl")


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    text: str


def infer_format(path: str | os.PathLike) -> str:
    name = Path(path).name.lower()
    for suffix in (".bz2", ".gz"):
        name = name.removesuffix(suffix)
    if name.endswith(".xml"):
        return "mediawiki"
    if name.endswith(".tsv"):
        return "dpr_tsv"
    if name.endswith((".jsonl", ".json")):
        return "jsonl"
    raise InputFileError(path, None, "cannot tell the format from the file name; "
                                     f"give format= one of {', '.join(FORMATS)}")


def read_documents(path: str | os.PathLike, format: str | None = None, workers: int = 1) -> Iterator[Document]:
    """Documents of a corpus file, in file order; `format` is inferred from the name when None.

    `workers` > 1 cleans MediaWiki pages in that many processes (the wikitext parser is the bottleneck)."""
    require_file(path)
    fmt = format or infer_format(path)
    if fmt == "mediawiki":
        return read_mediawiki(path, workers)
    readers = {"dpr_tsv": read_dpr_tsv, "jsonl": read_jsonl_documents}
    if fmt not in readers:
        raise InputFileError(path, None, f"unknown corpus format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return readers[fmt](path)


# ---- MediaWiki XML (pages-articles) ---------------------------------------------------------------

class _PositionedReader:
    """Wraps the raw file so a decompression or parse error can say how far into the file it was."""

    def __init__(self, raw: BinaryIO, stream: BinaryIO):
        self.raw, self.stream = raw, stream

    def read(self, n: int = -1) -> bytes:
        return self.stream.read(n)

    @property
    def offset(self) -> int:
        return self.raw.tell()


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def read_mediawiki(path: str | os.PathLike, workers: int = 1) -> Iterator[Document]:
    """Main-namespace articles of a MediaWiki export (`.xml` or `.xml.bz2`), wikitext cleaned.

    Skips other namespaces, redirects and disambiguation pages."""
    pages = _mediawiki_pages(path)
    if workers <= 1:
        for page in pages:
            yield Document(page.doc_id, page.title, wikitext_to_text(page.text))
        return
    # Batches go to a pool with a bounded number in flight, so memory stays flat and order is kept.
    # `spawn`: forking a process that holds DuckDB/Arrow threads is unsafe.
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        in_flight: collections.deque = collections.deque()
        for batch in batched(pages, 64):
            in_flight.append((batch, pool.map_async(wikitext_to_text, [p.text for p in batch], chunksize=16)))
            if len(in_flight) > 2 * workers:
                yield from _cleaned(*in_flight.popleft())
        while in_flight:
            yield from _cleaned(*in_flight.popleft())


def _cleaned(batch: list[Document], texts) -> Iterator[Document]:
    for page, text in zip(batch, texts.get()):
        yield Document(page.doc_id, page.title, text)


def batched(items, n: int) -> Iterator[list]:
    """Lists of up to `n` consecutive items."""
    items = iter(items)
    while batch := list(itertools.islice(items, n)):
        yield batch


def _mediawiki_pages(path: str | os.PathLike) -> Iterator[Document]:
    """Article pages with their raw wikitext (not yet cleaned)."""
    require_file(path)
    with open(path, "rb") as raw:
        stream = bz2.BZ2File(raw) if str(path).endswith(".bz2") else raw
        reader = _PositionedReader(raw, stream)
        events = ET.iterparse(reader, events=("start", "end"))
        root = None
        try:
            for event, elem in events:
                if root is None:
                    root = elem
                    if _local(elem.tag) != "mediawiki":
                        raise InputFileError(path, "line 1", f"not a MediaWiki export: root element is <{_local(elem.tag)}>")
                if event != "end" or _local(elem.tag) != "page":
                    continue
                doc = _page_document(elem)
                root.clear()  # drop finished pages so memory stays flat
                if doc is not None:
                    yield doc
        except ET.ParseError as exc:
            line, col = exc.position
            reason = re.sub(r": line \d+, column \d+$", "", str(exc))
            raise InputFileError(path, f"line {line}, column {col}", f"invalid XML ({reason})") from None
        except EOFError:
            raise InputFileError(path, f"byte {reader.offset}",
                                 "compressed stream ends early (truncated .bz2 file?)") from None
        except OSError as exc:
            raise InputFileError(path, f"byte {reader.offset}", f"cannot decompress: {exc}") from None
        if root is None:
            raise InputFileError(path, None, "no XML content")


def _page_document(page: ET.Element) -> Document | None:
    fields = {"title": "", "ns": "0", "id": None, "text": "", "redirect": False}
    for child in page:
        name = _local(child.tag)
        if name in ("title", "ns", "id"):
            fields[name] = (child.text or "").strip()
        elif name == "redirect":
            fields["redirect"] = True
        elif name == "revision":
            for part in child:
                if _local(part.tag) == "text":
                    fields["text"] = part.text or ""
    text, title = fields["text"], fields["title"]
    if fields["ns"] != "0" or fields["redirect"] or text.lstrip().upper().startswith("#REDIRECT"):
        return None
    if is_disambiguation(text, title):
        return None
    return Document(doc_id=fields["id"] or title, title=title, text=text)


# ---- DPR passages TSV -------------------------------------------------------------------------

def read_dpr_tsv(path: str | os.PathLike) -> Iterator[Document]:
    """DPR-style passages: a header `id<TAB>text<TAB>title`, one passage a row (quoted text allowed)."""
    require_file(path)
    csv.field_size_limit(sys.maxsize)
    with open(path, newline="", encoding="utf-8") as fh:
        rows = csv.reader(fh, delimiter="\t")
        try:
            header = [h.strip().lower() for h in next(rows)]
            missing = {"id", "text", "title"} - set(header)
            if missing:
                raise InputFileError(path, "line 1", f"header lacks column(s) {', '.join(sorted(missing))}; "
                                                     "expected id, text, title")
            idx = {name: header.index(name) for name in ("id", "text", "title")}
            for row in rows:
                if not row:
                    continue
                if len(row) != len(header):
                    raise InputFileError(path, f"line {rows.line_num}",
                                         f"expected {len(header)} tab-separated fields, found {len(row)}")
                yield Document(doc_id=row[idx["id"]], title=row[idx["title"]], text=row[idx["text"]])
        except csv.Error as exc:
            raise InputFileError(path, f"line {rows.line_num}", f"malformed TSV: {exc}") from None
        except UnicodeDecodeError as exc:
            raise InputFileError(path, f"byte {exc.start}", "not UTF-8 text") from None


# ---- JSONL ------------------------------------------------------------------------------------

def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSON Lines file."""
    require_file(path)
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except UnicodeDecodeError:
                raise InputFileError(path, f"line {lineno}", "not UTF-8 text") from None
            except json.JSONDecodeError as exc:
                raise InputFileError(path, f"line {lineno}", f"not valid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(obj, dict):
                raise InputFileError(path, f"line {lineno}", f"expected a JSON object, found {type(obj).__name__}")
            yield lineno, obj


def read_jsonl_documents(path: str | os.PathLike) -> Iterator[Document]:
    """One `{"id", "title", "text"}` object per line."""
    for lineno, obj in iter_jsonl(path):
        missing = [k for k in ("id", "title", "text") if k not in obj]
        if missing:
            raise InputFileError(path, f"line {lineno}", f"missing field(s) {', '.join(missing)}")
        yield Document(doc_id=str(obj["id"]), title=str(obj["title"]), text=str(obj["text"]))
