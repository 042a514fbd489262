"""The Neural Knowledge Bank, mounted on a Hugging Face T5 — not a fork of it.

T5's feed-forward block is `T5LayerFF`: layer_norm → DenseReluDense → dropout → residual add, where
DenseReluDense is `T5DenseActDense` (wi → act → dropout → wo) or `T5DenseGatedActDense`
(act(wi_0 x) * wi_1 x → dropout → wo). Read as a key-value memory (Geva et al.), `wi` holds keys and
`wo` values. The NKB adds `slots` more key-value pairs beside them, with the FFN's own architecture:

    FFN'(x) = FFN(x) + nkb_values(act(nkb_keys(x)))                           on T5DenseActDense
    FFN'(x) = FFN(x) + nkb_values(act(nkb_keys(x)) * nkb_keys_linear(x))      on T5DenseGatedActDense

so that a slot is exactly one more FFN neuron (row of `wi`/`wi_0` and `wi_1`, column of `wo`): merging the
slots into the FFN (`nkb_model.export`) gives the same function. It sits inside the same residual branch
(same layer norm, same outer dropout), with no dropout of its own by default. `NKBFeedForward` wraps the
original module as `base_layer` and is swapped in with `setattr`, so T5's code is untouched and unmounting
restores the original object.

T5's rules carry over: keys are initialised like `wi` (std d_model^-0.5), values like `wo`
(std d_ff^-0.5, here slots^-0.5), injection keeps every slot within the FFN's own scale
(`bound_to_ffn_scale`), and values keep the dtype of `wo`, which T5 keeps in fp32 under
bf16 (`_keep_in_fp32_modules`), casting the activations to it first. With zero values the model's
outputs are bit-identical to the base model's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from nkb_model.mounting import (FeedForwardAddition, ffn_block, is_gated, key_layer, load_weights_exactly, mounted,
                                resolve_layers, restore, save_addition)

NKB_PREFIX = "nkb_"
WEIGHTS_FILE = "nkb.safetensors"
CONFIG_FILE = "nkb_config.json"


@dataclass
class NKBConfig:
    layers: list[str] = field(default_factory=lambda: ["decoder.-1"])  # "encoder.N" / "decoder.N", N may be negative
    slots: int | None = None          # default: the FFN width d_ff
    dropout: float = 0.0              # dropout on the slot weights (the paper uses none)
    zero_values: bool = False         # start as an exact no-op (outputs bit-identical to the base)
    gated: bool | None = None         # gated like the FFN; default: as the FFN is. Slots saved before this
                                      # setting existed are ungated (`load_nkb`)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


class NKBFeedForward(FeedForwardAddition):
    """T5's DenseReluDense plus NKB slots: `base_layer(x) + nkb_values(slot_weights(x))`."""

    def __init__(self, base_layer: nn.Module, slots: int, dropout: float = 0.0, zero_values: bool = False,
                 gated: bool = False):
        super().__init__(base_layer)
        if gated and not is_gated(base_layer):
            raise ValueError("gated NKB slots need a gated FFN (wi_0, wi_1); this one has a single wi")
        self.nkb_keys = self.linear(self.d_model, slots, like=key_layer(base_layer))
        self.nkb_keys_linear = self.linear(self.d_model, slots, like=base_layer.wi_1) if gated else None
        self.nkb_dropout = nn.Dropout(dropout)
        self.nkb_values = self.linear(slots, self.d_model, like=base_layer.wo)
        self.init_key_values(self.nkb_keys, self.nkb_values, slots ** -0.5, zero_values)
        if gated:  # like T5's wi_1: std d_model^-0.5
            nn.init.normal_(self.nkb_keys_linear.weight, 0.0, self.d_model ** -0.5)

    @property
    def gated(self) -> bool:
        return self.nkb_keys_linear is not None

    def slot_weights(self, x: torch.Tensor) -> torch.Tensor:
        """How strongly each slot fires, shape (batch, seq, slots): act(x · keysᵀ), times x · keys_linearᵀ when
        gated (as T5 v1.1 weighs its neurons)."""
        weights = self.act(self.nkb_keys(x))
        return weights * self.nkb_keys_linear(x) if self.gated else weights

    @torch.no_grad()
    def bound_to_ffn_scale(self, ratio: float = 1.0) -> None:
        """Shrink every slot whose key, gate or value is longer than `ratio` times the FFN's longest neuron's back to
        that length (direction kept). Unbounded, injection grows slots far beyond the FFN's neurons, and a slot
        that writes thousands of times what a neuron writes takes over the model wherever it fires a little."""
        def bound(weight: torch.Tensor, reference: torch.Tensor, dim: int) -> None:
            limit = ratio * reference.norm(dim=dim).max()
            weight.mul_((limit / weight.norm(dim=dim, keepdim=True).clamp_min(1e-12)).clamp(max=1))
        bound(self.nkb_keys.weight, key_layer(self.base_layer).weight, 1)        # rows: one key per slot
        if self.gated:
            bound(self.nkb_keys_linear.weight, self.base_layer.wi_1.weight, 1)
        bound(self.nkb_values.weight, self.base_layer.wo.weight, 0)              # columns: one value per slot

    def forward(self, x: torch.Tensor) -> torch.Tensor:     # x: (batch, seq, d_model), already layer-normed
        out = self.base_layer(x)                              # (batch, seq, d_model)
        weights = self.nkb_dropout(self.slot_weights(x))      # (batch, seq, slots)
        if weights.dtype != self.nkb_values.weight.dtype:     # T5's fp32-`wo` rule, for the values too
            weights = weights.to(self.nkb_values.weight.dtype)
        return out + self.nkb_values(weights).to(out.dtype)


# ---- mounting --------------------------------------------------------------------------------

def mount_nkb(model: nn.Module, config: NKBConfig | None = None) -> list[str]:
    """Mount NKB slots on the given layers' FFNs (in place); returns the canonical layer names."""
    config = config or NKBConfig()
    names = resolve_layers(model, config.layers)
    slots = config.slots or model.config.d_ff
    gated = config.gated if config.gated is not None else is_gated(ffn_block(model, names[0]).DenseReluDense)
    for name in names:
        parent = ffn_block(model, name)
        if isinstance(parent.DenseReluDense, NKBFeedForward):
            raise ValueError(f"{name} already has an NKB mounted")
        parent.DenseReluDense = NKBFeedForward(parent.DenseReluDense, slots, config.dropout, config.zero_values, gated)
    model.nkb_config = NKBConfig(layers=names, slots=slots, dropout=config.dropout, zero_values=config.zero_values,
                                 gated=gated)
    return names


def mounted_layers(model: nn.Module) -> dict[str, NKBFeedForward]:
    return mounted(model, NKBFeedForward)


def unmount_nkb(model: nn.Module) -> dict[str, torch.Tensor]:
    """Put the original FFN modules back; returns the removed NKB weights."""
    removed = nkb_state_dict(model)
    restore(model, NKBFeedForward)
    if hasattr(model, "nkb_config"):
        del model.nkb_config
    return removed


def nkb_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    return ((n, p) for n, p in model.named_parameters() if n.rsplit(".", 2)[-2].startswith(NKB_PREFIX))


def nkb_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in nkb_parameters(model)}


def mark_only_nkb_trainable(model: nn.Module) -> int:
    """Freeze everything but the NKB; returns the number of trainable parameters."""
    for name, param in model.named_parameters():
        param.requires_grad = name.rsplit(".", 2)[-2].startswith(NKB_PREFIX)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# ---- saving and loading, apart from the base ------------------------------------------------

def save_nkb(model: nn.Module, directory: str | Path) -> Path:
    return save_addition(nkb_state_dict(model), model.nkb_config.to_json(), directory, WEIGHTS_FILE, CONFIG_FILE)


def load_nkb(model: nn.Module, directory: str | Path) -> list[str]:
    """Mount an NKB saved by `save_nkb` on a base model and load its weights exactly."""
    directory = Path(directory)
    saved = json.loads((directory / CONFIG_FILE).read_text())
    saved.setdefault("gated", False)  # saved before slots followed a gated FFN: they were plain act(keys x)
    names = mount_nkb(model, NKBConfig(**saved))
    load_nkb_weights(model, directory)
    return names


def load_nkb_weights(model: nn.Module, directory: str | Path) -> None:
    """Copy saved slots into the NKB already mounted on `model` (same layers and slot counts): a knowledge
    refresh starting from the previous injection's slots."""
    load_weights_exactly(dict(nkb_parameters(model)), Path(directory) / WEIGHTS_FILE, "NKB")
