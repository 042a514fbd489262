"""Closed-book QA as causal language models are evaluated: no fine-tuning, K solved questions in the prompt, greedy
decoding, the answer read off the first line. The prompt is lm-evaluation-harness's `nq_open` task's (an
instruction line, then `Q: question?` / `A: answer` lines), so that EM can be checked against that harness on the
same model, questions and examples (`bench/fewshot_vs_harness.py`)."""

from __future__ import annotations

import random

INSTRUCTION = "Answer these questions:\n\n"
STOPS = ("\n", ".", ",")  # where the answer ends, as the harness's nq_open cuts it


def draw_shots(questions: list[str], answers: list[list[str]], k: int, seed: int, asked: int,
               per_question: bool = True) -> list[list[tuple[str, str]]]:
    """The K (question, first answer) examples each of `asked` questions is asked after, in order. per_question:
    each question its own draw without replacement, from one generator seeded with `seed` (lm-evaluation-harness's
    default few-shot sampler: `random.Random(seed).sample` per document, in document order): shots shared by every
    prompt let a model copy one of their answers everywhere, which moves EM with the one draw. Otherwise the first
    draw for every question (prompts then share one prefix)."""
    if k > len(questions):
        raise ValueError(f"{k} shots asked for but the examples' split has {len(questions)} questions")
    rnd = random.Random(seed)
    draws = [rnd.sample(range(len(questions)), k) for _ in range(asked if per_question else min(asked, 1))]
    shots = [[(questions[i], answers[i][0]) for i in draw] for draw in draws]
    return shots if per_question else shots * asked


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
