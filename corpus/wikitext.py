"""Wikitext to clean plain text, with mwparserfromhell.

Removed: templates (infoboxes, citations, navboxes), <ref> footnotes, tables, galleries, math,
file/image/category/interlanguage links, HTML comments, magic words. Kept: link text (the label,
or the target when there is none), external-link labels, section headings as lines of their own,
list items as plain lines.
"""

from __future__ import annotations

import re

import mwparserfromhell as mwp
from mwparserfromhell.nodes import ExternalLink, Heading, HTMLEntity, Tag, Text, Wikilink

# Link namespaces whose links are media or metadata, not prose.
_DROPPED_LINK_PREFIXES = {"file", "image", "media", "category"}
# Tags whose content is not prose.
_DROPPED_TAGS = {"ref", "references", "table", "gallery", "math", "chem", "score", "timeline", "syntaxhighlight",
                 "source", "templatedata", "imagemap", "graph", "mapframe"}
_LINE_BREAK_TAGS = {"br", "p", "hr"}
_LIST_MARKERS = {"li", "dt", "dd"}  # the `*`, `#`, `;`, `:` at line starts
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_INTERLANGUAGE = re.compile(r"^[a-z]{2,3}(-[a-z]+)?:")
_SPACES = re.compile(r"[ \t\u00a0\u2009\u202f]+")
_SPACE_BEFORE_PUNCT = re.compile(r" +([,.;:!?)])")
# Cut before parsing, each in one linear scan: comments, footnotes and the other tags that are never prose,
# templates, wiki tables and media links. mwparserfromhell hands back what it cannot parse (a quote mark or a template inside a
# footnote, an unclosed link in a table cell) as plain text, markup and all; and what is cut is not parsed at all.
_COMMENT = re.compile(r"<!--.*?(-->|$)", re.S)
_TAG_NAMES = "|".join(sorted(_DROPPED_TAGS))
_DROPPED_ELEMENT = re.compile(rf"<({_TAG_NAMES})\b[^>]*?/\s*>|<({_TAG_NAMES})\b[^>]*>.*?</\2\s*>", re.S | re.I)
_MEDIA_LINK = re.compile(r"\[\[\s*(?:file|image|media)\s*:", re.I)


def _without_tables(text: str) -> str:
    """The text less its wiki tables: lines from one starting `{|` to its matching `|}` (tables nest)."""
    if "{|" not in text:
        return text
    kept, depth = [], 0
    for line in text.split("\n"):
        start = line.lstrip()
        if start.startswith("{|"):
            depth += 1
        elif depth and start.startswith("|}"):
            depth -= 1
        elif not depth:
            kept.append(line)
    return "\n".join(kept)


def _without_templates(text: str) -> str:
    """The text less its templates `{{…}}` (nested ones too): never prose here, and most of an article's parse. One
    between quote marks becomes an empty comment, which renders as nothing but keeps `''{{lang|…}}''` an italic of
    nothing rather than four quote marks."""
    if "{{" not in text:
        return text
    out, depth, start, i = [], 0, 0, 0
    while True:
        opening, closing = text.find("{{", i), text.find("}}", i)
        if opening < 0 and closing < 0:
            break
        if opening >= 0 and (closing < 0 or opening < closing):
            if not depth:
                out.append(text[start:opening])
                begin = opening
            depth, i = depth + 1, opening + 2
        else:
            if depth:
                depth -= 1
                if not depth:
                    start = closing + 2
                    if text[begin - 1:begin] == "'" or text[start:start + 1] == "'":
                        out.append("<!---->")
            i = closing + 2
    if not depth:
        out.append(text[start:])
    return "".join(out)


def _without_media_links(text: str) -> str:
    """The text less its [[File:…]] and [[Image:…]] links, whose captions hold links of their own."""
    out, pos = [], 0
    for found in _MEDIA_LINK.finditer(text):
        if found.start() < pos:
            continue  # inside a media link already cut
        out.append(text[pos:found.start()])
        depth, i = 0, found.start()
        while i < len(text) - 1:
            pair = text[i:i + 2]
            if pair == "[[":
                depth, i = depth + 1, i + 2
            elif pair == "]]":
                depth, i = depth - 1, i + 2
                if not depth:
                    break
            else:
                i += 1
        pos = i if not depth else len(text)
    return "".join(out) + text[pos:]


def cut_before_parsing(wikitext: str) -> str:
    """Wikitext less its comments, footnotes and other non-prose tags, templates, wiki tables and media links."""
    return _without_media_links(_without_tables(_without_templates(_DROPPED_ELEMENT.sub("", _COMMENT.sub("", wikitext)))))


def _link_target(link: Wikilink) -> str:
    return str(link.title).strip().lstrip(":")


def _is_dropped_link(link: Wikilink) -> bool:
    target = _link_target(link)
    prefix = target.split(":", 1)[0].strip().lower() if ":" in target else ""
    return prefix in _DROPPED_LINK_PREFIXES or bool(_INTERLANGUAGE.match(target))


def _render(code: mwp.wikicode.Wikicode | None) -> str:
    """Prose of a parsed fragment, in one pass over its nodes (removing nodes in place is quadratic)."""
    if code is None:
        return ""
    out = []
    for node in code.nodes:
        if isinstance(node, Text):
            out.append(node.value)
        elif isinstance(node, Wikilink):
            if not _is_dropped_link(node):
                out.append(_render(node.text) if node.text is not None else _link_target(node))
        elif isinstance(node, ExternalLink):
            out.append(_render(node.title) if node.title is not None else "")
        elif isinstance(node, Tag):
            tag = str(node.tag).strip().lower()
            if tag in _LINE_BREAK_TAGS:
                out.append("\n")
            elif tag not in _DROPPED_TAGS and tag not in _LIST_MARKERS:
                out.append(_render(node.contents))
        elif isinstance(node, Heading):
            out.append("\n" + _render(node.title) + "\n")
        elif isinstance(node, HTMLEntity):
            out.append(node.normalize())
        # Templates, comments, template arguments: not prose.
    return "".join(out)


def wikitext_to_text(wikitext: str) -> str:
    """Plain text of one article's wikitext: one paragraph, heading or list item per line."""
    return _tidy(_render(mwp.parse(cut_before_parsing(wikitext))))


def _tidy(text: str) -> str:
    text = _MAGIC_WORD.sub("", text)
    lines = []
    for line in text.split("\n"):
        line = _SPACES.sub(" ", line).strip()
        line = _SPACE_BEFORE_PUNCT.sub(r"\1", line)
        if line:
            lines.append(line)
    return "\n".join(lines)


def is_disambiguation(wikitext: str, title: str) -> bool:
    """Disambiguation pages: '(disambiguation)' titles or a disambiguation template."""
    if title.endswith("(disambiguation)"):
        return True
    lowered = wikitext.lower()
    return any(marker in lowered for marker in ("{{disambiguation", "{{disambig", "{{dab", "{{hndis", "{{geodis"))


__all__ = ["wikitext_to_text", "cut_before_parsing", "is_disambiguation"]
