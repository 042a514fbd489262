"""Streaming readers for Wikipedia-like corpora: MediaWiki XML dumps, DPR passage TSV, JSONL.

Each reader yields `Document`s one at a time, so memory does not grow with the input; errors are
`InputFileError`s naming the file and the line, record or byte offset.
"""

from __future__ import annotations

import collections
import csv
import itertools
import json
import multiprocessing
import os
import re
import signal
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from corpus.errors import InputFileError, require_file
from corpus.files import decoded_lines, id_field, iter_jsonl, kind, open_input, text_field, without_compression
from corpus.wikitext import is_disambiguation, wikitext_to_text

FORMATS = ("mediawiki", "dpr_tsv", "kilt", "squad", "jsonl")


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    text: str
    where: str = field(default="", compare=False)  # e.g. "line 12", "page 40": for error messages


def infer_format(path: str | os.PathLike) -> str:
    name = without_compression(Path(path).name.lower())
    # Wikimedia's split and multistream dumps put the page range after the extension:
    # enwiki-20231101-pages-articles1.xml-p1p41242.bz2, ...-pages-articles-multistream1.xml-p1p41242.bz2
    if name.endswith(".xml") or re.search(r"\.xml-p\d+p\d+", name):
        return "mediawiki"
    if name.endswith(".tsv"):
        return "dpr_tsv"
    if name.endswith(".json") and _looks_like_squad(path):
        return "squad"
    if name.endswith((".jsonl", ".json")):
        return "kilt" if _looks_like_kilt(path) else "jsonl"
    raise InputFileError(path, None, "cannot tell the format from the file name; "
                                     f"give format= one of {', '.join(FORMATS)}")


def read_documents(path: str | os.PathLike, format: str | None = None, workers: int = 1) -> Iterator[Document]:
    """Documents of a corpus file, in file order; `format` is inferred from the name when None.

    `workers` > 1 cleans MediaWiki pages in that many processes (the wikitext parser is the bottleneck)."""
    require_file(path)
    fmt = format or infer_format(path)
    if fmt == "mediawiki":
        return read_mediawiki(path, workers)
    readers = {"dpr_tsv": read_dpr_tsv, "kilt": read_kilt, "squad": read_squad_documents, "jsonl": read_jsonl_documents}
    if fmt not in readers:
        raise InputFileError(path, None, f"unknown corpus format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return readers[fmt](path)


# ---- MediaWiki XML (pages-articles) ---------------------------------------------------------------

def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def read_mediawiki(path: str | os.PathLike, workers: int = 1) -> Iterator[Document]:
    """Main-namespace articles of a MediaWiki export (`.xml`, `.xml.bz2`, `.xml.gz`), wikitext cleaned.

    Skips other namespaces, redirects and disambiguation pages."""
    pages = _mediawiki_pages(path)
    if workers <= 1:
        for page in pages:
            yield Document(page.doc_id, page.title, wikitext_to_text(page.text), page.where)
        return
    # Batches go to a pool with a bounded number in flight, so memory stays flat and order is kept.
    with cleaning_pool(workers) as pool:
        in_flight: collections.deque = collections.deque()
        for batch in batched(pages, 64):
            in_flight.append((batch, pool.map_async(wikitext_to_text, [p.text for p in batch], chunksize=16)))
            if len(in_flight) > 2 * workers:
                yield from _cleaned(*in_flight.popleft())
        while in_flight:
            yield from _cleaned(*in_flight.popleft())


def cleaning_pool(workers: int):
    """Worker processes for wikitext cleaning. `spawn`: forking a process that holds DuckDB/Arrow threads is unsafe."""
    return multiprocessing.get_context("spawn").Pool(workers, initializer=_leave_interrupts_to_the_parent)


def _leave_interrupts_to_the_parent() -> None:
    """A pool worker ignores Ctrl-C, which reaches the whole process group: the parent stops and ends the pool,
    and no worker prints a traceback of its own over the parent's one line."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _cleaned(batch: list[Document], texts) -> Iterator[Document]:
    for page, text in zip(batch, texts.get()):
        yield Document(page.doc_id, page.title, text, page.where)


def batched(items, n: int) -> Iterator[list]:
    """Lists of up to `n` consecutive items."""
    items = iter(items)
    while batch := list(itertools.islice(items, n)):
        yield batch


def batched_documents(documents: Iterator[Document], max_docs: int, max_chars: int) -> Iterator[list[Document]]:
    """Lists of consecutive documents, each ending at `max_docs` documents or once their texts reach
    `max_chars` characters: memory is bounded by text, however long a corpus's documents are (2,000 whole
    Wikipedia articles held ~450 MB; 2,000 DPR passages hold 1 MB)."""
    batch, chars = [], 0
    for doc in documents:
        batch.append(doc)
        chars += len(doc.text)
        if len(batch) >= max_docs or chars >= max_chars:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _mediawiki_pages(path: str | os.PathLike) -> Iterator[Document]:
    """Article pages with their raw wikitext (not yet cleaned)."""
    with open_input(path) as stream:
        root, n = None, 0
        try:
            for event, elem in ET.iterparse(stream, events=("start", "end")):
                if root is None:
                    root = elem
                    if _local(elem.tag) != "mediawiki":
                        raise InputFileError(path, "line 1", f"not a MediaWiki export: root element is <{_local(elem.tag)}>")
                if event != "end" or _local(elem.tag) != "page":
                    continue
                n += 1
                doc = _page_document(elem, path, n)
                root.clear()  # drop finished pages so memory stays flat
                if doc is not None:
                    yield doc
        except ET.ParseError as exc:
            line, col = exc.position
            reason = re.sub(r": line \d+, column \d+$", "", str(exc))
            raise InputFileError(path, f"line {line}, column {col}", f"invalid XML ({reason})") from None
        if root is None:
            raise InputFileError(path, None, "no XML content")


def _page_document(page: ET.Element, path, n: int) -> Document | None:
    """The page as a document (None for other namespaces, redirects, disambiguation pages and content that is not
    wikitext). A page's text is its last revision's main text (a history dump lists older revisions first; an
    export 0.11 `<content>` slot holds other content). A page without a title, an id or a text is not what a
    MediaWiki export writes: it is refused, named by number, and so is a stub dump's `<text bytes="…"/>`."""
    fields = {"title": None, "ns": "0", "id": None, "text": None, "redirect": False, "model": "wikitext",
              "bytes": "0", "deleted": False}
    for child in page:
        name = _local(child.tag)
        if name in ("title", "ns", "id"):
            fields[name] = (child.text or "").strip()
        elif name == "redirect":
            fields["redirect"] = True
        elif name == "revision":
            for part in child:
                tag = _local(part.tag)
                if tag == "text":
                    fields.update(text=part.text or "", bytes=part.get("bytes", "0"), deleted="deleted" in part.attrib)
                elif tag == "model":
                    fields["model"] = (part.text or "").strip()
    title, text = fields["title"], fields["text"]
    where = f"page {n}" + (f" ({title!r})" if title else "")
    missing = [tag for tag, present in (("title", title), ("id", fields["id"]), ("text", text is not None))
               if not present]  # an empty <text/> is an empty page; no <text> at all is not a page
    if missing:
        raise InputFileError(path, where, f"no <{missing[0]}>")
    if not text and not fields["deleted"] and fields["bytes"].isdigit() and int(fields["bytes"]) > 0:
        raise InputFileError(path, where, f"<text> is empty but has {fields['bytes']} bytes: a stub dump holds no "
                                          "text; use a pages-articles dump")
    if fields["ns"] != "0" or fields["redirect"] or fields["model"] != "wikitext":
        return None
    if text.lstrip().upper().startswith("#REDIRECT") or is_disambiguation(text, title):
        return None
    return Document(doc_id=fields["id"], title=title, text=text, where=f"page {n}")


# ---- DPR passages TSV -------------------------------------------------------------------------

def read_dpr_tsv(path: str | os.PathLike) -> Iterator[Document]:
    """DPR-style passages: a header `id<TAB>text<TAB>title`, one passage a row (quoted text allowed)."""
    csv.field_size_limit(sys.maxsize)
    with open_input(path) as stream:
        rows = csv.reader((text for _, text in decoded_lines(stream, path)), delimiter="\t")
        try:
            header = [h.strip().lower() for h in next(rows, [])]
            missing = {"id", "text", "title"} - set(header)
            if missing:
                raise InputFileError(path, "line 1", f"header lacks column(s) {', '.join(sorted(missing))}; "
                                                     "expected id, text, title")
            idx = {name: header.index(name) for name in ("id", "text", "title")}
            for row in rows:
                if not row:
                    continue
                where = f"line {rows.line_num}"
                if len(row) != len(header):
                    raise InputFileError(path, where, f"expected {len(header)} tab-separated fields, found {len(row)}")
                if not row[idx["id"]].strip():
                    raise InputFileError(path, where, "the id is empty")
                yield Document(doc_id=row[idx["id"]], title=row[idx["title"]], text=row[idx["text"]], where=where)
        except csv.Error as exc:
            raise InputFileError(path, f"line {rows.line_num}", f"malformed TSV: {exc}") from None


# ---- SQuAD ------------------------------------------------------------------------------------

def read_squad_documents(path: str | os.PathLike) -> Iterator[Document]:
    """SQuAD's official JSON (`corpus.squad`): each paragraph a document with its article's title, id
    `ARTICLE.PARAGRAPH` (their places in the file)."""
    from corpus.squad import read_squad
    for p in read_squad(path).paragraphs:
        yield Document(doc_id=p.doc_id, title=p.title, text=p.context, where=f"data[{p.article}].paragraphs[{p.index}]")


# ---- JSONL ------------------------------------------------------------------------------------

def read_jsonl_documents(path: str | os.PathLike) -> Iterator[Document]:
    """One `{"id", "title", "text"}` object per line, or Anserini's JsonCollection `{"id", "contents"}` (what
    pyserini indexes, and FlashRAG's corpora): the title is then the first line of `contents`, without the double
    quotes it may have, as Wikipedia passages in that form put it (`"Aaron"\nAaron Aaron ( or ; …`, `Absalon\n…`);
    `contents` without a line break has no title."""
    for lineno, obj in iter_jsonl(path):
        where = f"line {lineno}"
        if "contents" in obj and "text" not in obj:
            title, text = _titled_contents(text_field(path, where, obj, "contents"))
            yield Document(doc_id=id_field(path, where, obj), title=title, text=text, where=where)
            continue
        missing = [k for k in ("id", "title", "text") if k not in obj]
        if missing:
            raise InputFileError(path, where, f"missing field(s) {', '.join(missing)} (a passage is "
                                              "{\"id\", \"title\", \"text\"} or Anserini's {\"id\", \"contents\"})")
        yield Document(doc_id=id_field(path, where, obj), title=text_field(path, where, obj, "title"),
                       text=text_field(path, where, obj, "text"), where=where)


def _titled_contents(contents: str) -> tuple[str, str]:
    first, newline, rest = contents.partition("\n")
    if not newline:
        return "", contents
    if len(first) > 1 and first.startswith('"') and first.endswith('"'):
        first = first[1:-1]
    return first.strip(), rest


# ---- KILT knowledge source -----------------------------------------------------------------------

KILT_MARKERS = ("Section::::", "BULLET::::")  # what KILT writes before section titles and list items


def read_kilt(path: str | os.PathLike) -> Iterator[Document]:
    """KILT's knowledge source (`kilt_knowledgesource.json`, JSON Lines): `{"wikipedia_id", "wikipedia_title",
    "text": [paragraph, ...], "anchors", "categories", "history", "wikidata_info"}` per page. The first paragraph is
    the title; section titles and list items lose KILT's markers and keep a line of their own."""
    for lineno, obj in iter_jsonl(path):
        where = f"line {lineno}"
        title = text_field(path, where, obj, "wikipedia_title", allow_empty=False)
        paragraphs = obj.get("text")
        if not isinstance(paragraphs, list) or not all(isinstance(p, str) for p in paragraphs):
            raise InputFileError(path, where, f"field 'text' must be a list of paragraphs, found {kind(paragraphs)}")
        if paragraphs and paragraphs[0].strip() == title:
            paragraphs = paragraphs[1:]
        lines = [_without_kilt_marker(p) for p in paragraphs]
        yield Document(doc_id=id_field(path, where, obj, "wikipedia_id"), title=title,
                       text="\n".join(line for line in lines if line), where=where)


def _without_kilt_marker(paragraph: str) -> str:
    paragraph = paragraph.strip()
    for marker in KILT_MARKERS:
        if paragraph.startswith(marker):
            return paragraph[len(marker):].removeprefix("- ").strip()
    return paragraph


def _looks_like_squad(path) -> bool:
    """Whether a .json file is SQuAD's: one object whose first keys hold `data` (or `version`, which precedes it)."""
    try:
        with open_input(path) as stream:
            head = stream.read(256)
    except InputFileError:
        return False
    head = head.decode("utf-8", "replace") if isinstance(head, bytes) else head
    return bool(re.match(r'\s*\{\s*"(version|data)"\s*:', head))


def _looks_like_kilt(path) -> bool:
    """Whether a .json/.jsonl corpus is KILT's knowledge source: its first record has KILT's fields."""
    try:
        with open_input(path) as stream:
            first = stream.readline(1 << 20)
        record = json.loads(first)
    except (InputFileError, ValueError):
        return False
    return isinstance(record, dict) and {"wikipedia_id", "wikipedia_title", "text"} <= record.keys()
