import json
import random

import pytest

from corpus.documents import Document, batched_documents, infer_format, read_documents
from corpus.errors import InputFileError
from tests.conftest import mediawiki_dump, mediawiki_page

ARTICLE = """{{Infobox person|name=Ada Quint|birth_place=[[Velmora]]}}
'''Ada Quint''' (born 3 May 1901) was a painter from [[Velmora]] in [[Zürich|Zürich canton]].<ref>{{cite book|title=X}}</ref>
== Career ==
{| class="wikitable"
! Year !! Work
|-
| 1920 || Blue
|}
She worked at [[Orvel Works]].<!-- todo -->
[[Category:Painters]]"""


def sample_dump() -> str:
    return mediawiki_dump([
        mediawiki_page("Ada Quint", ARTICLE, 1),
        mediawiki_page("Ada (disambiguation)", "'''Ada''' may refer to:\n* [[Ada Quint]]", 2),
        mediawiki_page("Quint", "'''Quint''' may be:\n* [[Ada Quint]]\n{{disambiguation}}", 3),
        mediawiki_page("A. Quint", "#REDIRECT [[Ada Quint]]", 4, redirect="Ada Quint"),
        mediawiki_page("Category:Painters", "Painters.", 5, ns=14),
        mediawiki_page("Template:Infobox person", "{{{name}}}", 6, ns=10),
        mediawiki_page("Velmora", "'''Velmora''' is a city.", 7),
    ])


def test_mediawiki_bz2_keeps_articles_only_and_cleans_them(write_bz2):
    path = write_bz2("dump.xml.bz2", sample_dump())
    docs = list(read_documents(path))
    assert [(d.doc_id, d.title) for d in docs] == [("1", "Ada Quint"), ("7", "Velmora")]
    assert docs[0].text == ("Ada Quint (born 3 May 1901) was a painter from Velmora in Zürich canton.\n"
                            "Career\nShe worked at Orvel Works.")


def test_plain_xml_reads_the_same(tmp_path, write_bz2):
    plain = tmp_path / "dump.xml"
    plain.write_text(sample_dump(), encoding="utf-8")
    assert list(read_documents(plain)) == list(read_documents(write_bz2("d.xml.bz2", sample_dump())))


def test_dpr_tsv_with_quoted_text(tmp_path):
    path = tmp_path / "psgs.tsv"
    path.write_text('id\ttext\ttitle\n1\t"Ada said ""hi"", then\tleft"\tAda Quint\n2\tVelmora is a city.\tVelmora\n',
                    encoding="utf-8")
    docs = list(read_documents(path))
    assert [(d.doc_id, d.title, d.text) for d in docs] == [
        ("1", "Ada Quint", 'Ada said "hi", then\tleft'), ("2", "Velmora", "Velmora is a city.")]


def test_jsonl_documents(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"id": 5, "title": "T", "text": "Ünïcode"}) + "\n\n", encoding="utf-8")
    assert [(d.doc_id, d.text) for d in read_documents(path)] == [("5", "Ünïcode")]


def test_anserini_contents_documents_take_their_title_from_the_first_line(tmp_path):
    """Anserini's JsonCollection as pyserini and FlashRAG write Wikipedia passages: the title on the first line of
    `contents`, quoted or not (both occur in one file), the passage after it; contents on one line have no title."""
    path = tmp_path / "corpus.jsonl"
    rows = [{"id": "0", "contents": '"Evan Morrow"\nEvan Morrow Evan Morrow (born 1977) is "a lobbyist".'},
            {"id": 1, "contents": "Absalom\ndragged forth, and then\nbaptized."},
            {"id": "2", "contents": "A passage without a title."}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert [(d.doc_id, d.title, d.text) for d in read_documents(path)] == [
        ("0", "Evan Morrow", 'Evan Morrow Evan Morrow (born 1977) is "a lobbyist".'),
        ("1", "Absalom", "dragged forth, and then\nbaptized."),
        ("2", "", "A passage without a title.")]


@pytest.mark.parametrize("name,fmt", [("a.xml.bz2", "mediawiki"), ("enwiki.XML", "mediawiki"),
                                      # Wikimedia's split dumps: the page range follows the extension
                                      ("enwiki-20231101-pages-articles1.xml-p1p41242.bz2", "mediawiki"),
                                      ("enwiki-20231101-pages-articles-multistream27.xml-p68475910p69975909.bz2",
                                       "mediawiki"),
                                      ("psgs_w100.tsv", "dpr_tsv"), ("c.jsonl", "jsonl")])
def test_format_inferred_from_name(name, fmt):
    assert infer_format(name) == fmt


def test_unknown_extension_asks_for_format(tmp_path):
    with pytest.raises(InputFileError, match="give format="):
        infer_format(tmp_path / "corpus.dat")


# ---- bad input: one clear error naming the file and the place ----

def test_truncated_bz2_names_byte_offset(tmp_path, write_bz2):
    good = write_bz2("good.xml.bz2", sample_dump() * 1)
    data = good.read_bytes()
    bad = tmp_path / "cut.xml.bz2"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputFileError) as err:
        list(read_documents(bad))
    assert str(bad) in str(err.value) and "byte " in str(err.value) and "truncated" in str(err.value)


def test_invalid_xml_names_line_and_column(write_bz2):
    text = mediawiki_dump([mediawiki_page("A", "ok", 1)]).replace("<ns>0</ns>", "<ns>0</nss>")
    path = write_bz2("bad.xml.bz2", text)
    with pytest.raises(InputFileError) as err:
        list(read_documents(path))
    assert str(err.value).startswith(f"{path}, line 3, column ") and str(err.value).endswith("invalid XML (mismatched tag)")


def test_not_a_mediawiki_export(tmp_path):
    path = tmp_path / "other.xml"
    path.write_text("<html><body/></html>")
    with pytest.raises(InputFileError, match="not a MediaWiki export"):
        list(read_documents(path))


def test_jsonl_line_that_is_not_json(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": 1, "title": "a", "text": "b"}\n{"id": 2, "title": \n', encoding="utf-8")
    with pytest.raises(InputFileError) as err:
        list(read_documents(path))
    assert str(err.value).startswith(f"{path}, line 2: not valid JSON")


def test_jsonl_missing_field(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": 1, "text": "b"}\n', encoding="utf-8")
    with pytest.raises(InputFileError, match=r"line 1: missing field\(s\) title \(a passage is .*contents"):
        list(read_documents(path))


def test_tsv_without_required_header(tmp_path):
    path = tmp_path / "p.tsv"
    path.write_text("id\tbody\n1\tx\n")
    with pytest.raises(InputFileError, match="line 1: header lacks column"):
        list(read_documents(path))


def test_tsv_row_with_wrong_field_count(tmp_path):
    path = tmp_path / "p.tsv"
    path.write_text("id\ttext\ttitle\n1\tx\tX\n2\tonly two\n")
    with pytest.raises(InputFileError, match="line 3: expected 3 tab-separated fields, found 2"):
        list(read_documents(path))


@pytest.mark.parametrize("name", ["empty.xml.bz2", "empty.jsonl", "empty.tsv"])
def test_empty_file(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"")
    with pytest.raises(InputFileError, match="file is empty") as err:
        list(read_documents(path))
    assert str(path) in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(InputFileError, match="no such file"):
        list(read_documents(tmp_path / "nope.xml.bz2"))


def test_mediawiki_reader_streams(tmp_path):
    """The first page comes out before the reader has seen the (broken) end of the file."""
    rng = random.Random(0)
    pages = [mediawiki_page(f"P{i}", " ".join(f"{rng.getrandbits(64):x}" for _ in range(60)), i)
             for i in range(1, 2001)]
    path = tmp_path / "big.xml"
    path.write_text(mediawiki_dump(pages).replace("</mediawiki>", "<page><<<"), encoding="utf-8")
    it = read_documents(path)
    assert next(it).title == "P1"
    with pytest.raises(InputFileError, match="invalid XML"):
        list(it)


def test_parallel_cleaning_gives_the_same_documents_in_order(write_bz2):
    pages = [mediawiki_page(f"P{i}", ARTICLE.replace("Ada", f"Ada{i}"), i) for i in range(1, 400)]
    path = write_bz2("many.xml.bz2", mediawiki_dump(pages))
    assert list(read_documents(path, workers=2)) == list(read_documents(path))


def kilt_page(wikipedia_id, title, paragraphs):
    """A record in the layout of KILT's knowledge source (its first paragraph is the title)."""
    return {"_id": "x", "wikipedia_id": wikipedia_id, "wikipedia_title": title, "text": [title + "\n", *paragraphs],
            "anchors": [{"text": "Velmora", "href": "Velmora", "paragraph_id": 1, "start": 0, "end": 7}],
            "categories": "Painters,People", "history": {"pageid": 7, "revid": 1, "url": "https://example.org"},
            "wikidata_info": {"wikidata_id": "Q1", "aliases": {"alias": []}}}


def test_kilt_knowledge_source_drops_the_title_paragraph_and_its_markers(tmp_path):
    path = tmp_path / "kilt_knowledgesource.json"
    path.write_text(json.dumps(kilt_page("7", "Ada Quint", [
        "Ada Quint (born 1901) was a painter.\n", "Section::::Career.\n", "She worked at Orvel Works.\n",
        "BULLET::::- The Silver Lantern (1920)\n"])) + "\n", encoding="utf-8")
    assert infer_format(path) == "kilt"  # told from the first record: the file is JSON Lines named .json
    (doc,) = read_documents(path)
    assert (doc.doc_id, doc.title) == ("7", "Ada Quint")
    assert doc.text == "Ada Quint (born 1901) was a painter.\nCareer.\nShe worked at Orvel Works.\nThe Silver Lantern (1920)"


def test_a_plain_jsonl_corpus_is_not_taken_for_kilt(tmp_path):
    path = tmp_path / "docs.json"
    path.write_text(json.dumps({"id": 1, "title": "T", "text": "x"}) + "\n")
    assert infer_format(path) == "jsonl"


def test_a_multistream_bz2_dump_reads_like_one_stream(tmp_path):
    """Wikipedia's -multistream.xml.bz2: the header and siteinfo, then pages in groups of 100, then the closing
    tag, each compressed as a bz2 stream of its own and the streams concatenated."""
    import bz2
    pages = [mediawiki_page(f"Page {i}", f"'''Page {i}''' is page number {i}.", i) for i in range(1, 251)]
    whole = mediawiki_dump(pages)
    head, _, rest = whole.partition("<page>")
    body, _, tail = ("<page>" + rest).rpartition("</mediawiki>")
    groups = ["".join(pages[i:i + 100]) for i in range(0, 250, 100)]
    assert "".join(groups) == body
    path = tmp_path / "enwiki-pages-articles-multistream.xml.bz2"
    path.write_bytes(b"".join(bz2.compress(part.encode()) for part in [head, *groups, "</mediawiki>" + tail]))
    plain = tmp_path / "dump.xml"
    plain.write_text(whole, encoding="utf-8")
    docs = list(read_documents(path))
    assert len(docs) == 250 and docs == list(read_documents(plain))


def _export_page(title, page_id, revisions, ns=0):
    """A page in MediaWiki's own export layout (its test dumps): several revisions, a deleted text, a slot."""
    return f"<page><title>{title}</title><ns>{ns}</ns><id>{page_id}</id>{''.join(revisions)}</page>\n"


def _revision(rev_id, text, model="wikitext", extra="", deleted=False):
    body = (f'<text bytes="{len(text)}" sha1="x" deleted="deleted"/>' if deleted else
            f'<text bytes="{len(text)}" sha1="x" xml:space="preserve">{text}</text>')
    return (f"<revision><id>{rev_id}</id><timestamp>2024-01-01T00:00:00Z</timestamp><contributor><username>U"
            f"</username><id>1</id></contributor><origin>{rev_id}</origin><model>{model}</model>"
            f"<format>text/x-wiki</format>{body}{extra}<sha1>x</sha1></revision>")


def test_history_exports_take_the_last_revision_and_the_main_slot(tmp_path):
    slot = ('<content><role>mediainfo</role><origin>9</origin><model>wikibase-mediainfo</model>'
            '<format>application/json</format><text bytes="2" xml:space="preserve">{}</text></content>')
    pages = [_export_page("Ada Quint", 1, [_revision(10, "Old text."), _revision(11, "", deleted=True),
                                           _revision(12, "'''Ada Quint''' painted.", extra=slot)]),
             _export_page("Module:X", 2, [_revision(20, "return {}", model="Scribunto")]),
             _export_page("Q42", 3, [_revision(30, '{"type":"item"}', model="wikibase-item")])]
    path = tmp_path / "dump.xml"
    path.write_text(mediawiki_dump(pages), encoding="utf-8")
    assert [(d.doc_id, d.text) for d in read_documents(path)] == [("1", "Ada Quint painted.")]


def test_a_stub_dump_is_refused_with_what_to_use_instead(tmp_path):
    page = ("<page><title>Ada Quint</title><ns>0</ns><id>1</id><revision><id>10</id><model>wikitext</model>"
            '<format>text/x-wiki</format><text bytes="94" sha1="x" id="55"/><sha1>x</sha1></revision></page>\n')
    path = tmp_path / "stub-articles.xml"
    path.write_text(mediawiki_dump([page]), encoding="utf-8")
    with pytest.raises(InputFileError, match=r"page 1 \('Ada Quint'\): <text> is empty but has 94 bytes: a stub dump"):
        list(read_documents(path))


def test_document_batches_end_at_a_count_or_at_a_text_size():
    docs = [Document(str(i), "t", "x" * size) for i, size in enumerate([5, 5, 20, 1, 1, 1, 1])]
    batches = [[d.doc_id for d in b] for b in batched_documents(iter(docs), max_docs=3, max_chars=10)]
    # [5, 5] reaches 10 characters; [20] alone is over; the ones end at three documents; the rest is kept
    assert batches == [["0", "1"], ["2"], ["3", "4", "5"], ["6"]]


def test_cleaning_workers_leave_ctrl_c_to_the_parent():
    """Issue 53: Ctrl-C during a parallel ingest reached every worker, which printed `Process SpawnPoolWorker-2:`
    and its own traceback over the command's one line."""
    import signal

    from corpus.documents import cleaning_pool
    with cleaning_pool(1) as pool:
        assert pool.apply(signal.getsignal, (signal.SIGINT,)) == signal.SIG_IGN
