"""Closed-book QA as causal language models are evaluated: no fine-tuning, K solved questions in the prompt, greedy
decoding, the answer read off the first line. The prompt is lm-evaluation-harness's `nq_open` task's (an
instruction line, then `Q: question?` / `A: answer` lines), so that EM can be checked against that harness on the
same model, questions and examples (`bench/fewshot_vs_harness.py`)."""

from __future__ import annotations

import random

INSTRUCTION = "Answer these questions:\n\n"
STOPS = ("\n", ".", ",")  # where the answer ends, as the harness's nq_open cuts it


def pick_shots(questions: list[str], answers: list[list[str]], k: int, seed: int) -> list[tuple[str, str]]:
    """K (question, first answer) examples drawn without replacement with a fixed seed; the same K for every
    question asked, so that a run is reproducible and its prompts share one prefix."""
    if k > len(questions):
        raise ValueError(f"{k} shots asked for but the examples' split has {len(questions)} questions")
    return [(questions[i], answers[i][0]) for i in random.Random(seed).sample(range(len(questions)), k)]


def _line(question: str) -> str:
    return f"Q: {question.strip().rstrip('?').strip()}?\nA:"


def fewshot_prompt(shots: list[tuple[str, str]], question: str) -> str:
    """The instruction, each example as `Q: …?` / `A: answer`, then the question with `A:` left open."""
    return INSTRUCTION + "".join(f"{_line(q)} {a}\n" for q, a in shots) + _line(question)


def answer_of(written: str) -> str:
    """The answer in what the model wrote after `A:`: up to the first line break, full stop or comma."""
    for stop in STOPS:
        written = written.split(stop, 1)[0]
    return written.strip()
