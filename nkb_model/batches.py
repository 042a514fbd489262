"""Training batches as a pure function of the step, from (input, target) text pairs.

`examples_for_epoch(epoch)` supplies the pairs of an epoch (SSM redraws its masks each epoch; QA
pairs stay the same); each epoch visits them in a seeded random order, in full batches (with `group_by_length`,
batches of examples of similar length, in random order: less padding). An encoder-decoder
reads the input and is trained on the target; a decoder-only model reads both as one sequence, trained on the
target (`nkb_model.causal`): how pairs are encoded and padded is the `family`'s (`nkb_model.families`), through
which stages make them."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch


class PackedRowBatches:
    """Batches of packed token rows (pretraining text, held-out text) as a pure function of the step: each epoch
    visits the rows in a seeded order. `keep_last`: an epoch ends with the rows a full batch would leave out, as a
    shorter batch (a measurement reads every row). Subclasses make a batch of the rows `row_ids(step)` names."""

    def __init__(self, rows: np.ndarray, batch_size: int, seed: int = 0, keep_last: bool = False):
        if len(rows) < batch_size:
            raise ValueError(f"{len(rows)} sequences are fewer than one batch of {batch_size}")
        self.rows, self.batch_size, self.seed = rows, batch_size, seed
        self.per_epoch = -(-len(rows) // batch_size) if keep_last else len(rows) // batch_size

    def row_ids(self, step: int) -> np.ndarray:
        """The indices in `rows` of step `step`'s batch, in the batch's order."""
        epoch, index = divmod(step, self.per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))
        return order[index * self.batch_size:(index + 1) * self.batch_size]


class PairBatches:
    def __init__(self, examples_for_epoch: Callable[[int], tuple[list[str], list[str]]], tokenizer, batch_size: int,
                 seed: int = 0, max_input_len: int = 512, max_target_len: int = 64, *, family,
                 knowledge_ids: torch.Tensor | None = None, target_eos: bool = True, group_by_length: bool = False):
        self.examples_for_epoch, self.tokenizer, self.family = examples_for_epoch, tokenizer, family
        self.group_by_length = group_by_length
        self.target_eos = target_eos  # decoder-only: whether targets end with EOS (answers) or not (masked spans)
        self.knowledge_ids = knowledge_ids  # (examples, N, tokens): Kformer's documents of each (fixed) example
        self.batch_size, self.seed = batch_size, seed
        self.max_input_len, self.max_target_len = max_input_len, max_target_len
        self._epoch, self._order = None, None
        self._pairs, self._ids = None, None  # the last epoch's pairs and their token ids
        inputs, _ = examples_for_epoch(0)
        if len(inputs) < batch_size:
            raise ValueError(f"{len(inputs)} training examples are fewer than one batch of {batch_size}")
        self.per_epoch = len(inputs) // batch_size

    def _encode(self, epoch: int):
        if self._epoch != epoch:
            inputs, targets = self.examples_for_epoch(epoch)
            if self._pairs != (inputs, targets):  # QA pairs repeat every epoch: tokenise them once
                self._pairs = (inputs, targets)
                self._ids = self.family.encode_pairs(self.tokenizer, inputs, targets, self.max_input_len,
                                                     self.max_target_len, self.target_eos)
            rng = np.random.default_rng([self.seed, epoch])
            order = rng.permutation(len(inputs))
            if self.group_by_length:
                order = grouped_by_length(order, [len(i) + len(t) for i, t in zip(*self._ids)], self.batch_size, rng)
            self._epoch, self._order = epoch, order
        return (*self._ids, self._order)

    def encoded(self, epoch: int = 0) -> tuple[list[list[int]], list[list[int]]]:
        """The epoch's (input ids, target ids) of each example, as its batches read them."""
        return self._encode(epoch)[:2]

    def rows(self, step: int) -> np.ndarray:
        """The indices of the epoch's examples that make up step `step`'s batch."""
        epoch, index = divmod(step, self.per_epoch)
        return self._encode(epoch)[2][index * self.batch_size:(index + 1) * self.batch_size]

    def __call__(self, step: int) -> dict[str, torch.Tensor]:
        enc_in, enc_out, _ = self._encode(step // self.per_epoch)
        rows = self.rows(step)
        pairs = [(enc_in[r], enc_out[r]) for r in rows]
        batch = self.family.pad(pairs, self.tokenizer.pad_token_id)
        if self.knowledge_ids is not None:
            batch["knowledge_ids"] = self.knowledge_ids[torch.as_tensor(rows)]
        return batch


def grouped_by_length(order: np.ndarray, lengths: list[int], batch_size: int, rng: np.random.Generator,
                      window: int = 64) -> np.ndarray:
    """`order`'s full batches regrouped so that each holds examples of similar length, the batches in random
    order: within each run of `window` batches of `order`, its examples sorted by length, then cut into batches
    (the `group_by_length` of transformers' Trainer). A batch pads to its longest example, so this pads less; the
    examples an epoch visits stay the same."""
    full = len(order) // batch_size * batch_size
    span = batch_size * window
    grouped = np.concatenate([sorted(order[lo:min(lo + span, full)], key=lengths.__getitem__)
                              for lo in range(0, full, span)] or [order[:0]])
    batches = grouped.reshape(-1, batch_size)
    return np.concatenate([batches[rng.permutation(len(batches))].reshape(-1), order[full:]])


def pad_pairs(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Input/target id lists padded into model tensors; label padding is -100 (ignored by the loss)."""
    width_in = max(len(i) for i, _ in pairs)
    width_out = max(len(t) for _, t in pairs)
    input_ids = torch.full((len(pairs), width_in), pad_id, dtype=torch.long)
    labels = torch.full((len(pairs), width_out), -100, dtype=torch.long)
    for row, (inp, tgt) in enumerate(pairs):
        input_ids[row, :len(inp)] = torch.tensor(inp)
        labels[row, :len(tgt)] = torch.tensor(tgt)
    return {"input_ids": input_ids, "attention_mask": (input_ids != pad_id).long(), "labels": labels}
