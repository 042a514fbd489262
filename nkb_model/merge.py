"""A model any `transformers` user can load: the NKB merged into the model's own feed-forward layers.

A slot is one more FFN neuron (`nkb_model.nkb`): its keys are one more row of each input map (`wi`, or `wi_0`
and `wi_1`; `c_fc`; `gate_proj` and `up_proj`), with its bias where the map has one, and its value one more
column of the output map. So the slots merge into a stock model of the same class whose FFN width (T5's `d_ff`,
GPT-2's `n_inner`, Llama's `intermediate_size`) grows by the slot count. Slots with a key bias on an FFN whose maps
have none (`NKBConfig.key_bias`) turn the maps' biases on where the family has the switch (Llama's `mlp_bias`),
every bias but the slots' zero. The width is one for every block:
blocks without slots get zero rows and columns, and a zero neuron adds exactly nothing (act(0) = 0 for ReLU,
GELU and SiLU, and its value is zero anyway). The merged model computes the same function; only the order of
additions in the output map differs.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from nkb_model.mounting import block_names, ffn_maps, ffn_path, get_ffn, key_layer, rows
from nkb_model.nkb import NKBFeedForward, mounted_layers

WIDTH_FIELDS = ("d_ff", "intermediate_size", "n_inner")  # the config field of the FFN width, per family


def merge_nkb(model: nn.Module) -> nn.Module:
    """A new stock model with `model`'s NKB slots as extra FFN neurons (`model` is left as it is)."""
    if hasattr(model, "kformer"):
        raise ValueError("a Kformer model reads retrieved documents at run time: it has no stock form")
    slots = mounted_layers(model)
    if not slots:
        raise ValueError("the model has no NKB slots to merge")
    extra = next(iter(slots.values())).nkb_values.in_features
    config = copy.deepcopy(model.config)
    field = next(f for f in WIDTH_FIELDS if hasattr(config, f))
    width = getattr(config, field) or 4 * config.hidden_size  # GPT-2's n_inner None means 4 x n_embd
    setattr(config, field, width + extra)
    bias_on = any(nkb.nkb_keys.bias is not None and getattr(key_layer(nkb.base_layer), "bias", None) is None
                  for nkb in slots.values())
    if bias_on:
        if not hasattr(config, "mlp_bias"):
            raise ValueError(f"these slots have a key bias and {type(model).__name__}'s FFN has no bias to hold it: "
                             "export them with --adapter")
        config.mlp_bias = True
    merged = type(model)(config).to(model.dtype).eval()
    biases = {name: tensor for name, tensor in merged.state_dict().items() if name.endswith(".bias")}
    state = {name.replace(".base_layer.", "."): tensor for name, tensor in model.state_dict().items()
             if ".nkb_" not in name}
    for name in block_names(model):
        ffn = get_ffn(model, name)
        nkb = slots.get(name)
        base = ffn.base_layer if nkb is not None else ffn
        prefix = ffn_path(model, name) + "."
        for map_name, slot_map in _key_maps(base, nkb).items():
            layer = getattr(base, map_name)
            slot_weight, slot_bias = (slot_map.weight, slot_map.bias) if slot_map is not None else (None, None)
            state[prefix + map_name + ".weight"] = _stored(layer, _below(rows(layer), slot_weight, extra))
            if prefix + map_name + ".bias" in biases:
                bias = layer.bias if getattr(layer, "bias", None) is not None else layer.weight.new_zeros(width)
                state[prefix + map_name + ".bias"] = _below(bias[:, None],
                                                            None if slot_bias is None else slot_bias[:, None], extra)[:, 0]
        value = getattr(base, ffn_maps(base).value)
        slot_values = nkb.nkb_values.weight.T if nkb is not None else None
        state[prefix + ffn_maps(base).value + ".weight"] = _stored(value, _below(rows(value).T, slot_values, extra).T)
    if bias_on:  # the maps' new biases the slots' rows did not fill
        state |= {name: torch.zeros_like(bias) for name, bias in biases.items() if name not in state}
    merged.load_state_dict(state, strict=True)
    merged.generation_config = copy.deepcopy(model.generation_config)
    return merged


def _key_maps(base: nn.Module, nkb: NKBFeedForward | None) -> dict[str, nn.Linear | None]:
    """{FFN input map's name: the slots' map for it (None: zero rows)}."""
    maps = ffn_maps(base)
    if maps.linear is None:
        return {maps.key: nkb and nkb.nkb_keys}
    if nkb is not None and not nkb.gated:
        raise ValueError("these slots are ungated on a gated FFN (saved before slots followed the FFN): they "
                         "are not extra FFN neurons and cannot be merged; export them with --adapter")
    return {maps.key: nkb and nkb.nkb_keys, maps.linear: nkb and nkb.nkb_keys_linear}


def _stored(layer: nn.Module, weight: torch.Tensor) -> torch.Tensor:
    """A weight in (out, in) back in the layer's own orientation (GPT-2's Conv1D holds it transposed)."""
    return (weight if isinstance(layer, nn.Linear) else weight.T).contiguous()


def _below(weight: torch.Tensor, slot_rows: torch.Tensor | None, extra: int) -> torch.Tensor:
    """`weight` (width x d) with the slots' rows below it, or `extra` zero rows."""
    below = slot_rows if slot_rows is not None else weight.new_zeros(extra, weight.shape[1])
    return torch.cat([weight.detach(), below.detach().to(weight.dtype)])
