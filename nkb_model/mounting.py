"""Mounting extra key-value pairs on a transformer's feed-forward blocks, the way PEFT mounts adapters.

A wrapper (the NKB's `NKBFeedForward`, Kformer's `KformerFeedForward`) keeps the original FFN module as
`base_layer`, adds its own named weights and returns `base_layer(x) + delta`; it is swapped in with `setattr`
on the FFN's parent, so the model's code is untouched and unmounting puts the original object back. The added
weights are saved apart from the model's (`save_addition`).

Each architecture's record (`nkb_model.architectures`) says where it keeps its FFNs (its `Layout`), and
a small table here what their maps are called (`FFN_MAPS`):
- T5: blocks `encoder.block[N]`, `decoder.block[N]` (named `encoder.N`, `decoder.N`), FFN `layer[-1].DenseReluDense`
  with maps `wi` → act (ReLU) → `wo`, or gated (v1.1) act(`wi_0`) * `wi_1` → `wo`.
- GPT-2: blocks `transformer.h[N]` (`h.N`), FFN `mlp`: `c_fc` → act (GELU) → `c_proj`, both Conv1D with biases.
- Llama-style (Llama, Mistral, Qwen2, Gemma, ...): blocks `model.layers[N]` (`layers.N`), FFN `mlp`:
  act_fn(`gate_proj`) * `up_proj` → `down_proj`.
N may be negative, or a share of the depth (`decoder.33%`). A decoder-only model's blocks also answer to
`decoder.N`, so a spec such as the default `decoder.-1` (the last block) means the same on every family. GPT-2's
Conv1D keeps its weight transposed (in, out); `rows()` reads any map as `nn.Linear` does (out, in).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn

from nkb_model.architectures import ARCHITECTURES, LAYER_SPEC, Architecture, Layout

M = TypeVar("M", bound=nn.Module)


@dataclass(frozen=True)
class FFNMaps:
    """The attribute names of an FFN's maps: `key` (the input map; a gated FFN's gate, which decides whether a
    neuron fires), `linear` (a gated FFN's other input map; None when ungated), `value` (the output map) and its
    activation."""
    key: str
    linear: str | None
    value: str
    act: str


FFN_MAPS = [FFNMaps("wi_0", "wi_1", "wo", "act"), FFNMaps("wi", None, "wo", "act"),
            FFNMaps("gate_proj", "up_proj", "down_proj", "act_fn"), FFNMaps("c_fc", None, "c_proj", "act")]


def _attribute(root: nn.Module, path: str):
    for part in path.split("."):
        root = root[int(part)] if part.lstrip("-").isdigit() else getattr(root, part, None)
        if root is None:
            return None
    return root


def architecture_of(model: nn.Module) -> Architecture:
    """The record of the model's architecture, found by where it keeps its blocks, or an error naming its class."""
    for candidate in ARCHITECTURES.values():
        if all(isinstance(_attribute(model, path), nn.ModuleList) for path in candidate.layout.stacks.values()):
            return candidate
    raise ValueError(f"{type(model).__name__}: not a supported model (supported: "
                     f"{', '.join(a.title for a in ARCHITECTURES.values())})")


def layout(model: nn.Module) -> Layout:
    """Where the model keeps its blocks and FFNs."""
    return architecture_of(model).layout


def ffn_maps(ffn: nn.Module) -> FFNMaps:
    """The names of `ffn`'s maps, or an error naming its class."""
    for maps in FFN_MAPS:
        if all(hasattr(ffn, a) for a in (maps.key, maps.linear or maps.key, maps.value, maps.act)):
            return maps
    raise ValueError(f"{type(ffn).__name__}: not a supported feed-forward block (supported: T5's DenseActDense and "
                     f"GatedActDense, GPT-2's MLP (c_fc, c_proj), Llama-style gated MLPs (gate_proj, up_proj, "
                     f"down_proj))")


def rows(layer: nn.Module) -> torch.Tensor:
    """A map's weight as `nn.Linear` holds it, (out, in); GPT-2's Conv1D holds it transposed."""
    return layer.weight if isinstance(layer, nn.Linear) else layer.weight.T


def _canonical_side(model: nn.Module, side: str) -> str:
    """The model's own name for the list of blocks `side` names: "decoder" is a decoder-only model's one list."""
    found = layout(model)
    if side == "decoder" and side not in found.stacks:
        side = next(iter(found.stacks))
    if side not in found.stacks:
        raise ValueError(f"a {type(model).__name__}'s layers are named {' or '.join(f'{s}.N' for s in found.stacks)}"
                         f"{' (or decoder.N)' if 'decoder' not in found.stacks else ''}, not {side}.N")
    return side


def block_stack(model: nn.Module, side: str) -> nn.ModuleList:
    """The list of blocks named `side` ("encoder", "decoder", "h", "layers"); on a decoder-only model "decoder"
    is its one list."""
    return _attribute(model, layout(model).stacks[_canonical_side(model, side)])


def resolve_layers(model: nn.Module, specs: list[str]) -> list[str]:
    """Canonical names ("decoder.5", "layers.3") for specs such as "decoder.-1", "encoder.0", "decoder.block.3" and
    "decoder.33%" (the block nearest that share of the stack's depth: on 30 blocks block 10, on 24 block 8)."""
    found = layout(model)
    names = []
    for spec in specs:
        m = re.fullmatch(LAYER_SPEC, spec.strip())
        if not m:
            raise ValueError(f"bad layer spec {spec!r}; use e.g. "
                             f"{' or '.join(repr(s + '.-1') for s in found.stacks)}, or a share of the depth "
                             f"({next(iter(found.stacks))}.50%)")
        side = _canonical_side(model, m.group(1))
        blocks = block_stack(model, side)
        index = int(m.group(2)) if m.group(2) is not None else depth_index(float(m.group(3)), len(blocks), spec)
        if not -len(blocks) <= index < len(blocks):
            raise ValueError(f"{spec!r}: the {side} has {len(blocks)} blocks")
        names.append(f"{side}.{index % len(blocks)}")
    return list(dict.fromkeys(names))


def depth_index(percent: float, blocks: int, spec: str) -> int:
    """The block nearest `percent` % of the way up a stack of `blocks` (100 %: the last)."""
    if percent > 100:
        raise ValueError(f"{spec!r}: a share of the depth is at most 100%")
    return min(round(percent / 100 * blocks), blocks - 1)


def final_norm(model: nn.Module) -> nn.Module:
    """The norm every block's output goes through before the output embedding."""
    return _attribute(model, layout(model).final_norm)


def block_names(model: nn.Module) -> list[str]:
    """Every block's canonical name, in order."""
    return [f"{side}.{i}" for side in layout(model).stacks for i in range(len(block_stack(model, side)))]


def block(model: nn.Module, name: str) -> nn.Module:
    """Block `name` (canonical) itself: its output is the residual stream after it."""
    side, index = name.split(".")
    return block_stack(model, side)[int(index)]


def _ffn_parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    *parent, attr = layout(model).ffn.split(".")
    return _attribute(block(model, name), ".".join(parent)) if parent else block(model, name), attr


def get_ffn(model: nn.Module, name: str) -> nn.Module:
    """The FFN module of block `name` (canonical), a wrapper where one is mounted."""
    parent, attr = _ffn_parent(model, name)
    return getattr(parent, attr)


def set_ffn(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, attr = _ffn_parent(model, name)
    setattr(parent, attr, module)


def ffn_path(model: nn.Module, name: str) -> str:
    """The dotted module path of block `name`'s FFN, as the model's state dict names it."""
    for path, module in model.named_modules():
        if module is get_ffn(model, name):
            return path
    raise ValueError(f"{name}: no FFN found")


def is_gated(ffn: nn.Module) -> bool:
    """Whether an FFN is gated (act(gate x) * linear x, T5 v1.1 and Llama-style) rather than act(key x)."""
    return ffn_maps(ffn).linear is not None


def key_layer(ffn: nn.Module) -> nn.Module:
    """The FFN's input map (`wi`, `c_fc`), or for a gated FFN the gate (`wi_0`, `gate_proj`)."""
    return getattr(ffn, ffn_maps(ffn).key)


def linear_layer(ffn: nn.Module) -> nn.Module | None:
    """A gated FFN's other input map (`wi_1`, `up_proj`); None when ungated."""
    maps = ffn_maps(ffn)
    return getattr(ffn, maps.linear) if maps.linear else None


def value_layer(ffn: nn.Module) -> nn.Module:
    """The FFN's output map (`wo`, `c_proj`, `down_proj`)."""
    return getattr(ffn, ffn_maps(ffn).value)


class FeedForwardAddition(nn.Module):
    """Base of the wrappers: the FFN kept as `base_layer`, its activation as `act`; the subclass adds its key and
    value maps with `linear` and initialises them with `init_key_values`, following T5's rules."""

    def __init__(self, base_layer: nn.Module):
        super().__init__()
        self.base_layer = base_layer
        self.act = getattr(base_layer, ffn_maps(base_layer).act)

    @property
    def d_model(self) -> int:
        return rows(key_layer(self.base_layer)).shape[1]

    @staticmethod
    def linear(n_in: int, n_out: int, like: nn.Module, bias: bool = False) -> nn.Linear:
        """A map on the device and in the dtype of the FFN's `like` (its key map for keys, value map for values)."""
        return nn.Linear(n_in, n_out, bias=bias, device=like.weight.device, dtype=like.weight.dtype)

    @staticmethod
    @torch.no_grad()
    def init_key_values(keys: nn.Linear, values: nn.Linear, value_std: float, zero_values: bool) -> None:
        """Keys like T5's `wi` (std d_model^-0.5, bias zero); values like `wo` (std `value_std`), or zero: an exact
        no-op."""
        keys.weight.normal_(0.0, keys.in_features ** -0.5)
        if keys.bias is not None:
            keys.bias.zero_()
        if zero_values:
            values.weight.zero_()
        else:
            values.weight.normal_(0.0, value_std)


def mounted(model: nn.Module, wrapper: type[M]) -> dict[str, M]:
    """{block name: wrapper} for every block whose FFN is wrapped by `wrapper`."""
    return {name: ffn for name in block_names(model) if isinstance(ffn := get_ffn(model, name), wrapper)}


def restore(model: nn.Module, wrapper: type[nn.Module]) -> None:
    """Put the original FFN back wherever `wrapper` is mounted."""
    for name, ffn in mounted(model, wrapper).items():
        set_ffn(model, name, ffn.base_layer)


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
