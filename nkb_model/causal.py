"""Decoder-only language models (GPT-2, Llama-style): the pipeline's (input, target) text pairs as one sequence.

A T5 reads the input with its encoder and writes the target with its decoder. A causal LM reads a prompt and
continues it, so a pair becomes `start prompt target eos` with the loss on `target eos` only: salient span
masking's pair is (the segment's text before the span, the span), recalled from what precedes it; a question's
is (`Question: … Answer:`, the answer), which ends with EOS: greedy decoding stops there. A span has no EOS
after it (the text goes on), so a cloze probe's prompt is the text before the answer and its continuation is
scored on as many words as the answer has (`probe_fill`). A sequence starts as the model's own tokenizer starts a
text (`start_ids`), which is how lm-evaluation-harness and transformers' pipelines feed it.

A target is tokenized as it is in running text, after the prompt (a GPT-2 BPE token carries its leading space):
the pair is tokenized whole and split where the prompt's own tokens end. Prompts are cut from the left (the
words nearest the target are kept), targets from the right.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from nkb_model.batches import PackedRowBatches


def start_ids(tokenizer) -> list[int]:
    """The tokens a text starts with: those its tokenizer puts before a text itself (a Llama-2 or Llama-3 tokenizer's
    BOS); none where the tokenizer has a BOS but does not add it (SmolLM2's `<|im_start|>` opens a chat turn, GPT-2's
    `<|endoftext|>` ends a document: neither model reads it before a plain text); EOS where it has no BOS at all (the
    bases built here, whose packed pretraining text starts each document after an EOS)."""
    if tokenizer.bos_token_id is None:
        return [tokenizer.eos_token_id]
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    marked = tokenizer("a")["input_ids"]
    return next((marked[:k] for k in range(len(marked) - len(plain) + 1) if marked[k:k + len(plain)] == plain), [])


def pair_text(prompt: str, target: str) -> str:
    """The text a pair is read as: the prompt, then the target as running text (`encode_pairs` tokenizes it)."""
    return prompt + target if not prompt or prompt[-1].isspace() else f"{prompt} {target}"


def encode_pairs(tokenizer, prompts: list[str], targets: list[str], max_prompt_len: int = 512,
                 max_target_len: int = 64, eos: bool = True) -> list[tuple[list[int], list[int]]]:
    """(start + prompt ids, target ids + eos) for each pair. `eos`: whether the target ends with EOS: an answer does
    (the model learns to stop after it), a masked span does not (the text goes on after it). A target with nothing
    before it (a span that opens its segment) under a tokenizer that adds no start keeps its first token as the
    prompt, as a text's first token is never predicted: the pair is still a prefix of its segment's tokens (which the
    segment cache holds)."""
    plain = dict(add_special_tokens=False)
    start = start_ids(tokenizer)
    prompt_ids = tokenizer([p.rstrip() for p in prompts], **plain)["input_ids"] if prompts else []
    whole = tokenizer([pair_text(p.rstrip(), t.strip()) for p, t in zip(prompts, targets)], **plain)["input_ids"] \
        if prompts else []
    pairs = []
    for p, w, target in zip(prompt_ids, whole, targets):
        if not p or w[:len(p)] == p:
            t = w[len(p):]
        else:  # the prompt's last token merged with the target's first: tokenize the target alone
            t = tokenizer(target.strip(), **plain)["input_ids"]
        end = [tokenizer.eos_token_id] if eos else []
        prompt = start + _last(p, max_prompt_len - len(start))
        if not prompt and len(t) > 1:
            prompt, t = t[:1], t[1:]
        pairs.append((prompt or [tokenizer.eos_token_id], t[:max_target_len - len(end)] + end))
    return pairs


def _last(ids: list[int], n: int) -> list[int]:
    return ids[max(0, len(ids) - n):]


def encode_prompts(tokenizer, prompts: list[str], max_prompt_len: int | None = None) -> list[list[int]]:
    """start + prompt ids, cut from the left to `max_prompt_len` tokens; an empty prompt is EOS alone where the
    tokenizer adds no start (a model needs something to continue)."""
    ids = tokenizer([p.rstrip() for p in prompts], add_special_tokens=False)["input_ids"]
    start = start_ids(tokenizer)
    kept = [start + (_last(i, max_prompt_len - len(start)) if max_prompt_len else i) for i in ids]
    return [k or [tokenizer.eos_token_id] for k in kept]


def pad_causal(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Pairs as right-padded sequences; labels are the target's tokens, -100 elsewhere (the model shifts them)."""
    width = max(len(p) + len(t) for p, t in pairs)
    input_ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(pairs), width), dtype=torch.long)
    labels = torch.full((len(pairs), width), -100, dtype=torch.long)
    for row, (prompt, target) in enumerate(pairs):
        n = len(prompt) + len(target)
        input_ids[row, :n] = torch.tensor(prompt + target)
        attention[row, :n] = 1
        labels[row, len(prompt):n] = torch.tensor(target)
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


@functools.lru_cache(maxsize=4)
def line_end_ids(tokenizer) -> tuple[int, ...]:
    """EOS and every token whose text holds a line break: generation that keeps only the first line of what it
    writes stops at any of them (the same first line, without writing the rest: ~half the steps of a few-shot
    answer that would go on to the next example)."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    return (tokenizer.eos_token_id, *(i for i, t in enumerate(texts) if "\n" in t and i != tokenizer.eos_token_id))


def pad_left(ids: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Prompts left-padded, so that every row's next token is at the last position (for generation)."""
    width = max(len(i) for i in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(ids), width), dtype=torch.long)
    for row, i in enumerate(ids):
        input_ids[row, width - len(i):] = torch.tensor(i)
        attention[row, width - len(i):] = 1
    return {"input_ids": input_ids, "attention_mask": attention}


class NextTokenBatches(PackedRowBatches):
    """`batch(step)`: packed rows for next-token prediction, in `PackedRowBatches`' order."""

    def __call__(self, step: int) -> dict[str, torch.Tensor]:
        input_ids = torch.as_tensor(self.rows[self.row_ids(step)], dtype=torch.long)
        return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": input_ids.clone()}


def cloze_prefix(prompt: str, mask: str = "<extra_id_0>") -> str:
    """A T5 cloze prompt (`… born in <extra_id_0>.`) as a causal LM's prompt: the text before the blank."""
    return prompt.split(mask, 1)[0].rstrip()


def probe_fill(continuation: str, answer: str) -> str:
    """The words of a continuation that stand where the answer would: as many as the answer has."""
    return " ".join(continuation.split()[:len(answer.split())])
