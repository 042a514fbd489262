"""A model any `transformers` user can load: the NKB merged into T5's own feed-forward layers.

A slot is one more FFN neuron (`nkb_model.nkb`): its keys are one more row of `wi` (or of `wi_0` and `wi_1`
on a gated FFN), its value one more column of `wo`. So the slots merge into a stock `T5ForConditionalGeneration`
whose `d_ff` grows by the slot count. T5 has one `d_ff` for every block: blocks without slots get zero rows and
columns, and a zero neuron adds exactly nothing (act(0) = 0 for ReLU and GELU, and its value is zero anyway).
The merged model computes the same function; only the order of fp32 additions in `wo` differs.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import T5ForConditionalGeneration

from nkb_model.mounting import block_stack, is_gated
from nkb_model.nkb import mounted_layers


def merge_nkb(model: T5ForConditionalGeneration) -> T5ForConditionalGeneration:
    """A new stock T5 with `model`'s NKB slots as extra FFN neurons (`model` is left as it is)."""
    if hasattr(model, "kformer"):
        raise ValueError("a Kformer model reads retrieved documents at run time: it has no stock T5 form")
    slots = mounted_layers(model)
    if not slots:
        raise ValueError("the model has no NKB slots to merge")
    extra = next(iter(slots.values())).nkb_values.in_features
    config = copy.deepcopy(model.config)
    config.d_ff = model.config.d_ff + extra
    merged = T5ForConditionalGeneration(config).to(model.dtype).eval()
    state = {name.replace(".base_layer.", "."): tensor for name, tensor in model.state_dict().items()
             if ".nkb_" not in name}
    for side in ("encoder", "decoder"):
        for index, block in enumerate(block_stack(model, side)):
            ffn = block.layer[-1].DenseReluDense
            nkb = slots.get(f"{side}.{index}")
            base = ffn.base_layer if nkb is not None else ffn
            prefix = f"{side}.block.{index}.layer.{len(block.layer) - 1}.DenseReluDense."
            for key_name, slot_keys in _key_maps(base, nkb).items():
                state[prefix + key_name + ".weight"] = _rows(getattr(base, key_name).weight, slot_keys, extra)
            values = nkb.nkb_values.weight if nkb is not None else None
            state[prefix + "wo.weight"] = _rows(base.wo.weight.T, None if values is None else values.T, extra).T
    merged.load_state_dict(state, strict=True)
    merged.generation_config = copy.deepcopy(model.generation_config)
    return merged


def _key_maps(base: nn.Module, nkb) -> dict[str, torch.Tensor | None]:
    """{FFN input map: the slots' rows for it (None: zero rows)}."""
    if is_gated(base):
        if nkb is not None and not nkb.gated:
            raise ValueError("these slots are ungated on a gated FFN (saved before slots followed the FFN): they "
                             "are not extra FFN neurons and cannot be merged; export them with --adapter")
        return {"wi_0": nkb and nkb.nkb_keys.weight, "wi_1": nkb and nkb.nkb_keys_linear.weight}
    return {"wi": nkb and nkb.nkb_keys.weight}


def _rows(weight: torch.Tensor, slot_rows: torch.Tensor | None, extra: int) -> torch.Tensor:
    """`weight` (d_ff x d_model) with the slots' rows below it, or `extra` zero rows."""
    below = slot_rows if slot_rows is not None else weight.new_zeros(extra, weight.shape[1])
    return torch.cat([weight.detach(), below.detach().to(weight.dtype)]).contiguous()
