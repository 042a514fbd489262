"""Closed-book QA as causal language models are evaluated: no fine-tuning, K solved questions in the prompt, greedy
decoding, the answer read off the first line. The prompt is lm-evaluation-harness's `nq_open` task's (an
instruction line, then `Q: question?` / `A: answer` lines), so that EM can be checked against that harness on the
same model, questions and examples (`bench/fewshot_vs_harness.py`)."""

from __future__ import annotations

import random

INSTRUCTION = "Answer these questions:\n\n"
STOPS = ("\n", ".", ",")  # where the answer ends, as the harness's nq_open cuts it


def draw_shots(questions: list[str], answers: list[list[str]], k: int, seed: int,
               asked: list[tuple[str, list[str]]], per_question: bool = True) -> list[list[tuple[str, str]]]:
    """The K (question, first answer) examples each of the `asked` (question, answers) is asked after, in order.
    per_question: each question its own draw, from one generator seeded with `seed`, as lm-evaluation-harness's
    default sampler draws for nq_open (`random.Random(seed).sample` of K + 1 examples per question, in order, less
    the question itself, then the first K): shots shared by every prompt let a model copy one of their answers
    everywhere, which moves EM with the one draw. Otherwise the first draw for every question."""
    if k > len(questions):
        raise ValueError(f"{k} shots asked for but the examples' split has {len(questions)} questions")
    rnd = random.Random(seed)
    shots = []
    for question, golds in asked if per_question else asked[:1]:
        drawn = rnd.sample(range(len(questions)), min(k + 1, len(questions)))
        itself = plain_question(question), golds
        shots.append([(questions[i], answers[i][0]) for i in drawn
                      if (plain_question(questions[i]), answers[i]) != itself][:k])
    return shots if per_question else shots * len(asked)


def plain_question(question: str) -> str:
    """A question as the nq_open prompt holds it: without its question mark (the template adds one)."""
    return question.strip().rstrip("?").strip()


def _line(question: str) -> str:
    return f"Q: {plain_question(question)}?\nA:"


def fewshot_prompt(shots: list[tuple[str, str]], question: str, documents: list[str] | None = None) -> str:
    """The instruction, each example as `Q: …?` / `A: answer`, then the question with `A:` left open; with
    `documents` (retrieval-augmented), the question's retrieved documents just before it, one `Document:` line
    each, where the examples' form cannot pull the model away from them."""
    context = "".join(f"Document: {' '.join(d.split())}\n" for d in documents or [])
    return INSTRUCTION + "".join(f"{_line(q)} {a}\n" for q, a in shots) + context + _line(question)


def answer_of(written: str) -> str:
    """The answer in what the model wrote after `A:`: up to the first line break, full stop or comma."""
    for stop in STOPS:
        written = written.split(stop, 1)[0]
    return written.strip()
