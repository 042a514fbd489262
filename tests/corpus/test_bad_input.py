"""Malformed input is named and rejected, with the file and the right line, record, page or byte; compressed
inputs are read, not guessed at. Every case is one InputFileError (never a TypeError or a half-read row)."""

import bz2
import gzip
import json

import pytest

from corpus.documents import read_documents
from corpus.errors import InputFileError
from corpus.generation_data import read_examples
from corpus.qa import read_questions
from tests.conftest import mediawiki_dump, mediawiki_page


def jsonl(path, *records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


GOOD_DOC = {"id": "a", "title": "A", "text": "Ada."}


@pytest.mark.parametrize("bad, problem", [
    ({"id": "b", "title": None, "text": "x"}, "field 'title' must be a string, found null"),
    ({"id": "b", "title": "B", "text": ["a"]}, "field 'text' must be a string, found a list"),
    ({"id": {"x": 1}, "title": "B", "text": "x"}, "field 'id' must be a string or an integer, found an object"),
    ({"id": True, "title": "B", "text": "x"}, "field 'id' must be a string or an integer, found true"),
    ({"id": "", "title": "B", "text": "x"}, "field 'id' is empty"),
])
def test_jsonl_documents_with_wrong_field_types_are_rejected(tmp_path, bad, problem):
    path = jsonl(tmp_path / "docs.jsonl", GOOD_DOC, bad)
    with pytest.raises(InputFileError, match=f"docs.jsonl, line 2: {problem}"):
        list(read_documents(path))


@pytest.mark.parametrize("page, problem", [
    ("<page><ns>0</ns><id>2</id><revision><text>Hi.</text></revision></page>", "page 2: no <title>"),
    ("<page><title>B</title><ns>0</ns><revision><text>Hi.</text></revision></page>", "page 2 ('B'): no <id>"),
    ("<page><title>B</title><ns>0</ns><id> </id><revision><text>Hi.</text></revision></page>", "page 2 ('B'): no <id>"),
    ("<page><title>B</title><ns>0</ns><id>2</id><revision><id>9</id></revision></page>", "page 2 ('B'): no <text>"),
])
def test_mediawiki_pages_without_title_id_or_text_are_rejected(tmp_path, page, problem):
    path = tmp_path / "dump.xml"
    path.write_text(mediawiki_dump([mediawiki_page("A", "Ada.", 1), page + "\n"]), encoding="utf-8")
    with pytest.raises(InputFileError, match=f"dump.xml, {problem}".replace("(", r"\(").replace(")", r"\)")):
        list(read_documents(path))


@pytest.mark.parametrize("answer, problem", [
    ([True, 3.5], "answers must be strings, found true"),
    ([], "the answer list is empty"),
    (["Paris", ""], "an answer is empty"),
    (None, "answers must be a list of strings, found null"),
])
def test_nq_answers_that_are_not_strings_or_missing_are_rejected(tmp_path, answer, problem):
    path = jsonl(tmp_path / "nq.jsonl", {"question": "q?", "answer": ["a"]}, {"question": "r?", "answer": answer})
    with pytest.raises(InputFileError, match=f"nq.jsonl, line 2: {problem}"):
        list(read_questions(path, "nq_open"))


@pytest.mark.parametrize("data, where", [
    ([1, 2, 3], "question 1: expected a JSON object"),
    ({"exams": [5]}, "exam 1: expected an object"),
    ({"exams": {"E1": {"questions": [{"qid": 1, "qtext": "q?", "ra": 1, "answers": 5}]}}},
     "exam 'E1', question 1: 'answers' must be a list of"),
    ({"exams": {"E1": {"questions": [{"qid": 1, "qtext": "q?", "ra": 1, "answers": [3]}]}}},
     "exam 'E1', question 1: 'answers' must be a list of"),
    ({"exams": {"E1": 7}}, "exam 'E1': expected an object with a 'questions' or 'data' list"),
    ("text", "expected"),
])
def test_malformed_headqa_is_one_error_not_a_type_error(tmp_path, data, where):
    path = tmp_path / "headqa.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputFileError, match=f"headqa.json(, |: ){where}"):
        list(read_questions(path, "headqa"))


def test_bad_utf8_deep_in_a_tsv_names_its_true_byte_offset(tmp_path):
    head = "id\ttext\ttitle\n" + "".join(f"{i}\tPassage number {i} of many.\tT{i}\n" for i in range(20000))
    path = tmp_path / "psgs.tsv"
    path.write_bytes(head.encode() + b"20000\tbad \xff byte\tT\n")
    offset = len(head.encode()) + len(b"20000\tbad ")
    assert offset > 200_000
    with pytest.raises(InputFileError, match=f"psgs.tsv, byte {offset}: not UTF-8"):
        list(read_documents(path))


def test_a_bom_before_the_tsv_header_is_not_part_of_the_first_column(tmp_path):
    path = tmp_path / "psgs.tsv"
    path.write_bytes("\ufeffid\ttext\ttitle\n1\tAda.\tA\n".encode())
    assert [(d.doc_id, d.text) for d in read_documents(path)] == [("1", "Ada.")]


@pytest.mark.parametrize("suffix, opener", [(".gz", gzip.open), (".bz2", bz2.open)])
def test_compressed_inputs_read_like_the_plain_file(tmp_path, suffix, opener):
    cases = [("dump.xml", mediawiki_dump([mediawiki_page("A", "Ada was here.", 1)]), lambda p: read_documents(p)),
             ("docs.jsonl", json.dumps(GOOD_DOC) + "\n", lambda p: read_documents(p)),
             ("psgs.tsv", "id\ttext\ttitle\n1\tAda.\tA\n", lambda p: read_documents(p)),
             ("nq.jsonl", '{"question": "q?", "answer": ["a"]}\n', lambda p: read_questions(p, "nq_open")),
             ("wq.json", json.dumps([{"utterance": "q?", "targetValue": "(list (description A))"}]),
              lambda p: read_questions(p, "webquestions")),
             ("s.jsonl", '{"document": "D.", "summary": "S."}\n', lambda p: read_examples(p, "summarization"))]
    for name, text, read in cases:
        plain = tmp_path / name
        plain.write_text(text, encoding="utf-8")
        packed = tmp_path / (name + suffix)
        with opener(packed, "wt", encoding="utf-8") as fh:
            fh.write(text)
        assert list(read(packed)) == list(read(plain)) != [], name


def test_a_truncated_gzip_file_is_named_not_a_traceback(tmp_path):
    path = tmp_path / "docs.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("".join(json.dumps(GOOD_DOC | {"id": str(i)}) + "\n" for i in range(2000)))
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(InputFileError, match="docs.jsonl.gz.*(ends early|cannot decompress)"):
        list(read_documents(path))


def test_json_errors_read_as_one_sentence(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": "a", "title": "unterminated\n')
    with pytest.raises(InputFileError) as error:
        list(read_documents(path))
    assert "line 1: not valid JSON" in str(error.value) and "at at" not in str(error.value)


def test_partition_names_have_a_length_limit(tmp_path):
    from warehouse import Warehouse, WarehouseError
    with pytest.raises(WarehouseError, match="at most 200 characters"):
        Warehouse(tmp_path / "wh").partition_path("documents", "x" * 300)
