"""Readers for summarisation (XSum-style) and translation (WMT-style) data, and the sample world's tasks."""

import json

import pytest

from corpus.errors import InputFileError
from corpus.generation_data import model_input, read_examples, read_summaries, read_translations, translation_languages
from corpus.sample_world import GENERATION_TASKS, generate


def test_summaries_jsonl(tmp_path):
    path = tmp_path / "xsum.jsonl"
    path.write_text('{"id": "a7", "document": " Long text. ", "summary": "Short."}\n\n{"document": "B", "summary": "b"}\n')
    examples = list(read_summaries(path))
    assert [(e.local_id, e.source, e.target) for e in examples] == [("a7", "Long text.", "Short."), ("3", "B", "b")]


def test_summary_errors_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"document": "A", "summary": "a"}\n{"document": "B"}\n')
    with pytest.raises(InputFileError, match=r"bad.jsonl, line 2: field 'summary'"):
        list(read_summaries(path))


@pytest.mark.parametrize("layout", ["jsonl", "list", "data"])
def test_translations_in_each_layout(tmp_path, layout):
    records = [{"translation": {"de": "Hallo Welt", "en": "Hello world"}}, {"translation": {"de": "Ja", "en": "Yes"}}]
    path = tmp_path / "wmt.json"
    text = {"jsonl": "".join(json.dumps(r) + "\n" for r in records), "list": json.dumps(records, indent=1),
            "data": json.dumps({"data": records})}[layout]
    path.write_text(text)
    assert translation_languages(path) == ("de", "en")
    assert [(e.source, e.target) for e in read_translations(path)] == [("Hallo Welt", "Hello world"), ("Ja", "Yes")]
    assert [(e.source, e.target) for e in read_translations(path, "en", "de")][1] == ("Yes", "Ja")


def test_translation_errors(tmp_path):
    path = tmp_path / "wmt.jsonl"
    path.write_text('{"translation": {"de": "a", "en": "b"}}\n{"translation": {"de": "c"}}\n')
    with pytest.raises(InputFileError, match=r"wmt.jsonl, line 2: 'translation' lacks language 'en'"):
        list(read_translations(path))
    three = tmp_path / "three.jsonl"
    three.write_text('{"translation": {"de": "a", "en": "b", "fr": "c"}}\n')
    with pytest.raises(InputFileError, match="name the source and target"):
        translation_languages(three)
    with pytest.raises(InputFileError, match="unknown generation kind"):
        read_examples(path, "dialogue")


def test_task_prefixes():
    assert model_input("summarization", "Text.") == "summarize: Text."
    assert model_input("translation", "Hallo", "de", "en") == "translate de to en: Hallo"


def test_sample_world_tasks_are_disjoint_and_readable(tmp_path):
    files = generate(tmp_path, people=10, background_people=60)
    for task, (kind, src, tgt) in GENERATION_TASKS.items():
        splits = {split: list(read_examples(path, kind, src, tgt)) for split, path in files.generation[task].items()}
        assert len(splits["train"]) > len(splits["validation"]) > 0
    people = {split: {e.target.split(",")[0] for e in read_summaries(path)}
              for split, path in files.generation["summaries"].items()}
    assert not people["train"] & people["validation"]  # both tasks draw the splits from the same disjoint people
    summary = next(read_summaries(files.generation["summaries"]["validation"]))
    assert summary.target.split(",")[0] in summary.source  # the summary is about the document's person
    pair = next(read_translations(files.generation["translation"]["train"], "en", "xx"))
    assert pair.source.split()[:2] == pair.target.split()[:2] and pair.source != pair.target  # names kept
