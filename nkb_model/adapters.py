"""The field's other ways of training knowledge into the blocks that would hold NKB slots, for a like-for-like
comparison with them: LoRA adapters through PEFT on those blocks' feed-forward maps, and those maps' own weights
trained (the continued pretraining users do, on the same blocks).

Both train the FFN of the same blocks as the slots, so each route changes the same place in the model. At the
slots' default width (as many slots as the FFN has neurons) the FFN's own maps hold exactly as many parameters as
the slots; LoRA's rank sets its size (`matched_rank`: the rank at which it has as many).

A model trained this way is saved as what changed, beside its base's folder as slots are: PEFT's own adapter
folder (adapter_config.json, adapter_model.safetensors, loadable with `PeftModel.from_pretrained`, merged into the
base on loading here), or the trained maps' weights (blocks.safetensors), put over the base's on loading. The
methods that use these (`nkb_model.methods`) name the folders.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from nkb_model.mounting import ffn_maps, ffn_path, get_ffn, is_gated, key_layer, resolve_layers, rows

BLOCKS_FILE = "blocks.safetensors"


def ffn_map_names(model: nn.Module, layers: list[str]) -> list[str]:
    """The full module names of the feed-forward maps of the blocks `layers` names (gate, up and down on a Llama)."""
    names = []
    for layer in resolve_layers(model, layers):
        ffn = get_ffn(model, layer)
        maps = ffn_maps(ffn)
        names += [f"{ffn_path(model, layer)}.{m}" for m in (maps.key, maps.linear, maps.value) if m]
    return names


def _map_shapes(model: nn.Module, names: list[str]) -> list[tuple[int, int]]:
    return [tuple(rows(model.get_submodule(n)).shape) for n in names]


def matched_rank(model: nn.Module, layers: list[str], params: int) -> int:
    """The LoRA rank at which adapters on those blocks' FFN maps have as close to `params` parameters as a rank can
    (a rank-r adapter of an (out, in) map has r * (in + out))."""
    per_rank = sum(out + inp for out, inp in _map_shapes(model, ffn_map_names(model, layers)))
    return max(1, round(params / per_rank))


def slot_parameters(model: nn.Module, layers: list[str], slots: int | None) -> int:
    """How many parameters `slots` NKB slots a block (default the FFN's width) on the blocks `layers` names would
    have: a key, a gate where the FFN is gated, and a value of d_model each."""
    resolved = resolve_layers(model, layers)
    ffn = get_ffn(model, resolved[0])
    out, d_model = rows(key_layer(ffn)).shape
    return len(resolved) * (slots or out) * d_model * (3 if is_gated(ffn) else 2)


def mount_lora(model: nn.Module, layers: list[str], rank: int, alpha: float | None = None, **options):
    """LoRA adapters of `rank` on the FFN maps of the blocks `layers` names, through PEFT; everything else frozen.
    The model is changed in place (its maps wrapped); the returned `PeftModel` around it saves the adapters.
    `alpha` (default the rank): the update's scale is alpha / rank, 1 as PEFT's defaults (r=8, alpha=8) have it.
    `options`: more of PEFT's LoraConfig (use_dora=True: DoRA's magnitude and direction)."""
    from peft import LoraConfig, get_peft_model
    targets = ffn_map_names(model, layers)
    config = LoraConfig(r=rank, lora_alpha=alpha or rank, lora_dropout=0.0, target_modules=targets,
                        fan_in_fan_out=not isinstance(model.get_submodule(targets[0]), nn.Linear),  # GPT-2's Conv1D
                        **options)
    with _peft_quiet():
        return get_peft_model(model, config)


def train_ffn_maps(model: nn.Module, layers: list[str]) -> int:
    """Freeze everything but the FFN maps' weights (and biases) of the blocks `layers` names; their count."""
    trained = set(ffn_map_names(model, layers))
    for name, param in model.named_parameters():
        param.requires_grad = name.rsplit(".", 1)[0] in trained
    return trainable_count(model)


def trainable_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def save_lora(wrapped, directory: str | Path) -> Path:
    """The adapters in PEFT's own folder format."""
    wrapped.save_pretrained(directory)
    return Path(directory)


def load_lora(model: nn.Module, directory: str | Path) -> nn.Module:
    """The model with the adapters of a `save_lora` folder merged into its maps: a plain model of its class."""
    from peft import PeftModel
    with _peft_quiet():
        return PeftModel.from_pretrained(model, str(directory)).merge_and_unload()


@contextlib.contextmanager
def _peft_quiet() -> Iterator[None]:
    """PEFT reads transformers' deprecated `is_gradient_checkpointing` itself: a warning no user can act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        yield


def save_trained_maps(model: nn.Module, directory: str | Path) -> Path:
    """The weights that train (the FFN maps `train_ffn_maps` marked), in fp32."""
    from safetensors.torch import save_file
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {n: p.detach().float().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad}
    save_file(state, directory / BLOCKS_FILE)
    return directory


def load_trained_maps(model: nn.Module, directory: str | Path) -> None:
    """Put a `save_trained_maps` folder's weights over the model's own; every one must name a weight of the same
    shape."""
    from safetensors.torch import load_file
    path = Path(directory) / BLOCKS_FILE
    state = load_file(path)
    own = dict(model.named_parameters())
    for name, tensor in state.items():
        if name not in own or own[name].shape != tensor.shape:
            raise ValueError(f"{path}: {name} {tuple(tensor.shape)} is not a weight of this "
                             f"{type(model).__name__} (saved over another base?)")
        with torch.no_grad():
            own[name].copy_(tensor.to(own[name].dtype))
