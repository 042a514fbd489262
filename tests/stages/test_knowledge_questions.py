"""The knowledge-questions stage on the sample world: questions written from the retrieved segments' salient spans,
each answer its span word for word, never a validation question; and the injection's QA steps that ask them."""

import pytest

from flows.cli_pipeline import suggested_queries
from stages import data
from stages.configs import KnowledgeQuestionsConfig, SalientSpansConfig
from tests.stages.test_augment import spanned_world
from warehouse import list_runs, query

pytestmark = pytest.mark.slow  # a real Lucene index and spaCy first


def test_each_question_asks_a_span_of_its_segment_and_none_is_a_questions_file_wording(tmp_path):
    wh = spanned_world(tmp_path / "wh")
    result = data.write_knowledge_questions(wh, KnowledgeQuestionsConfig())
    rows = query(wh, "SELECT k.*, s.text AS segment FROM knowledge_questions k JOIN segments s USING (segment_id) "
                     "ORDER BY question_id").to_pylist()
    assert result.value["questions"] == len(rows) > 100
    for row in rows:
        assert row["answer"] in row["segment"]  # the span, word for word, from the segment it names
        assert row["answer"].lower() not in row["question"]  # asked for, not copied
        assert row["question"] == row["question"].lower() and row["question_id"].startswith(row["segment_id"] + "~q")
    assert len({r["question_id"] for r in rows}) == len(rows)
    suggested = suggested_queries({"knowledge_questions"})  # what a run's end offers to query
    assert suggested and query(wh, suggested[0]).num_rows == 5
    # no question of the question files (either split) is what is written: the knowledge is asked, in its words
    asked = {q["q"].lower().rstrip("?") for q in query(wh, "SELECT question AS q FROM questions").to_pylist()}
    assert len(asked) > 50 and not asked & {r["question"] for r in rows}
    assert data.write_knowledge_questions(wh, KnowledgeQuestionsConfig()).skipped
    # new spans, new questions: the stage reads the spans it asks about
    data.find_salient_spans(wh, SalientSpansConfig(max_words=20), force=True)
    assert not data.write_knowledge_questions(wh, KnowledgeQuestionsConfig()).skipped
    assert [r.status for r in list_runs(wh, stage="knowledge-questions")] == ["success", "success"]
