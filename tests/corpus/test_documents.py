import json
import random

import pytest

from corpus.documents import infer_format, read_documents
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


@pytest.mark.parametrize("name,fmt", [("a.xml.bz2", "mediawiki"), ("enwiki.XML", "mediawiki"),
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
    with pytest.raises(InputFileError, match=r"line 1: missing field\(s\) title"):
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
