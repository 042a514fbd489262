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
    return _tidy(_render(mwp.parse(wikitext)))


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


__all__ = ["wikitext_to_text", "is_disambiguation"]
