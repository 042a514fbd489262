"""Mounting extra key-value pairs on T5's feed-forward blocks, the way PEFT mounts adapters.

T5's FFN sits in `T5LayerFF.DenseReluDense`, always the last layer of a `T5Block`. A wrapper (the NKB's
`NKBFeedForward`, Kformer's `KformerFeedForward`) keeps the original module as `base_layer`, adds its own
named weights and returns `base_layer(x) + delta`; it is swapped in with `setattr` on the `T5LayerFF`, so
T5's code is untouched and unmounting puts the original object back. Blocks are named `encoder.N` /
`decoder.N`; N may be negative. The added weights are saved apart from T5's (`save_addition`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)


def block_stack(model: nn.Module, side: str) -> nn.ModuleList:
    """The encoder's or the decoder's list of T5 blocks."""
    part = {"encoder": getattr(model, "encoder", None), "decoder": getattr(model, "decoder", None)}.get(side)
    if part is None:
        raise ValueError(f"layer spec must start with 'encoder' or 'decoder', got {side!r}")
    return part.block


def resolve_layers(model: nn.Module, specs: list[str]) -> list[str]:
    """Canonical names ("decoder.5") for specs such as "decoder.-1", "encoder.0", "decoder.block.3"."""
    names = []
    for spec in specs:
        m = re.fullmatch(r"(encoder|decoder)\.(?:block\.)?(-?\d+)", spec.strip())
        if not m:
            raise ValueError(f"bad layer spec {spec!r}; use e.g. 'decoder.-1' or 'encoder.3'")
        blocks = block_stack(model, m.group(1))
        index = int(m.group(2))
        if not -len(blocks) <= index < len(blocks):
            raise ValueError(f"{spec!r}: the {m.group(1)} has {len(blocks)} blocks")
        names.append(f"{m.group(1)}.{index % len(blocks)}")
    return list(dict.fromkeys(names))


def ffn_block(model: nn.Module, name: str) -> nn.Module:
    """The `T5LayerFF` of block `name` (canonical); its `DenseReluDense` is what wrappers replace."""
    side, index = name.split(".")
    return block_stack(model, side)[int(index)].layer[-1]


def is_gated(ffn: nn.Module) -> bool:
    """Whether a T5 FFN is gated (`T5DenseGatedActDense`: act(wi_0 x) * wi_1 x) rather than act(wi x)."""
    return hasattr(ffn, "wi_0")


def key_layer(ffn: nn.Module) -> nn.Linear:
    """The FFN's input projection: `wi`, or for a gated FFN the gate `wi_0` (it decides whether a neuron fires)."""
    return ffn.wi_0 if is_gated(ffn) else ffn.wi


class FeedForwardAddition(nn.Module):
    """Base of the wrappers: T5's FFN kept as `base_layer`, its activation as `act`; the subclass adds its key and
    value maps with `linear` and initialises them with `init_key_values`, following T5's rules."""

    def __init__(self, base_layer: nn.Module):
        super().__init__()
        self.base_layer = base_layer
        self.act = base_layer.act

    @property
    def d_model(self) -> int:
        return key_layer(self.base_layer).in_features

    @staticmethod
    def linear(n_in: int, n_out: int, like: nn.Linear) -> nn.Linear:
        """A bias-free map on the device and in the dtype of the FFN's `like` (wi for keys, wo for values)."""
        return nn.Linear(n_in, n_out, bias=False, device=like.weight.device, dtype=like.weight.dtype)

    @staticmethod
    @torch.no_grad()
    def init_key_values(keys: nn.Linear, values: nn.Linear, value_std: float, zero_values: bool) -> None:
        """Keys like T5's `wi` (std d_model^-0.5); values like `wo` (std `value_std`), or zero: an exact no-op."""
        keys.weight.normal_(0.0, keys.in_features ** -0.5)
        if zero_values:
            values.weight.zero_()
        else:
            values.weight.normal_(0.0, value_std)


def mounted(model: nn.Module, wrapper: type[M]) -> dict[str, M]:
    """{block name: wrapper} for every block whose FFN is wrapped by `wrapper`."""
    out = {}
    for side in ("encoder", "decoder"):
        for i, block in enumerate(block_stack(model, side)):
            ffn = block.layer[-1].DenseReluDense
            if isinstance(ffn, wrapper):
                out[f"{side}.{i}"] = ffn
    return out


def restore(model: nn.Module, wrapper: type[nn.Module]) -> None:
    """Put the original FFN back wherever `wrapper` is mounted."""
    for name, ffn in mounted(model, wrapper).items():
        ffn_block(model, name).DenseReluDense = ffn.base_layer


def save_addition(state: dict[str, torch.Tensor], config_json: str, directory: str | Path, weights_file: str,
                  config_file: str) -> Path:
    """Write an addition's weights (safetensors) and its config, nothing of the base model."""
    from safetensors.torch import save_file
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({n: t.contiguous() for n, t in state.items()}, str(directory / weights_file))
    (directory / config_file).write_text(config_json)
    return directory


def load_weights_exactly(params: dict[str, nn.Parameter], path: Path, what: str) -> None:
    """Copy a safetensors file into freshly mounted parameters; the names must match one to one."""
    from safetensors.torch import load_file
    weights = load_file(str(path))
    if set(weights) != set(params):
        raise ValueError(f"{path.parent}: {what} weights do not match the mounted layers "
                         f"(file has {sorted(weights)[:3]}..., model expects {sorted(params)[:3]}...)")
    for name, tensor in weights.items():
        if tensor.shape != params[name].shape:
            raise ValueError(f"{path.parent}: {what} weight {name} is {tuple(tensor.shape)}, the mounted layer's "
                             f"{tuple(params[name].shape)} (another slot count?)")
    with torch.no_grad():
        for name, tensor in weights.items():
            params[name].copy_(tensor)
