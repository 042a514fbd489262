"""Context distillation from retrieval: the QA steps taught by the base reading each question's passage.

The QA steps train on each question's gold answer. `qa_teacher` takes a share of that loss from a teacher instead:
the frozen base with the question's passage in its prompt (the `Document:` lines the RAG row reads), and its
next-token distribution at each of the answer's tokens (its top `TEACHER_TOP` tokens and the rest of the vocabulary
as one more outcome), computed once, before anything is mounted. Without the passage, the model is trained toward
what the base says with it (knowledge modules, arXiv 2503.08727; cartridges, arXiv 2506.06266), which asks it to move
only as far as reading the passage moves the base, rather than toward the answer's tokens at any cost:

    QA loss = (1 − share) · CE(answer) + share · KL(teacher ‖ model)        over the answer's tokens

On text with no passage (the base's own text) the teacher is the base itself: `nkb_model.own_text`'s KL term.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from nkb_model.causal import encode_prompts, pad_causal
from nkb_model.own_text import TEACHER_TOP, top_kl
from nkb_model.train import Device

TAUGHT_IDS, TAUGHT_LOGP = "answer_teacher_ids", "answer_teacher_logp"  # the batch keys the teacher travels under
TEACHER_PROMPT_TOKENS = 1024  # a passage's prompt is cut from the left to this (the question stays whole)


@torch.no_grad()
def teach_answers(model: nn.Module, tokenizer, prompts: list[str], targets: list[list[int]], device: Device,
                  batch_size: int = 4, progress: Callable[[int], None] | None = None
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For each prompt (the question with its passage) and the answer's token ids as the student reads them, the
    model's top next tokens and their log-probabilities at each of the answer's tokens: (answer tokens,
    TEACHER_TOP) ids and log-probabilities, on the CPU."""
    read = encode_prompts(tokenizer, prompts, TEACHER_PROMPT_TOKENS - max(map(len, targets), default=0))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    taught: list = [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(read[i]) + len(targets[i]))  # batches of like length
    model.eval()
    for lo in range(0, len(order), batch_size):
        rows = order[lo:lo + batch_size]
        batch = pad_causal([(read[r], targets[r]) for r in rows], pad)
        with device.autocast():
            logits = model(input_ids=batch["input_ids"].to(device.device),
                           attention_mask=batch["attention_mask"].to(device.device), use_cache=False).logits
        where = (batch["labels"][:, 1:] != -100).to(logits.device)
        top = logits[:, :-1][where].float().log_softmax(-1).topk(TEACHER_TOP, dim=-1)
        lengths = [len(targets[r]) for r in rows]
        for r, ids, logp in zip(rows, top.indices.cpu().split(lengths), top.values.cpu().split(lengths)):
            taught[r] = (ids, logp)
        if progress:
            progress(len(rows))
    return taught


class WithTaughtAnswers:
    """`batch(step)`: the QA pair batches' step with the teacher's top tokens at each of its rows' answer tokens,
    (rows, answer tokens, TEACHER_TOP), a shorter answer padded at its end: row by row, as every batch key is (the
    training loop may cut a batch into micro-batches)."""

    def __init__(self, pairs, taught: list[tuple[torch.Tensor, torch.Tensor]]):
        self.pairs, self.taught = pairs, taught

    def __call__(self, step: int) -> dict[str, torch.Tensor]:
        rows = self.pairs.rows(step)
        return {**self.pairs(step), **{key: nn.utils.rnn.pad_sequence([self.taught[r][i] for r in rows],
                                                                         batch_first=True)
                                       for i, key in enumerate((TAUGHT_IDS, TAUGHT_LOGP))}}

    def __getattr__(self, name):  # per_epoch, rows, examples_for_epoch, ...: the pairs' own
        return getattr(self.pairs, name)


def answer_logits(model: nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, target ids) at each position whose next token is a label, row by row: a causal LM's batch read by
    the whole model, or a cached batch by the trained tail (`CachedTail.answer_logits`)."""
    if hasattr(model, "answer_logits"):
        return model.answer_logits(batch)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
    targets = batch["labels"][:, 1:]
    where = targets != -100
    return logits[:, :-1][where], targets[where]


class TaughtAnswers(nn.Module):
    """What the training loop calls: a batch the teacher taught (`WithTaughtAnswers`) is scored (1 − share) on its
    gold answers and `share` on the teacher's distribution; any other batch is the wrapped module's."""

    def __init__(self, inner: nn.Module, share: float):
        super().__init__()
        self.inner, self.share = inner, share

    def forward(self, **batch):
        ids, logp = batch.pop(TAUGHT_IDS, None), batch.pop(TAUGHT_LOGP, None)
        if ids is None:
            return self.inner(**batch)
        answers = (batch["labels"][:, 1:] != -100).sum(1)  # each row's answer tokens, where its padding starts
        kept = (torch.arange(ids.shape[1], device=answers.device) < answers[:, None]).to(ids.device)
        ids, logp = ids[kept], logp[kept]  # row by row, token by token: as the logits are read
        logits, targets = answer_logits(self.inner, batch)
        logits = logits.float()
        loss = self.share * top_kl(logits.log_softmax(-1), ids.to(logits.device), logp.to(logits.device))
        if self.share < 1:
            loss = loss + (1 - self.share) * F.cross_entropy(logits, targets)
        return SimpleNamespace(loss=loss)
