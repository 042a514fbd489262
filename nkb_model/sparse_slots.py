"""Sparse slot updates, as sparse memory fine-tuning makes them (Lin et al. 2025, arXiv 2510.15103): each step
changes only the slots most specific to its batch, so that what the other slots hold is left as it was.

A slot's specificity is TF-IDF-like: how strongly it fires on the step's batch (its mean activation magnitude over
the batch's tokens) against how strongly it fires on general text (measured once, before training, on general
batches). Sparse memory fine-tuning counts a memory layer's top-k lookups; NKB slots all fire a little, so their
activation stands in for the count. After each optimizer step every other slot of each block is put back exactly as
it was before the step (its key, gate, bias and value), so the optimizer's update reaches the chosen slots alone.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

from nkb_model.nkb import NKBFeedForward, mounted_layers


def _slot_weights(layer: NKBFeedForward) -> list[tuple[torch.Tensor, int]]:
    """Each of a layer's slot tensors with the dimension that indexes its slots."""
    maps = [(layer.nkb_keys.weight, 0), (layer.nkb_values.weight, 1)]
    if layer.nkb_keys.bias is not None:
        maps.append((layer.nkb_keys.bias, 0))
    if layer.gated:
        maps.append((layer.nkb_keys_linear.weight, 0))
        if layer.nkb_keys_linear.bias is not None:
            maps.append((layer.nkb_keys_linear.bias, 0))
    return maps


class SlotUse:
    """While installed, adds up how strongly each slot of each mounted block fires (|activation| summed over the
    tokens it sees, and the token count), from the slot weights that reach the NKB's dropout."""

    def __init__(self, model: nn.Module):
        self.layers = mounted_layers(model)
        self.total = {name: torch.zeros(layer.nkb_values.weight.shape[1]) for name, layer in self.layers.items()}
        self.tokens = {name: 0 for name in self.layers}
        self.handles = [layer.nkb_dropout.register_forward_hook(self._hook(name))
                        for name, layer in self.layers.items()]

    def _hook(self, name: str) -> Callable:
        def add(module, args, out) -> None:
            weights = args[0].detach()
            self.total[name] += weights.abs().float().sum(dim=tuple(range(weights.dim() - 1))).cpu()
            self.tokens[name] += weights[..., 0].numel()
        return add

    def mean(self) -> dict[str, torch.Tensor]:
        """Each block's mean activation magnitude per slot since the last `reset`."""
        return {name: self.total[name] / max(self.tokens[name], 1) for name in self.layers}

    def reset(self) -> None:
        for name in self.layers:
            self.total[name].zero_()
            self.tokens[name] = 0

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


@torch.no_grad()
def background_use(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], device,
                   forward: Callable | None = None) -> dict[str, torch.Tensor]:
    """Each slot's mean activation magnitude on `batches` of general text (the IDF side of the ranking), read as
    `forward` (default the model itself; the cached tail that training calls runs such batches whole) runs them."""
    use = SlotUse(model)
    try:
        for batch in batches:
            with device.autocast():
                (forward or model)(**{k: v.to(device.device) for k, v in batch.items()})
        return use.mean()
    finally:
        use.remove()


class SparseSlotUpdates:
    """Call `after_step()` after each optimizer step: every block keeps the update of its `keep` slots most specific
    to the step's batch (use on the batch over `background` use) and has the others' put back."""

    def __init__(self, model: nn.Module, keep: int, background: dict[str, torch.Tensor], floor: float = 1e-6):
        self.keep, self.background, self.floor = keep, background, floor
        self.use = SlotUse(model)
        self.before = self._snapshot()
        self.chosen: dict[str, torch.Tensor] = {}  # the last step's slots, per block (for tests and logs)

    def _snapshot(self) -> dict[str, list[torch.Tensor]]:
        return {name: [w.detach().clone() for w, _ in _slot_weights(layer)] for name, layer in self.use.layers.items()}

    def specific(self) -> dict[str, torch.Tensor]:
        """The `keep` slots of each block that fired most on the step's batch relative to general text."""
        return {name: torch.topk(use / (self.background[name] + self.floor),
                                 min(self.keep, use.numel())).indices for name, use in self.use.mean().items()}

    @torch.no_grad()
    def after_step(self) -> None:
        self.chosen = self.specific()
        for name, layer in self.use.layers.items():
            for (weight, dim), old in zip(_slot_weights(layer), self.before[name]):
                chosen = self.chosen[name].to(weight.device)
                kept = old.to(weight.device, weight.dtype)
                kept.index_copy_(dim, chosen, weight.index_select(dim, chosen))
                weight.copy_(kept)
        self.use.reset()
        self.before = self._snapshot()

    def remove(self) -> None:
        self.use.remove()
