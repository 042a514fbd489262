"""Injection at the cost of the slots, not of the base (issue 38).

With the base frozen, the blocks of a decoder-only model below the first one that holds trainable slots compute the
same thing at every step: the hidden states entering that block depend on the tokens alone. They are computed once
per segment (`SegmentCache`), and a training step runs only the blocks from there up, the final norm, and the
output head at the positions the loss reads (`tail_loss`). A causal model's state at a position depends only on the
tokens up to it, so a training sequence that is a prefix of its segment's tokens (the text before a span, then the
span) reads its rows off the segment's cache exactly; one that is not (a span whose last token merged with the next
character) is computed afresh. The loss is the uncached path's on the same batch (`tests/nkb_model/test_prefix_cache`).

The model runs its own code on a shortened list of blocks (`only_blocks`): the first block must read the embeddings
as they are, so families that scale them (Gemma) or add position embeddings to them (GPT-2) train through the whole
model (`supports_cache`).
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from nkb_model.causal import pair_text, start_ids
from nkb_model.mounting import architecture_of, block_names, block_stack, get_ffn
from nkb_model.train import Device

# The inner models whose blocks read `inputs_embeds` unchanged (the Llama-style table entries that do).
PASS_THROUGH = {"LlamaModel", "MistralModel", "Qwen2Model", "Qwen3Model"}


class _Stop(Exception):
    """Raised by a hook to end a forward pass early, once the wanted states are in hand."""


def supports_cache(model: nn.Module) -> bool:
    return architecture_of(model).prefix_cache and type(model.model).__name__ in PASS_THROUGH


def first_trainable_block(model: nn.Module) -> int:
    """The index of the lowest block with a parameter that trains (everything below it is frozen)."""
    blocks = block_stack(model, "decoder")
    for i, block in enumerate(blocks):
        if any(p.requires_grad for p in block.parameters()):
            return i
    raise ValueError("no block has a parameter that trains")


@contextlib.contextmanager
def only_blocks(model: nn.Module, start: int, stop: int | None = None) -> Iterator[None]:
    """While inside, the model's forward pass runs blocks[start:stop] alone (the list swapped, then put back)."""
    inner = model.model
    whole = inner.layers
    inner.layers = nn.ModuleList(list(whole)[start:stop])
    try:
        yield
    finally:
        inner.layers = whole


def prefix_states(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, k: int) -> torch.Tensor:
    """The hidden states entering block `k` (batch, seq, d_model), computed without gradients."""
    captured = {}

    def grab(module, args):
        captured["states"] = args[0]
        raise _Stop

    handle = model.model.norm.register_forward_pre_hook(grab)
    try:
        with torch.no_grad(), only_blocks(model, 0, k), contextlib.suppress(_Stop):
            model.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    finally:
        handle.remove()
    return captured["states"]


@contextlib.contextmanager
def ffn_on_rows(ffn: nn.Module, where: torch.Tensor) -> Iterator[None]:
    """While inside, `ffn` computes only the positions `where` (batch, seq) marks, and gives zeros at the others.
    For the top block, whose other rows nothing reads: its FFN and slots are most of a block's work."""
    def gather(module, args):
        return (args[0][where],)

    def scatter(module, args, out):
        full = out.new_zeros(*where.shape, out.shape[-1])
        full[where] = out
        return full

    handles = [ffn.register_forward_pre_hook(gather), ffn.register_forward_hook(scatter)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def tail_loss(model: nn.Module, states: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
              k: int) -> torch.Tensor:
    """The causal LM loss of sequences whose states entering block `k` are `states` (`tail_logits`)."""
    logits, targets = tail_logits(model, states, attention_mask, labels, k)
    return F.cross_entropy(logits.float(), targets)


def tail_logits(model: nn.Module, states: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
                k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, target ids) at the positions whose next token is a label, row by row, of sequences whose states
    entering block `k` are `states`: blocks k.., the final norm, and the output head at those positions only (the
    head's other rows would be discarded). The top block's FFN runs at those positions only: its output elsewhere
    reaches nothing but the head's discarded rows (the blocks below feed every later position through attention, so
    they run in full)."""
    targets = labels[:, 1:]
    where = targets != -100
    read = F.pad(where, (0, 1))  # the positions whose state the head reads
    top = get_ffn(model, block_names(model)[-1])
    with only_blocks(model, k), ffn_on_rows(top, read):
        hidden = model.model(inputs_embeds=states, attention_mask=attention_mask, use_cache=False).last_hidden_state
    return model.lm_head(hidden[:, :-1][where]), targets[where]


class CachedTail(nn.Module):
    """What the training loop calls: a batch of cached states (`inputs_embeds`) goes through the tail, any other
    batch (injection's general-text steps) through the whole model. Its parameters are the model's (the slots
    train in place)."""

    def __init__(self, model: nn.Module, k: int):
        super().__init__()
        self.model, self.k = model, k

    def forward(self, **batch):
        if "inputs_embeds" not in batch:
            return self.model(**batch)
        return SimpleNamespace(loss=tail_loss(self.model, batch["inputs_embeds"], batch["attention_mask"],
                                              batch["labels"], self.k))

    def answer_logits(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, target ids) of a cached batch at its label positions, as `tail_loss` reads them."""
        return tail_logits(self.model, batch["inputs_embeds"], batch["attention_mask"], batch["labels"], self.k)


class CachedBatches:
    """`batch(step)`: the pair batches' step with its sequences read off the segment cache. `segments_of(epoch)`
    gives the segment index of each of the epoch's examples, in the pair batches' order."""

    def __init__(self, pairs, segments_of: Callable[[int], list[int]], cache: "SegmentCache", model: nn.Module):
        self.pairs, self.segments_of, self.cache, self.model = pairs, segments_of, cache, model
        self.per_epoch = pairs.per_epoch

    def __call__(self, step: int) -> dict[str, torch.Tensor]:
        segments = self.segments_of(step // self.pairs.per_epoch)
        batch = self.pairs(step)
        more = {key: value for key, value in batch.items() if key not in ("input_ids", "attention_mask", "labels")}
        return {**self.cache.batch(self.model, batch, [segments[r] for r in self.pairs.rows(step)]), **more}


def fixed_pairs_cached(pairs, model: nn.Module, tokenizer, k: int, device: Device) -> CachedBatches:
    """`pairs` (pair batches whose examples are the same every epoch: the train split's questions) read off a cache
    of each pair's whole sequence, as the segments' steps are: without it a question's step ran every block, at about
    two thirds of a span step's speed."""
    inputs, targets = pairs.examples_for_epoch(0)
    cache = SegmentCache(model, tokenizer, [pair_text(i.rstrip(), t.strip()) for i, t in zip(inputs, targets)], k,
                         device, end=(tokenizer.eos_token_id,) if pairs.target_eos else ())
    every = list(range(len(inputs)))
    return CachedBatches(pairs, lambda epoch: every, cache, model)


class SegmentCache:
    """For each segment: its token ids (its start, `start_ids`, then the text as running text, then `end`: a pair's
    EOS) and the hidden states entering block `k` at each of them, computed once, in batches of similar length, kept
    on the CPU in fp32."""

    def __init__(self, model: nn.Module, tokenizer, texts: list[str], k: int, device: Device,
                 batch_size: int = 16, max_len: int = 512, progress: Callable[[int], None] | None = None,
                 end: tuple[int, ...] = ()):
        self.k, self.device = k, device
        plain = tokenizer(texts, add_special_tokens=False)["input_ids"]
        start = start_ids(tokenizer)
        self.ids = [(start + ids + list(end))[:max_len] for ids in plain]
        self.states: list[torch.Tensor | None] = [None] * len(texts)
        order = sorted(range(len(texts)), key=lambda i: len(self.ids[i]))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        for lo in range(0, len(order), batch_size):
            rows = order[lo:lo + batch_size]
            width = max(len(self.ids[r]) for r in rows)
            ids = torch.full((len(rows), width), pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for j, r in enumerate(rows):
                ids[j, :len(self.ids[r])] = torch.tensor(self.ids[r])
                mask[j, :len(self.ids[r])] = 1
            with device.autocast():  # the precision the uncached path computes these blocks in
                states = prefix_states(model, ids.to(device.device), mask.to(device.device), k).float().cpu()
            for j, r in enumerate(rows):
                self.states[r] = states[j, :len(self.ids[r])].clone()
            if progress:
                progress(len(rows))

    def rows(self, segment: int, ids: list[int]) -> torch.Tensor | None:
        """The cached states of a sequence that is a prefix of segment `segment`'s tokens, else None."""
        known = self.ids[segment]
        return self.states[segment][:len(ids)] if known[:len(ids)] == ids else None

    def batch(self, model: nn.Module, batch: dict[str, torch.Tensor], segments: list[int]) -> dict[str, torch.Tensor]:
        """A right-padded causal batch (`pad_causal`'s) with its input ids replaced by the states entering block k:
        read off the cache, or computed for the rows that are no prefix of their segment."""
        ids, mask = batch["input_ids"], batch["attention_mask"]
        lengths = mask.sum(1).tolist()
        found = [self.rows(s, ids[i, :n].tolist()) for i, (s, n) in enumerate(zip(segments, lengths))]
        missing = [i for i, f in enumerate(found) if f is None]
        if missing:
            with self.device.autocast():
                fresh = prefix_states(model, ids[missing].to(self.device.device), mask[missing].to(self.device.device),
                                      self.k).float()
            for j, i in enumerate(missing):
                found[i] = fresh[j, :lengths[i]].cpu()
        states = torch.zeros(ids.shape[0], ids.shape[1], found[0].shape[-1])
        for i, rows in enumerate(found):
            states[i, :rows.shape[0]] = rows
        return {"inputs_embeds": states, "attention_mask": mask, "labels": batch["labels"]}
