"""T5's span-corruption objective (Raffel et al. 2020, §3.1.4), for pretraining the small base model.

About 15 % of the tokens, in spans of mean length 3, are dropped from the input; each dropped span is
replaced by one sentinel, and the target lists the sentinels each followed by the tokens it hid.
"""

from __future__ import annotations

import numpy as np


def _split(total: int, parts: int, rng: np.random.Generator) -> np.ndarray:
    """`total` split into `parts` positive integers, uniformly at random."""
    cuts = np.sort(rng.choice(np.arange(1, total), size=parts - 1, replace=False)) if parts > 1 else np.array([], int)
    return np.diff(np.concatenate([[0], cuts, [total]]))


def noise_mask(length: int, rng: np.random.Generator, density: float = 0.15, mean_span: float = 3.0) -> np.ndarray:
    """Boolean mask over `length` tokens: True where a token is hidden. Starts with kept tokens."""
    noise = int(min(max(round(length * density), 1), length - 1))
    spans = max(1, min(int(round(noise / mean_span)), noise, length - noise))
    noise_lengths = _split(noise, spans, rng)
    kept_lengths = _split(length - noise, spans, rng)
    mask = np.zeros(length, dtype=bool)
    position = 0
    for kept, hidden in zip(kept_lengths, noise_lengths):
        position += kept
        mask[position:position + hidden] = True
        position += hidden
    return mask


def corrupt(ids: list[int], sentinels: list[int], rng: np.random.Generator, density: float = 0.15,
            mean_span: float = 3.0) -> tuple[list[int], list[int]]:
    """(input ids, target ids) for one token sequence (no EOS; the caller appends it)."""
    if len(ids) < 2:
        return list(ids), []
    mask = noise_mask(len(ids), rng, density, mean_span)
    inputs, targets, span = [], [], -1
    for i, token in enumerate(ids):
        if mask[i]:
            if i == 0 or not mask[i - 1]:
                span += 1
                inputs.append(sentinels[span])
                targets.append(sentinels[span])
            targets.append(token)
        else:
            inputs.append(token)
    return inputs, targets
