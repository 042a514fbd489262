"""Few-shot QA prompts, example draws and answer lines (lm-evaluation-harness's nq_open format)."""

import pytest

from nkb_model.fewshot import answer_of, fewshot_prompt, pick_shots

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


def test_shots_are_distinct_first_answers_drawn_the_same_way_for_a_seed():
    shots = pick_shots(QUESTIONS, ANSWERS, 4, seed=0)
    assert shots == pick_shots(QUESTIONS, ANSWERS, 4, seed=0) != pick_shots(QUESTIONS, ANSWERS, 4, seed=1)
    assert len({q for q, _ in shots}) == 4
    assert all(a == f"answer {q.split()[1]}" for q, a in shots)
    with pytest.raises(ValueError, match="11 shots asked for but the examples' split has 10 questions"):
        pick_shots(QUESTIONS, ANSWERS, 11, seed=0)


@pytest.mark.parametrize("written, answer", [(" Paris\nQ: next", "Paris"), (" Paris, France.", "Paris"),
                                             (" Mount Everest. It is", "Mount Everest"), ("\nParis", ""),
                                             ("  the Beatles ", "the Beatles")])
def test_the_answer_is_the_first_line_up_to_a_full_stop_or_comma(written, answer):
    assert answer_of(written) == answer
