"""Opening input files, and the small checks every reader shares.

A file is read as it is (`.gz` and `.bz2` decompressed as they are read: dumps and datasets ship so); a
decompression failure, a JSON syntax error or a field of the wrong type becomes one `InputFileError` naming
the file and where in it.
"""

from __future__ import annotations

import bz2
import contextlib
import glob
import gzip
import io
import json
import os
import re
import zlib
from typing import BinaryIO, Iterator

from corpus.errors import InputFileError, require_file

COMPRESSED = (".gz", ".bz2")


GLOB_CHARACTERS = "*?["


def is_pattern(path: str) -> bool:
    """Whether `path` is a glob pattern (`*`, `?`, `[…]`) rather than one file's name."""
    return any(c in str(path) for c in GLOB_CHARACTERS)


def _natural(path: str) -> list:
    """Sort key that reads the numbers in a name as numbers: a split dump's `articles2` before `articles10`."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path)]


def matching_files(path: str) -> list[str]:
    """The files `path` names: itself, or the files a glob pattern matches, in natural order (the parts of a split
    dump: `enwiki-latest-pages-articles*.xml-p*.bz2`). A pattern that matches nothing is an error naming it."""
    if not is_pattern(path):
        require_file(path)
        return [str(path)]
    found = sorted((p for p in glob.glob(os.path.expanduser(path)) if os.path.isfile(p)), key=_natural)
    if not found:
        raise InputFileError(path, None, "no file matches this pattern")
    return found


def without_compression(name: str) -> str:
    """The file name without a compression suffix (what the format is told from)."""
    for suffix in COMPRESSED:
        if name.lower().endswith(suffix):
            return name[:-len(suffix)]
    return name


@contextlib.contextmanager
def open_input(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """The file's bytes, decompressed when its name ends in .gz or .bz2. A damaged or cut compressed stream,
    met anywhere while the block runs, becomes an InputFileError with the compressed file's byte offset."""
    require_file(path)
    name = str(path).lower()
    with open(path, "rb") as raw:
        stream = gzip.GzipFile(fileobj=raw) if name.endswith(".gz") else \
            bz2.BZ2File(raw) if name.endswith(".bz2") else raw
        try:
            yield stream
        except EOFError:
            raise InputFileError(path, f"byte {raw.tell()}", "compressed stream ends early (truncated file?)") from None
        except (OSError, zlib.error) as exc:
            raise InputFileError(path, f"byte {raw.tell()}", f"cannot decompress: {exc}") from None


def decoded_lines(lines, path) -> Iterator[tuple[int, str]]:
    """(byte offset, text) of each line of a binary stream, as UTF-8; a leading BOM is dropped. A byte that is
    not UTF-8 is named by its offset in the (decompressed) stream."""
    offset = 0
    for raw in lines:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputFileError(path, f"byte {offset + exc.start}", "not UTF-8 text") from None
        yield offset, text.removeprefix("\ufeff") if offset == 0 else text
        offset += len(raw)


def parse_json(data: bytes | str, path, where: str | None):
    """One JSON value; a syntax error names `where` plus the column (or line and column of a whole file)."""
    try:
        return json.loads(data)
    except UnicodeDecodeError as exc:
        raise InputFileError(path, where or f"byte {exc.start}", "not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        reason = exc.msg[:-3] + " there" if exc.msg.endswith(" at") else exc.msg  # "…string starting at"
        raise InputFileError(path, where or f"line {exc.lineno}",
                             f"not valid JSON at column {exc.colno} ({reason})") from None


def kind(value) -> str:
    """What a JSON value is, as an error message says it: null, true, 3.5, a string, a list, an object."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return repr(value)
    return {str: "a string", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def text_field(path, where: str, obj: dict, field: str, allow_empty: bool = True) -> str:
    """A field that must hold a string."""
    value = obj.get(field)
    if not isinstance(value, str):
        raise InputFileError(path, where, f"field {field!r} must be a string, found {kind(value)}")
    if not allow_empty and not value.strip():
        raise InputFileError(path, where, f"field {field!r} is empty")
    return value


def id_field(path, where: str, obj: dict, field: str = "id") -> str:
    """An id: a non-empty string, or an integer (as datasets number their records)."""
    value = obj.get(field)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InputFileError(path, where, f"field {field!r} must be a string or an integer, found {kind(value)}")
    if isinstance(value, str) and not value.strip():
        raise InputFileError(path, where, f"field {field!r} is empty")
    return str(value)


def repeats(items: Iterator[tuple[str, str]]) -> tuple[str, list[str]] | None:
    """The first key of (key, where) pairs that occurs twice, with where it occurs (its first two places)."""
    first: dict[str, str] = {}
    for key, where in items:
        if key in first:
            return key, [first[key], where]
        first[key] = where
    return None


def json_array_items(path, member: str, chunk: int = 1 << 20) -> Iterator[tuple[int, object]]:
    """(n, item) for the items of the array under the top-level key `member` of a JSON object file, read as a
    stream: memory holds one item, not the file (TriviaQA's releases run to gigabytes). Other top-level values
    are skipped; a missing key, or a value that is not an array, is an InputFileError."""
    decoder = json.JSONDecoder()
    with open_input(path) as stream:
        text = io.TextIOWrapper(stream, encoding="utf-8")
        buf, pos, consumed, done = "", 0, 0, False

        def more() -> bool:  # append the next chunk; False at the end of the file
            nonlocal buf, pos, consumed, done
            block = "" if done else text.read(chunk)
            done = not block
            consumed += pos
            buf, pos = buf[pos:] + block, 0
            return bool(block)

        def skip_space() -> str:  # the next non-blank character ("" at the end)
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos].isspace():
                    pos += 1
                if pos < len(buf) or not more():
                    return buf[pos:pos + 1]

        def value():
            nonlocal pos
            skip_space()
            while True:
                try:
                    item, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError as exc:
                    where = f"character {consumed + exc.pos + 1}"  # before more() moves the buffer
                    if more():
                        continue  # the value runs past the buffer
                    raise InputFileError(path, where, f"not valid JSON ({exc.msg})") from None
                pos = end
                return item

        def expect(chars: str) -> str:
            nonlocal pos
            found = skip_space()
            if not found or found not in chars:
                raise InputFileError(path, f"character {consumed + pos + 1}", f"expected one of {chars!r}, "
                                                                              f"found {found or 'the end of the file'!r}")
            pos += 1
            return found

        try:
            expect("{")
            while True:
                if skip_space() == "}":
                    break
                key = value()
                expect(":")
                if key != member:
                    value()
                elif expect("[") and skip_space() == "]":
                    return
                else:
                    n = 0
                    while True:
                        n += 1
                        yield n, value()
                        if expect(",]") == "]":
                            return
                if expect(",}") == "}":
                    break
        except UnicodeDecodeError as exc:
            raise InputFileError(path, None, f"not UTF-8 text ({exc.reason})") from None
    raise InputFileError(path, None, f"no {member!r} array at the top level")


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSON Lines file."""
    with open_input(path) as stream:
        for lineno, raw in enumerate(stream, start=1):
            if not raw.strip():
                continue
            obj = parse_json(raw, path, f"line {lineno}")
            if not isinstance(obj, dict):
                raise InputFileError(path, f"line {lineno}", f"expected a JSON object, found {type(obj).__name__}")
            yield lineno, obj
