"""The architectures the pipeline knows, one record each (`ARCHITECTURES`): where an architecture keeps its blocks
and feed-forward layers (its `Layout`, by which `nkb_model.mounting` mounts slots), its family (whose behaviour is
`nkb_model.families`'), how its model card names it, and what a base of it built here is. Plain data, at the
bottom of the package: every other module may read it.

Adding an architecture is one record here (a decoder-only one with its config at T5 widths), with its tests in
tests/nkb_model/test_architectures.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Layout:
    """Where an architecture keeps its blocks and, in each block, its FFN."""
    stacks: dict[str, str]   # layer-name prefix -> attribute path of that list of blocks
    ffn: str                 # attribute path from a block to its FFN module (the one wrappers replace)
    final_norm: str          # the norm between the last block and the output embedding


def llama_config(dims: dict, layers: int, dropout: float, **shared):
    """A Llama of T5 widths `dims`: gated SiLU MLP, RMS norm, rotary positions."""
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=dims["d_model"], intermediate_size=dims["d_ff"], head_dim=dims["d_kv"],
                       num_hidden_layers=layers, num_attention_heads=dims["num_heads"],
                       num_key_value_heads=dims["num_heads"], attention_dropout=dropout, **shared)


def gpt2_config(dims: dict, layers: int, dropout: float, max_position_embeddings: int, **shared):
    """A GPT-2 of T5 widths `dims`: GELU MLP with biases, layer norm, learned positions."""
    from transformers import GPT2Config
    return GPT2Config(n_embd=dims["d_model"], n_inner=dims["d_ff"], n_layer=layers, n_head=dims["num_heads"],
                      n_positions=max_position_embeddings, resid_pdrop=dropout, embd_pdrop=dropout,
                      attn_pdrop=dropout, **shared)


@dataclass(frozen=True)
class Architecture:
    """One architecture: its name (`pretrain.arch`, a model's `arch` in its info), how its card names it, its
    family (`nkb_model.families.FAMILIES`), its layout, and what a base of it built here is."""
    name: str
    title: str
    family: str
    layout: Layout
    built_here: str  # the base `base-model` builds of it (`nkb_model.base_model`), in a few words
    # A decoder-only architecture's config at T5 widths (`nkb_model.base_model.causal_config`); None: a T5 itself.
    causal_config: Callable[..., Any] | None = None
    prefix_cache: bool = False  # its blocks can be run from a cached prefix (`nkb_model.prefix_cache`)
    # With tied embeddings, the output embedding reads the final norm's output scaled by d_model ** -0.5 (T5).
    scales_tied_output: bool = False


ARCHITECTURES = {a.name: a for a in (
    Architecture("t5", "T5", "encoder-decoder",
                 Layout({"encoder": "encoder.block", "decoder": "decoder.block"}, "layer.-1.DenseReluDense",
                        "decoder.final_layer_norm"), "encoder-decoder, gated GELU", scales_tied_output=True),
    Architecture("llama", "Llama-style decoder-only model", "decoder-only",
                 Layout({"layers": "model.layers"}, "mlp", "model.norm"), "decoder-only, gated SiLU MLP",
                 llama_config, prefix_cache=True),
    Architecture("gpt2", "GPT-2-style decoder-only model", "decoder-only",
                 Layout({"h": "transformer.h"}, "mlp", "transformer.ln_f"), "decoder-only, GELU MLP", gpt2_config),
)}


# How a setting names a block: its stack and index (`decoder.5`, `encoder.-1`: from the top; `decoder.block.3`:
# T5's own attribute path), or a share of its stack's depth (`decoder.33%`: the block nearest a third of the way
# up), so that one setting means the same place in a 24-block and a 32-block model. `nkb_model.mounting` reads it;
# configs check a setting against it before anything runs.
LAYER_SPEC = r"(\w+)\.(?:block\.)?(?:(-?\d+)|(\d+(?:\.\d+)?)%)"


# The architecture of a base built here unless `pretrain.arch` says otherwise (the paper's), and of a model whose
# info was written before infos named their architecture.
DEFAULT_ARCH = "t5"


def architecture(name: str) -> Architecture:
    """The record of an architecture by its name, or an error that lists them."""
    if name not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {', '.join(ARCHITECTURES)}, not {name!r}")
    return ARCHITECTURES[name]
