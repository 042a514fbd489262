"""Stages on the sample world: outputs, reruns, and bad input leaving the warehouse untouched."""

import dataclasses
import json
import shutil

import pytest

from corpus.errors import InputFileError
from corpus.sample_world import WorldFiles
from stages import data
from stages.configs import IngestConfig, QuestionsConfig, SampleWorldConfig
from stages.inputs import world_dir
from stages.registry import STAGES
from stages.runner import summarize
from warehouse import Warehouse, list_runs, query, row_counts
from warehouse.sql import sandbox

SMALL = SampleWorldConfig(people=12, background_people=6)


@pytest.fixture
def wh(tmp_path):
    return Warehouse(tmp_path / "wh")


@pytest.fixture(scope="module")
def loaded_once(tmp_path_factory):
    home = tmp_path_factory.mktemp("loaded") / "wh"
    data.load_sample_world(Warehouse(home), SMALL)
    return home


@pytest.fixture
def loaded(tmp_path, loaded_once):
    """A warehouse holding a small sample world's documents and questions (a copy: tests may change it)."""
    shutil.copytree(loaded_once, tmp_path / "wh")
    return Warehouse(tmp_path / "wh")


def snapshot(wh):
    files = {str(p.relative_to(wh.home)): p.read_bytes() for p in wh.tables_dir.rglob("*") if p.is_file()}
    with sandbox(wh) as con:  # one connection for all tables (a query each would open one each)
        rows = {t: con.sql(f'SELECT * EXCLUDE (run_id) FROM "{t}"' if kind == "parquet" else f'SELECT * FROM "{t}"')
                .to_arrow_table().to_pylist() for t, kind, _ in row_counts(wh) if t != "runs"}
    return files, rows


def test_sample_world_stage_reruns_only_when_needed(wh):
    first = data.generate_sample_world(wh, SMALL)
    assert not first.skipped and (world_dir(wh) / "knowledge.xml.bz2").exists()
    assert data.generate_sample_world(wh, SMALL).skipped
    shutil.rmtree(world_dir(wh))
    assert not data.generate_sample_world(wh, SMALL).skipped, "deleted files must be regenerated"
    assert not data.generate_sample_world(wh, SMALL.model_copy(update={"seed": 99})).skipped


@pytest.mark.slow
def test_pipeline_inputs_fill_documents_and_questions(loaded):
    counts = dict((r["corpus"], r["n"]) for r in query(loaded, "SELECT corpus, count(*) AS n FROM documents GROUP BY 1").to_pylist())
    assert set(counts) == {"sampleworld", "general"} and min(counts.values()) > 10
    facts = [json.loads(l) for l in open(WorldFiles.at(world_dir(loaded)).facts)]
    got = query(loaded, "SELECT question_id, answers[1] AS answer FROM questions").to_pylist()
    assert sorted((r["question_id"], r["answer"]) for r in got) == sorted((f["question_id"], f["object"]) for f in facts)
    titles = set(query(loaded, "SELECT title FROM documents WHERE corpus = 'sampleworld'").column("title").to_pylist())
    assert not any(t.startswith(("Category:", "Template:")) or t.endswith(" City") for t in titles)


def test_ingest_skip_force_and_changed_input(tmp_path, wh):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": 1, "title": "A", "text": "x"}\n')
    config = IngestConfig(path=str(path))
    first = data.ingest(wh, config)
    assert first.run.outputs == {"documents": 1} and first.value["corpus"] == "c"
    assert data.ingest(wh, config).skipped
    assert not data.ingest(wh, config, force=True).skipped
    path.write_text('{"id": 1, "title": "A", "text": "x"}\n{"id": 2, "title": "B", "text": "y"}\n')
    changed = data.ingest(wh, config)
    assert not changed.skipped and changed.run.outputs == {"documents": 2}
    assert query(wh, "SELECT count(*) AS n FROM documents").to_pylist() == [{"n": 2}]


def test_ingest_limit(loaded):
    dump = WorldFiles.at(world_dir(loaded)).knowledge_dump
    data.ingest(loaded, IngestConfig(path=str(dump), corpus="firstfive", limit=5))
    assert query(loaded, "SELECT count(*) AS n FROM documents WHERE corpus = 'firstfive'").to_pylist() == [{"n": 5}]


def test_questions_stage_reports_filtered_answers(tmp_path, wh):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "a?", "answer": ["one"]}\n{"question": "b?", "answer": ["a b c d e f"]}\n')
    result = data.load_questions(wh, QuestionsConfig(path=str(path), format="nq_open", dataset="d", split="train"))
    assert result.value["questions"] == 1 and result.value["filtered"] == 1
    metrics = query(wh, "SELECT metric, value FROM metrics WHERE split = 'train' ORDER BY metric").to_pylist()
    assert metrics == [{"metric": "filtered_long_answers", "value": 1.0}, {"metric": "questions", "value": 1.0}]


def test_dropped_questions_are_named_in_the_runs_outputs_and_a_tiny_validation_split_is_warned_of(tmp_path, wh,
                                                                                                     capsys):
    path = tmp_path / "q.jsonl"
    lines = [f'{{"question": "q{i}?", "answer": ["a{i}"]}}' for i in range(5)] + [
        '{"question": "long?", "answer": ["a b c d e f"]}']
    path.write_text("\n".join(lines) + "\n")
    result = data.load_questions(wh, QuestionsConfig(path=str(path), format="nq_open", dataset="d",
                                                     split="validation"))
    assert result.run.outputs == {"questions": 5, "questions_dropped": "1 dropped: answers over 5 tokens"}
    assert summarize("questions", result, 1.0)["written"] == "5 questions (1 dropped: answers over 5 tokens)"
    err = capsys.readouterr().err
    assert "5 validation questions give an EM a 95 % interval of about ±44 points" in err
    assert "a lead of 10 points cannot be told from noise (about 97 questions can)" in err
    assert data.em_margin(97) <= data.SMALL_SPLIT_MARGIN < data.em_margin(96)


def test_a_validation_split_of_a_hundred_questions_is_not_warned_of(tmp_path, wh, capsys):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(f'{{"question": "q{i}?", "answer": ["a{i}"]}}\n' for i in range(100)))
    data.load_questions(wh, QuestionsConfig(path=str(path), format="nq_open", dataset="d", split="validation"))
    assert "interval" not in capsys.readouterr().err


def _truncated_bz2(tmp_path, world):
    data = world.knowledge_dump.read_bytes()
    path = tmp_path / "cut.xml.bz2"
    path.write_bytes(data[: len(data) // 2])
    return IngestConfig(path=str(path), corpus="sampleworld"), "byte "


def _invalid_xml(tmp_path, world):
    path = tmp_path / "bad.xml"
    path.write_text('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/">\n<page><title>A</title>\n</mediawiki>')
    return IngestConfig(path=str(path), corpus="sampleworld"), "line 3, column"


def _jsonl_not_json(tmp_path, world):
    path = tmp_path / "general.jsonl"
    lines = world.general_text.read_text().splitlines()
    path.write_text("\n".join(lines[:3] + ["{not json"] + lines[3:]) + "\n")
    return IngestConfig(path=str(path), corpus="general"), "line 4"


def _webq_no_target(tmp_path, world):
    records = json.loads(world.questions["webquestions"]["train"].read_text())
    del records[2]["targetValue"]
    path = tmp_path / "wq.json"
    path.write_text(json.dumps(records))
    return QuestionsConfig(path=str(path), format="webquestions", dataset="webquestions", split="train"), "record 3"


def _empty(tmp_path, world):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    return QuestionsConfig(path=str(path), format="nq_open", dataset="nq", split="train"), "file is empty"


def _missing(tmp_path, world):
    return IngestConfig(path=str(tmp_path / "missing.xml.bz2"), corpus="sampleworld"), "no such file"


def _duplicate_ids(tmp_path, world):
    path = tmp_path / "dup.jsonl"
    path.write_text('{"id": 1, "title": "A", "text": "x"}\n{"id": 1, "title": "B", "text": "y"}\n')
    return IngestConfig(path=str(path), corpus="general"), "line 1 and line 2: doc id '1' occurs more than once"


@pytest.mark.parametrize("make_bad", [_truncated_bz2, _invalid_xml, _jsonl_not_json, _webq_no_target, _empty,
                                      _missing, _duplicate_ids])
@pytest.mark.slow
def test_bad_input_gives_one_clear_error_and_changes_nothing(tmp_path, loaded, make_bad):
    config, where = make_bad(tmp_path, WorldFiles.at(world_dir(loaded)))
    before = snapshot(loaded)
    runs_before = len(list_runs(loaded))
    run = data.ingest if isinstance(config, IngestConfig) else data.load_questions
    with pytest.raises(InputFileError) as err:
        run(loaded, config)
    assert config.path in str(err.value) and where in str(err.value)
    assert snapshot(loaded) == before
    runs = list_runs(loaded)
    assert len(runs) - runs_before in (0, 1)  # at most a failed-run record, naming the error
    if len(runs) > runs_before:
        assert runs[0].status == "failed" and where in runs[0].error


def test_generation_data_stage_refuses_repeated_ids(tmp_path):
    from stages.configs import GenerationDataConfig
    from stages.data import load_generation_data
    path = tmp_path / "x.jsonl"
    path.write_text('{"id": "a", "document": "D", "summary": "s"}\n{"id": "a", "document": "E", "summary": "t"}\n')
    wh = Warehouse(tmp_path / "wh")
    config = GenerationDataConfig(path=str(path), kind="summarization", task="x", split="train")
    with pytest.raises(InputFileError, match="x.jsonl, line 1 and line 2: example id 'a' occurs more than once"):
        load_generation_data(wh, config)
    path.write_text('{"id": "a", "document": "D", "summary": "s"}\n')
    assert load_generation_data(wh, config).value["examples"] == 1
    assert query(wh, "SELECT example_id, source, target FROM gen_examples").to_pylist() == [
        {"example_id": "x/train/a", "source": "D", "target": "s"}]


def test_ner_workers_only_for_many_texts_long_enough_to_ship(monkeypatch):
    monkeypatch.setattr(data.os, "cpu_count", lambda: 4)
    sentence, paragraph = "Ada Smith was born in Paris in 1901 .", " ".join(["word"] * 120)
    assert data.ner_processes([paragraph] * 2001) == 4
    assert data.ner_processes([paragraph] * 2000) == 1  # too few to pay the workers' start-up
    assert data.ner_processes([sentence] * 50_000) == 1  # too short: shipping each costs more than its NER
    assert data.ner_processes([sentence, paragraph] * 1500) == 4  # 64 words on average


def _docs_file(path, n: int, tag: str):
    path.write_text("".join(f'{{"id": "{tag}{i}", "title": "T{i}", "text": "{tag} text {i}"}}\n' for i in range(n)))
    return IngestConfig(path=str(path), corpus="x")


def _corpus_x(wh):
    return sorted(query(wh, "SELECT doc_id FROM documents WHERE corpus = 'x'").column("doc_id").to_pylist())


@pytest.mark.slow
def test_a_rerun_is_not_skipped_when_its_partition_holds_another_runs_rows(tmp_path, wh):
    three, thousand = _docs_file(tmp_path / "good3.jsonl", 3, "g"), _docs_file(tmp_path / "docs.jsonl", 1000, "d")
    assert not data.ingest(wh, three).skipped and len(_corpus_x(wh)) == 3
    assert not data.ingest(wh, thousand).skipped and len(_corpus_x(wh)) == 1000
    again = data.ingest(wh, three)
    assert not again.skipped and _corpus_x(wh) == ["g0", "g1", "g2"]
    assert data.ingest(wh, three).skipped  # now it is what the table holds


def test_a_questions_rerun_after_another_file_replaced_the_split_rewrites_it(tmp_path, wh):
    def questions(name, n):
        path = tmp_path / name
        path.write_text("".join(f'{{"question": "q{i}?", "answer": ["a{i}"]}}\n' for i in range(n)))
        return QuestionsConfig(path=str(path), format="nq_open", dataset="nq", split="train")
    small, big = questions("small.jsonl", 2), questions("big.jsonl", 50)
    data.load_questions(wh, small)
    data.load_questions(wh, big)
    assert not data.load_questions(wh, small).skipped
    assert query(wh, "SELECT count(*) AS n FROM questions").to_pylist() == [{"n": 2}]


def test_a_stage_whose_rules_were_raised_reruns_on_the_same_inputs(tmp_path, wh, monkeypatch):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "a?", "answer": ["one"]}\n')
    config = QuestionsConfig(path=str(path), format="nq_open", dataset="d", split="train")
    first = data.load_questions(wh, config)
    assert data.load_questions(wh, config).skipped
    # an upgrade that changes what the stage writes from these inputs raises its rules version
    monkeypatch.setitem(STAGES, "questions", dataclasses.replace(STAGES["questions"], rules=1))
    again = data.load_questions(wh, config)
    assert not again.skipped and again.run.inputs_fingerprint != first.run.inputs_fingerprint
    assert data.load_questions(wh, config).skipped
    assert query(wh, "SELECT count(*) AS n FROM questions").to_pylist() == [{"n": 1}]  # rewritten, not added


@pytest.mark.slow
def test_interleaved_ingests_leave_exactly_the_last_committed_writers_rows(tmp_path, wh):
    """Property-style: random ingests, reruns and forced reruns of three files into one partition; after every
    step the partition holds exactly the rows of the file last committed (skipped or not)."""
    import random
    files = [_docs_file(tmp_path / f"f{k}.jsonl", n, f"f{k}-") for k, n in enumerate((3, 7, 5))]
    expected = {k: sorted(f"f{k}-{i}" for i in range(n)) for k, n in enumerate((3, 7, 5))}
    rng = random.Random(4)
    last = None
    for step in range(25):
        k = rng.randrange(3)
        result = data.ingest(wh, files[k], force=rng.random() < 0.2)
        if result.skipped:
            assert last == k, f"step {step}: skipped although the partition holds file {last}'s rows"
        last = k
        assert _corpus_x(wh) == expected[k], f"step {step}"


def test_a_question_file_asking_a_question_more_than_once_is_kept_as_it_is_with_a_warning(tmp_path, wh, capsys):
    """Issue 100: a question three times in a validation file was counted three times without a word. The copies
    are kept (each is a question of the file, and may be meant), and the warning names them."""
    path = tmp_path / "dev.jsonl"
    path.write_text('{"question": "who?", "answer": ["1"]}\n{"question": "what?", "answer": ["2"]}\n' * 3
                    + '{"question": "when?", "answer": ["3"]}\n')
    config = QuestionsConfig(path=str(path), format="nq_open", dataset="d", split="validation")
    assert data.load_questions(wh, config).value["questions"] == 7
    warning = capsys.readouterr().err.splitlines()[0]  # then the note that 7 validation questions are few
    assert warning == (f"warning: {path}: 2 questions occur more than once, each copy kept and counted (e.g. 'who?' "
                       "on line 1, line 3, line 5); remove the copies if they are not meant")


def test_repeated_question_ids_are_named_with_both_places(tmp_path, wh):
    path = tmp_path / "q.jsonl"
    path.write_text('{"id": "a", "question": "x?", "answers": ["1"]}\n{"id": "b", "question": "y?", "answers": ["2"]}\n'
                    '{"id": "a", "question": "z?", "answers": ["3"]}\n')
    with pytest.raises(InputFileError, match="q.jsonl, line 1 and line 3: question id 'a' occurs more than once"):
        data.load_questions(wh, QuestionsConfig(path=str(path), format="jsonl", dataset="d", split="train"))


def test_repeated_page_ids_of_a_dump_are_named_by_page(tmp_path, wh):
    from tests.conftest import mediawiki_dump, mediawiki_page
    path = tmp_path / "dump.xml"
    path.write_text(mediawiki_dump([mediawiki_page("A", "Ada.", 1), mediawiki_page("B", "Bo.", 2),
                                    mediawiki_page("C", "Cy.", 1)]))
    with pytest.raises(InputFileError, match="dump.xml, page 1 and page 3: doc id '1' occurs more than once"):
        data.ingest(wh, IngestConfig(path=str(path)))


# ---- a split dump: the files a pattern matches read into one corpus ----------------------------------------------

def split_dump(folder, parts: int = 3, pages: int = 4):
    """A dump split the way Wikipedia splits its own (`pages-articles1.xml-p1p4.bz2`, ...): consecutive pages in
    numbered parts, each a whole MediaWiki export."""
    import bz2

    from tests.conftest import mediawiki_dump, mediawiki_page
    folder.mkdir(parents=True, exist_ok=True)
    for part in range(parts):
        first = part * pages + 1
        body = mediawiki_dump([mediawiki_page(f"Page {i}", f"Page {i} is about [[topic {i}]].", i)
                               for i in range(first, first + pages)])
        (folder / f"wiki-pages-articles{part + 1}.xml-p{first}p{first + pages - 1}.bz2").write_bytes(
            bz2.compress(body.encode()))
    return folder


def test_a_pattern_reads_every_part_of_a_split_dump_into_one_corpus_in_order(tmp_path, wh):
    folder = split_dump(tmp_path / "dump", parts=11, pages=2)  # parts 1..11: natural order puts 10 and 11 last
    config = IngestConfig(path=str(folder / "wiki-pages-articles*.xml-p*.bz2"), corpus="wiki")
    result = data.ingest(wh, config)
    assert result.value["files"] == 11 and result.run.outputs == {"documents": 22}
    assert result.run.config["files"][-1].endswith("wiki-pages-articles11.xml-p21p22.bz2")
    rows = query(wh, "SELECT doc_id, text FROM documents WHERE corpus = 'wiki'").to_pylist()
    assert [r["doc_id"] for r in rows] == [str(i) for i in range(1, 23)]  # file order, then page order
    assert rows[0]["text"] == "Page 1 is about topic 1."
    assert data.ingest(wh, config).skipped
    (folder / "wiki-pages-articles3.xml-p5p6.bz2").unlink()  # a part less: other input
    assert data.ingest(wh, config).run.outputs == {"documents": 20}


def test_a_pattern_needs_a_corpus_name_and_a_match_and_one_format(tmp_path, wh):
    folder = split_dump(tmp_path / "dump", parts=2)
    with pytest.raises(ValueError, match="is a pattern: name the corpus"):
        IngestConfig(path=str(folder / "*.bz2"))
    with pytest.raises(InputFileError, match=r"nothing\*.bz2: no file matches this pattern"):
        data.ingest(wh, IngestConfig(path=str(folder / "nothing*.bz2"), corpus="wiki"))
    (folder / "wiki-pages-articles3.jsonl").write_text('{"id": "9", "title": "T", "text": "x"}\n')
    with pytest.raises(InputFileError, match="articles3.jsonl: reads as jsonl where .*articles1.* reads as mediawiki"):
        data.ingest(wh, IngestConfig(path=str(folder / "wiki-pages-articles*"), corpus="wiki"))
    assert query(wh, "SELECT count(*) AS n FROM documents").to_pylist() == [{"n": 0}]


def test_a_page_id_in_two_parts_is_named_by_file_and_page(tmp_path, wh):
    folder = split_dump(tmp_path / "dump", parts=2, pages=2)
    import bz2

    from tests.conftest import mediawiki_dump, mediawiki_page
    (folder / "wiki-pages-articles2.xml-p3p4.bz2").write_bytes(bz2.compress(mediawiki_dump(
        [mediawiki_page("Other", "Other text.", 3), mediawiki_page("Again", "Again text.", 2)]).encode()))
    with pytest.raises(InputFileError, match=r"articles1.xml-p1p2.bz2, page 2 and .*articles2.xml-p3p4.bz2, page 2: "
                                             r"doc id '2' occurs more than once in corpus 'wiki'"):
        data.ingest(wh, IngestConfig(path=str(folder / "*.bz2"), corpus="wiki"))


def test_cleaning_in_parts_as_dask_workers_do_gives_the_same_documents(tmp_path):
    """`map_shards` as the flow's Dask mapper calls it (here in this process): each file cleaned into a part, the
    parts copied into the partition in file order."""
    folder = split_dump(tmp_path / "dump", parts=3)
    config = IngestConfig(path=str(folder / "*.bz2"), corpus="wiki")
    whole, parted = Warehouse(tmp_path / "a"), Warehouse(tmp_path / "b")
    data.ingest(whole, config)
    calls = []
    result = data.ingest(parted, config, map_shards=lambda work, jobs: calls.append(len(jobs)) or list(map(work, jobs)))
    assert calls == [3] and result.run.outputs == {"documents": 12}
    table = "SELECT * EXCLUDE (run_id) FROM documents"
    assert query(parted, table).to_pylist() == query(whole, table).to_pylist()
    assert not list(parted.tables_dir.rglob("*.part.parquet"))  # the parts went with the staging folder


@pytest.mark.slow
def test_knowledge_from_a_dump_and_a_jsonl_of_passages_is_joined_indexed_and_retrieved_over_together(tmp_path, wh):
    """Two sources of different formats, ingested each as its own corpus, joined into the one retrieval searches:
    ids prefixed with their source (both sources number their documents from 1), every document there once."""
    from stages.configs import IndexConfig, JoinCorporaConfig, RetrieveConfig
    from stages.inputs import retrieved_documents
    folder = split_dump(tmp_path / "dump", parts=1, pages=3)
    data.ingest(wh, IngestConfig(path=str(next(folder.iterdir())), corpus="wiki"))
    passages = tmp_path / "passages.jsonl"
    passages.write_text("".join(json.dumps({"id": str(i), "title": f"Passage {i}", "text": text}) + "\n"
                                for i, text in enumerate(["Zorblat is the capital of Quenland.",
                                                          "The river Vell runs through Zorblat."], start=1)))
    data.ingest(wh, IngestConfig(path=str(passages), corpus="passages"))
    config = JoinCorporaConfig(corpora=["wiki", "passages"], corpus="knowledge")
    result = data.join_corpora(wh, config)
    assert result.value == {"corpus": "knowledge", "documents": 5, "from": {"wiki": 3, "passages": 2}}
    rows = query(wh, "SELECT doc_id, title FROM documents WHERE corpus = 'knowledge'").to_pylist()
    assert [r["doc_id"] for r in rows] == ["wiki/1", "wiki/2", "wiki/3", "passages/1", "passages/2"]
    assert data.join_corpora(wh, config).skipped
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question": "which page is about the capital of quenland",
                                     "answer": ["Zorblat"]}) + "\n")
    data.load_questions(wh, QuestionsConfig(path=str(questions), format="nq_open", dataset="nq", split="validation"))
    data.build_index(wh, IndexConfig(corpus="knowledge"))
    data.retrieve(wh, RetrieveConfig(corpus="knowledge", k=3))
    (found,) = retrieved_documents(wh, [query(wh, "SELECT question_id FROM questions").column(0)[0].as_py()], 3)
    assert found[0] == "Zorblat is the capital of Quenland." and any(d.startswith("Page") for d in found)
    passages.write_text(passages.read_text() + json.dumps({"id": "3", "title": "P3", "text": "More."}) + "\n")
    data.ingest(wh, IngestConfig(path=str(passages), corpus="passages"))
    assert data.join_corpora(wh, config).value["documents"] == 6  # a source changed: joined again
    with pytest.raises(ValueError, match="no corpus 'books' to join; ingested: knowledge, passages, wiki"):
        data.join_corpora(wh, JoinCorporaConfig(corpora=["wiki", "books"], corpus="all"))
