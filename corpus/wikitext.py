"""Wikitext to clean plain text: what is never prose cut in linear scans, the rest tokenized by mwparserfromhell
and rendered straight from its tokens.

Removed: templates (infoboxes, citations, navboxes), <ref> footnotes, tables, galleries, math,
file/image/category/interlanguage links, HTML comments, magic words. Kept: link text (the label,
or the target when there is none), external-link labels, section headings as lines of their own,
list items as plain lines.
"""

from __future__ import annotations

import re

import mwparserfromhell as mwp
from mwparserfromhell.nodes import HTMLEntity
from mwparserfromhell.parser import CTokenizer, use_c
from mwparserfromhell.parser import tokens as _T
from mwparserfromhell.parser.builder import Builder
from mwparserfromhell.parser.tokenizer import Tokenizer

_Tokenizer = CTokenizer if use_c and CTokenizer else Tokenizer  # the C one where built, as mwparserfromhell.parse

# Link namespaces whose links are media or metadata, not prose.
_DROPPED_LINK_PREFIXES = {"file", "image", "media", "category"}
# Tags whose content is not prose.
DROPPED_TAGS = {"ref", "references", "table", "gallery", "math", "chem", "score", "timeline", "syntaxhighlight",
                 "source", "templatedata", "imagemap", "graph", "mapframe"}
LINE_BREAK_TAGS = {"br", "p", "hr"}
LIST_MARKERS = {"li", "dt", "dd"}  # the `*`, `#`, `;`, `:` at line starts
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_INTERLANGUAGE = re.compile(r"^[a-z]{2,3}(-[a-z]+)?:")
# Cut before parsing, each in one linear scan: comments, footnotes and the other tags that are never prose,
# templates, wiki tables and media links. mwparserfromhell hands back what it cannot parse (a quote mark or a template inside a
# footnote, an unclosed link in a table cell) as plain text, markup and all; and what is cut is not parsed at all.
_COMMENT = re.compile(r"<!--.*?(-->|$)", re.S)
_TAG_NAMES = "|".join(sorted(DROPPED_TAGS))
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


def is_dropped_link(target: str) -> bool:
    """Media, category and interlanguage links: not prose. `target` is the link's title as written."""
    target = target.strip().lstrip(":")
    prefix = target.split(":", 1)[0].strip().lower() if ":" in target else ""
    return prefix in _DROPPED_LINK_PREFIXES or bool(_INTERLANGUAGE.match(target))


_TAG_PARTS = (_T.TagAttrStart, _T.TagCloseOpen, _T.TagCloseSelfclose)


class _Renderer:
    """Prose straight from mwparserfromhell's token stream, in one pass: the tokens are what its parser builds its
    tree from, and building that tree of node objects (in Python) was most of a parse's time, for a tree read
    once (docs/results.md, ingest). Each construct renders as its node would: a link as its label (or its target when it has none),
    an external link as its label, a heading on a line of its own, a tag as its contents (a line break for
    br/p/hr; nothing for non-prose tags and list markers), an entity as its character; templates, template
    arguments and comments as nothing. The token sequences nest as the tree would."""

    def __init__(self, tokens: list):
        self.tokens, self.i = tokens, 0

    def render(self, stops: tuple = (), skipped: tuple = ()) -> tuple[str, object]:
        """Render tokens from the current one up to the first of type `stops` at this depth, passing over `skipped`
        ones (a construct's own separators); returns the text and that stop token (None at the end). A stray
        separator or close is malformed, as the tree builder finds it."""
        out, tokens = [], self.tokens
        while self.i < len(tokens):
            token = tokens[self.i]
            kind = type(token)
            self.i += 1
            if kind is _T.Text:
                out.append(token.text)
            elif kind in stops:
                return "".join(out), token
            elif kind in skipped:
                continue
            elif kind is _T.WikilinkOpen:
                out.append(self.wikilink())
            elif kind is _T.TagOpenOpen:
                out.append(self.tag())
            elif kind is _T.HeadingStart:
                out.append("\n" + self.render((_T.HeadingEnd,))[0] + "\n")
            elif kind is _T.HTMLEntityStart:
                out.append(self.entity())
            elif kind is _T.ExternalLinkOpen:
                _, stop = self.render((_T.ExternalLinkSeparator, _T.ExternalLinkClose))  # the URL: not prose
                if type(stop) is _T.ExternalLinkSeparator:
                    out.append(self.render((_T.ExternalLinkClose,))[0])
            elif kind is _T.TemplateOpen:
                self.render((_T.TemplateClose,), (_T.TemplateParamSeparator, _T.TemplateParamEquals))
            elif kind is _T.ArgumentOpen:
                self.render((_T.ArgumentClose,), (_T.ArgumentSeparator,))
            elif kind is _T.CommentStart:
                self.render((_T.CommentEnd,))
            else:
                raise mwp.parser.ParserError(f"unexpected {kind.__name__}")
        if stops:
            raise mwp.parser.ParserError(f"missed a {stops[0].__name__}")
        return "".join(out), None

    def source(self, start: int, stop: int) -> str:
        """The wikitext that tokens[start:stop] were read from (a link's title as written)."""
        part = self.tokens[start:stop]
        if len(part) == 1 and type(part[0]) is _T.Text:
            return part[0].text
        return str(Builder().build(part))  # it consumes the (copied) list

    def wikilink(self) -> str:
        start = self.i
        _, stop = self.render((_T.WikilinkSeparator, _T.WikilinkClose))
        target = self.source(start, self.i - 1)
        label = self.render((_T.WikilinkClose,))[0] if type(stop) is _T.WikilinkSeparator else None
        if is_dropped_link(target):
            return ""
        return label if label is not None else target.strip().lstrip(":")

    def tag(self) -> str:
        name, stop = self.render(_TAG_PARTS)
        while type(stop) is _T.TagAttrStart:  # its attributes: never prose
            _, stop = self.render(_TAG_PARTS, (_T.TagAttrEquals, _T.TagAttrQuote))
        contents = ""
        if type(stop) is _T.TagCloseOpen:
            contents = self.render((_T.TagOpenClose,))[0]
            self.render((_T.TagCloseClose,))  # the closing tag's name
        tag = name.strip().lower()
        if tag in LINE_BREAK_TAGS:
            return "\n"
        return "" if tag in DROPPED_TAGS or tag in LIST_MARKERS else contents

    def entity(self) -> str:
        token = self.tokens[self.i]
        if type(token) is _T.HTMLEntityNumeric:
            hexadecimal = type(self.tokens[self.i + 1]) is _T.HTMLEntityHex
            self.i += 2 if hexadecimal else 1
            node = HTMLEntity(self.tokens[self.i].text, named=False, hexadecimal=hexadecimal)
        else:
            node = HTMLEntity(token.text, named=True, hexadecimal=False)
        self.i += 2  # the value and HTMLEntityEnd
        return node.normalize()


def tokenize(wikitext: str) -> list:
    """mwparserfromhell's tokens of `wikitext` (as `mwparserfromhell.parse` reads it, before building its tree)."""
    return _Tokenizer().tokenize(wikitext, 0, False)


def render_tokens(tokens: list) -> str:
    """The prose of a token stream, as its tree would render (see `_Renderer`)."""
    return _Renderer(tokens).render()[0]


def wikitext_to_text(wikitext: str) -> str:
    """Plain text of one article's wikitext: one paragraph, heading or list item per line."""
    return tidy(render_tokens(tokenize(cut_before_parsing(wikitext))))


def tidy(text: str) -> str:
    """One paragraph, heading or list item per line: each run of white space one space, lines stripped, empty ones
    dropped, no space before punctuation. String methods, not patterns: matching at every space was half the
    time it took."""
    lines = (" ".join(line.split()) for line in _MAGIC_WORD.sub("", text).split("\n"))
    text = "\n".join(filter(None, lines))
    for mark in ",.;:!?)":  # spaces come single by now
        text = text.replace(" " + mark, mark)
    return text


def is_disambiguation(wikitext: str, title: str) -> bool:
    """Disambiguation pages: '(disambiguation)' titles or a disambiguation template."""
    if title.endswith("(disambiguation)"):
        return True
    lowered = wikitext.lower()
    return any(marker in lowered for marker in ("{{disambiguation", "{{disambig", "{{dab", "{{hndis", "{{geodis"))


__all__ = ["wikitext_to_text", "cut_before_parsing", "is_disambiguation", "tokenize", "render_tokens", "tidy"]
