"""The Neural Knowledge Bank, mounted on a Hugging Face model's feed-forward layers — not a fork of it.

Read as a key-value memory (Geva et al.), an FFN's input map holds keys and its output map values. The NKB
adds `slots` more key-value pairs beside them, with the FFN's own architecture (`nkb_model.mounting` lists
the families and their maps):

    FFN'(x) = FFN(x) + nkb_values(act(nkb_keys(x)))                        ungated: T5 (wi, wo), GPT-2 (c_fc, c_proj)
    FFN'(x) = FFN(x) + nkb_values(act(nkb_keys(x)) * nkb_keys_linear(x))   gated: T5 v1.1 (wi_0, wi_1, wo), Llama-
                                                                           style (gate_proj, up_proj, down_proj)

so that a slot is exactly one more FFN neuron (a row of each input map, with its bias where the FFN's map has
one, and a column of the output map): merging the slots into the FFN (`nkb_model.merge`) gives the same
function. It sits inside the same residual branch (on T5 the same layer norm and outer dropout; on GPT-2 after
the MLP's own output dropout), with no dropout of its own by default. `NKBFeedForward` wraps the original module
as `base_layer` and is swapped in with `setattr`, so the model's code is untouched and unmounting restores the
original object.

T5's rules carry over to every family: keys are initialised with std d_model^-0.5, values with std slots^-0.5
(T5's wo: d_ff^-0.5), injection keeps every slot within the FFN's own scale (`bound_to_ffn_scale`), and values
keep the dtype of the output map, which T5 keeps in fp32 under bf16 (`_keep_in_fp32_modules`), casting the
activations to it first. With zero values the model's outputs are bit-identical to the base model's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from nkb_model.mounting import (FeedForwardAddition, get_ffn, is_gated, key_layer, linear_layer, load_weights_exactly,
                                mounted, resolve_layers, restore, rows, save_addition, set_ffn, value_layer)

NKB_PREFIX = "nkb_"
WEIGHTS_FILE = "nkb.safetensors"
CONFIG_FILE = "nkb_config.json"


@dataclass
class NKBConfig:
    layers: list[str] = field(default_factory=lambda: ["decoder.-1"])  # "encoder.N" / "decoder.N" / "layers.N" /
                                      # "h.N" (mounting's table), N may be negative; decoder.N on any model
    slots: int | None = None          # default: the FFN width (d_ff, intermediate_size, n_inner)
    dropout: float = 0.0              # dropout on the slot weights (the paper uses none)
    zero_values: bool = False         # start as an exact no-op (outputs bit-identical to the base)
    gated: bool | None = None         # gated like the FFN; default: as the FFN is. Slots saved before this
                                      # setting existed are ungated (`load_nkb`)
    key_bias: float | None = None     # each slot's key score starts at this learned bias (negative: the slot is
                                      # quiet unless its key matches); None: a bias only where the FFN's map has one

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


class NKBFeedForward(FeedForwardAddition):
    """An FFN plus NKB slots: `base_layer(x) + nkb_values(slot_weights(x))`."""

    def __init__(self, base_layer: nn.Module, slots: int, dropout: float = 0.0, zero_values: bool = False,
                 gated: bool = False, key_bias: float | None = None):
        super().__init__(base_layer)
        if gated and not is_gated(base_layer):
            raise ValueError(f"gated NKB slots need a gated FFN; this {type(base_layer).__name__} has one input map")
        key, linear = key_layer(base_layer), linear_layer(base_layer)
        self.nkb_keys = self.linear(self.d_model, slots, like=key,
                                    bias=key_bias is not None or getattr(key, "bias", None) is not None)
        self.nkb_keys_linear = self.linear(self.d_model, slots, like=linear, bias=linear.bias is not None) \
            if gated else None
        self.nkb_dropout = nn.Dropout(dropout)
        self.nkb_values = self.linear(slots, self.d_model, like=value_layer(base_layer))
        self.init_key_values(self.nkb_keys, self.nkb_values, slots ** -0.5, zero_values)
        if key_bias is not None:
            nn.init.constant_(self.nkb_keys.bias, key_bias)
        if gated:  # like T5's wi_1: std d_model^-0.5
            nn.init.normal_(self.nkb_keys_linear.weight, 0.0, self.d_model ** -0.5)
            if self.nkb_keys_linear.bias is not None:
                nn.init.zeros_(self.nkb_keys_linear.bias)

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
        bound(self.nkb_keys.weight, rows(key_layer(self.base_layer)), 1)         # rows: one key per slot
        if self.gated:
            bound(self.nkb_keys_linear.weight, rows(linear_layer(self.base_layer)), 1)
        bound(self.nkb_values.weight, rows(value_layer(self.base_layer)), 0)     # columns: one value per slot

    def forward(self, x: torch.Tensor) -> torch.Tensor:     # x: (batch, seq, d_model), already layer-normed
        out = self.base_layer(x)                              # (batch, seq, d_model)
        return out + self.addition(x).to(out.dtype)

    def addition(self, x: torch.Tensor) -> torch.Tensor:
        """What the slots add to the FFN's output, (batch, seq, d_model), in the values' dtype."""
        weights = self.nkb_dropout(self.slot_weights(x))      # (batch, seq, slots)
        if weights.dtype != self.nkb_values.weight.dtype:     # T5's fp32-`wo` rule, for the values too
            weights = weights.to(self.nkb_values.weight.dtype)
        return self.nkb_values(weights)


# ---- mounting --------------------------------------------------------------------------------

def mount_nkb(model: nn.Module, config: NKBConfig | None = None) -> list[str]:
    """Mount NKB slots on the given layers' FFNs (in place); returns the canonical layer names."""
    config = config or NKBConfig()
    names = resolve_layers(model, config.layers)
    for name in names:
        if isinstance(get_ffn(model, name), NKBFeedForward):
            raise ValueError(f"{name} already has an NKB mounted")
    first = get_ffn(model, names[0])
    slots = config.slots or rows(key_layer(first)).shape[0]
    gated = config.gated if config.gated is not None else is_gated(first)
    for name in names:
        set_ffn(model, name, NKBFeedForward(get_ffn(model, name), slots, config.dropout, config.zero_values, gated,
                                            config.key_bias))
    model.nkb_config = NKBConfig(layers=names, slots=slots, dropout=config.dropout, zero_values=config.zero_values,
                                 gated=gated, key_bias=config.key_bias)
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
