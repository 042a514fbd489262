"""Few-shot QA prompts, example draws and answer lines (lm-evaluation-harness's nq_open format)."""

import pytest

from nkb_model.fewshot import answer_of, draw_shots, fewshot_prompt

QUESTIONS = [f"question {i}" for i in range(10)]
ANSWERS = [[f"answer {i}", f"other {i}"] for i in range(10)]


def test_the_prompt_is_the_harness_nq_open_one():
    prompt = fewshot_prompt([("who wrote hamlet", "Shakespeare"), ("capital of france?", "Paris")],
                            "where is the eiffel tower? ")
    assert prompt == ("Answer these questions:\n\n"
                      "Q: who wrote hamlet?\nA: Shakespeare\n"
                      "Q: capital of france?\nA: Paris\n"
                      "Q: where is the eiffel tower?\nA:")
    assert fewshot_prompt([], "who wrote hamlet") == "Answer these questions:\n\nQ: who wrote hamlet?\nA:"


def test_retrieved_documents_go_just_before_the_question_one_line_each():
    prompt = fewshot_prompt([("who wrote hamlet", "Shakespeare")], "where is the eiffel tower?",
                            ["The Eiffel Tower\nis in Paris.", "Paris  is in France."])
    assert prompt == ("Answer these questions:\n\n"
                      "Q: who wrote hamlet?\nA: Shakespeare\n"
                      "Document: The Eiffel Tower is in Paris.\nDocument: Paris is in France.\n"
                      "Q: where is the eiffel tower?\nA:")


ASKED = [(f"asked {i}?", [f"gold {i}"]) for i in range(6)]


def test_each_question_gets_its_own_draw_of_distinct_first_answers_the_same_for_a_seed():
    drawn = draw_shots(QUESTIONS, ANSWERS, 4, seed=0, asked=ASKED)
    assert drawn == draw_shots(QUESTIONS, ANSWERS, 4, 0, ASKED) != draw_shots(QUESTIONS, ANSWERS, 4, 1, ASKED)
    assert len(drawn) == 6 and len({tuple(s) for s in drawn}) > 1  # not one draw for all
    assert all(len({q for q, _ in shots}) == 4 for shots in drawn)
    assert all(a == f"answer {q.split()[1]}" for shots in drawn for q, a in shots)
    assert draw_shots(QUESTIONS, ANSWERS, 4, seed=0, asked=ASKED[:3]) == drawn[:3]  # a question's draw: its place
    once = draw_shots(QUESTIONS, ANSWERS, 4, seed=0, asked=ASKED, per_question=False)
    assert once == [drawn[0]] * 6
    with pytest.raises(ValueError, match="11 shots asked for but the examples' split has 10 questions"):
        draw_shots(QUESTIONS, ANSWERS, 11, seed=0, asked=ASKED)


def test_a_question_is_never_its_own_example():
    itself = [(f"{q}?", a) for q, a in zip(QUESTIONS, ANSWERS)]  # the examples' split asked (its `?` aside)
    for shots, (question, _) in zip(draw_shots(QUESTIONS, ANSWERS, 9, seed=0, asked=itself), itself):
        assert len(shots) == 9 and question.rstrip("?") not in [q for q, _ in shots]


def test_the_draws_are_lm_evaluation_harness_default_samplers():
    samplers = pytest.importorskip("lm_eval.api.samplers")
    docs = [{"question": q, "answer": a} for q, a in zip(QUESTIONS, ANSWERS)]
    asked = [{"question": q, "answer": a} for q, a in ASKED[:4]] + docs[2:6]  # four of them examples too
    sampler = samplers.ContextSampler(docs, rnd=1234)  # the harness's default fewshot_random_seed
    # nq_open names no test split, so the harness passes each asked document as the one to leave out.
    theirs = [[(d["question"], d["answer"][0]) for d in sampler.sample(3, eval_doc=doc)] for doc in asked]
    assert draw_shots(QUESTIONS, ANSWERS, 3, seed=1234, asked=[(d["question"], d["answer"]) for d in asked]) == theirs


@pytest.mark.parametrize("written, answer", [(" Paris\nQ: next", "Paris"), (" Paris, France.", "Paris"),
                                             (" Mount Everest. It is", "Mount Everest"), ("\nParis", ""),
                                             ("  the Beatles ", "the Beatles")])
def test_the_answer_is_the_first_line_up_to_a_full_stop_or_comma(written, answer):
    assert answer_of(written) == answer
