"""Evaluations beyond QA exact match: the cloze knowledge probe and the held-out language-model loss."""

from __future__ import annotations

import re

import numpy as np
import torch

from nkb_model.base_model import SpanCorruptionBatches
from nkb_model.metrics import exact_match
from nkb_model.train import Device


def filled_span(decoded: str) -> str:
    """The text a model wrote for `<extra_id_0>`: after that sentinel, up to the next one."""
    text = decoded.replace("<pad>", "").split("</s>", 1)[0]
    if "<extra_id_0>" in text:
        text = text.split("<extra_id_0>", 1)[1]
    return " ".join(re.sub(r"<extra_id_\d+>", " ", text.split("<extra_id_1>", 1)[0]).split())


@torch.no_grad()
def probe(model, tokenizer, prompts: list[str], answers: list[str], device: Device, batch_size: int = 64,
          max_new_tokens: int = 16) -> tuple[list[str], list[bool]]:
    """LAMA-style cloze probe: what the model fills `<extra_id_0>` of each prompt with, and whether that is the answer."""
    model.eval()
    fills = []
    for lo in range(0, len(prompts), batch_size):
        enc = tokenizer(prompts[lo:lo + batch_size], return_tensors="pt", padding=True).to(device.device)
        with device.autocast():
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1)
        fills += [filled_span(t) for t in tokenizer.batch_decode(out, skip_special_tokens=False)]
    return fills, [exact_match(f, [a]) for f, a in zip(fills, answers)]


@torch.no_grad()
def heldout_loss(model, tokenizer, rows: np.ndarray, device: Device, batch_size: int = 32, seed: int = 1234) -> float:
    """Mean span-corruption loss on held-out text rows, with a fixed noise draw (comparable across models)."""
    model.eval()
    batches = SpanCorruptionBatches(rows, tokenizer, min(batch_size, len(rows)), seed)
    losses, weights = [], []
    for step in range(batches.per_epoch):
        batch = {k: v.to(device.device) for k, v in batches(step).items()}
        with device.autocast():
            loss = model(**batch).loss
        losses.append(loss.item())
        weights.append(int((batch["labels"] != -100).sum()))
    return float(np.average(losses, weights=weights))
