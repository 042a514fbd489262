"""Evaluations beyond QA exact match: the cloze knowledge probe and the held-out language-model loss."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from nkb_model.families import family
from nkb_model.metrics import exact_match
from nkb_model.train import Device


def probe(model, tokenizer, prompts: list[str], answers: list[str], device: Device, batch_size: int = 256,
          max_new_tokens: int = 16) -> tuple[list[str], list[bool]]:
    """LAMA-style cloze probe: what the model fills `<extra_id_0>` of each prompt with, and whether that is the answer.
    A decoder-only model continues the text before the blank; its first words, as many as the answer's, are the fill.
    Batches of 256 short prompts: on 2 CPU cores SmolLM2's 900 demo probes took 30 s against 40 s in batches of 64
    (a decoding step of 64 rows is bound by its latency, not its arithmetic); 8 of the 900 fills moved with the
    batch's bf16 rounding, the EM not."""
    fills = family(model).probe_fills(model, tokenizer, prompts, answers, device, batch_size, max_new_tokens)
    return fills, [exact_match(f, [a]) for f, a in zip(fills, answers)]


@dataclass(frozen=True)
class RowLosses:
    """Each held-out row's summed token loss and its token count, in the rows' order: the loss on any subset of the
    rows (those a routed loss reads) is then read off one pass over them all."""
    sums: np.ndarray
    tokens: np.ndarray

    def mean(self, where: np.ndarray | None = None) -> float:
        """The mean token loss on the rows `where` marks (all rows: None)."""
        chosen = slice(None) if where is None else where
        return float(self.sums[chosen].sum() / self.tokens[chosen].sum())


@torch.no_grad()
def heldout_row_losses(model, tokenizer, rows: np.ndarray, device: Device, batch_size: int = 32,
                       seed: int = 1234) -> RowLosses:
    """The span-corruption loss of each held-out text row, with a fixed noise draw (comparable across models); a
    decoder-only model's next-token loss. Every row is read, those a full batch leaves out in a last, shorter
    batch."""
    if not len(rows):
        raise ValueError("no held-out rows to measure the held-out loss on")
    model.eval()
    of_family = family(model)
    batches = of_family.text_batches(rows, tokenizer, min(batch_size, len(rows)), seed, keep_last=True)
    sums, tokens = np.zeros(len(rows)), np.zeros(len(rows), dtype=np.int64)
    for step in range(batches.per_epoch):
        batch = {k: v.to(device.device) for k, v in batches(step).items()}
        with device.autocast():
            summed, counted = of_family.row_losses(model, batch)
        ids = batches.row_ids(step)
        sums[ids], tokens[ids] = summed.double().cpu().numpy(), counted.cpu().numpy()
    return RowLosses(sums, tokens)


def heldout_loss(model, tokenizer, rows: np.ndarray, device: Device, batch_size: int = 32, seed: int = 1234) -> float:
    """The mean token loss on held-out text rows (`heldout_row_losses`)."""
    return heldout_row_losses(model, tokenizer, rows, device, batch_size, seed).mean()
