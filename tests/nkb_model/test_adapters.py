"""LoRA (through PEFT) and trained FFN maps on the blocks slots would be on: tiny random T5, GPT-2 and Llama-style
models, real Hugging Face and PEFT modules on CPU."""

import warnings

import pytest
import torch

from nkb_model.adapters import (ffn_map_names, load_lora, load_trained_maps, matched_rank, mount_lora, save_lora,
                                save_trained_maps, train_ffn_maps, trainable_count)
from nkb_model.nkb import NKBConfig, mark_only_nkb_trainable, mount_nkb
from tests.nkb_model.test_architectures import tiny, tokens
from tests.nkb_model.test_nkb import tiny_t5

MODELS = {"t5": (lambda: tiny_t5("gated-gelu"), ["decoder.-1"]), "t5-relu": (lambda: tiny_t5("relu"), ["encoder.0"]),
          **{f: (lambda f=f: tiny(f), ["decoder.-1"]) for f in ("gpt2", "llama", "llama-mlp-bias")}}


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        extra = {"decoder_input_ids": tokens(2)} if model.config.is_encoder_decoder else {}
        return model(input_ids=tokens(), **extra).logits


def make(family: str):
    torch.manual_seed(0)
    return MODELS[family][0]()


@pytest.mark.parametrize("family", MODELS)
def test_the_ffn_maps_trained_have_as_many_weights_as_the_slots_at_their_default_width(family):
    model, layers = make(family), MODELS[family][1]
    slots = make(family)
    mount_nkb(slots, NKBConfig(layers=layers))
    slot_count = mark_only_nkb_trainable(slots)
    count = train_ffn_maps(model, layers)
    maps = ffn_map_names(model, layers)
    biases = sum(m.bias.numel() for m in map(model.get_submodule, maps) if getattr(m, "bias", None) is not None)
    assert count - biases == slot_count - sum(p.numel() for n, p in slots.named_parameters()
                                              if p.requires_grad and n.endswith(".bias"))
    assert {n.rsplit(".", 1)[0] for n, p in model.named_parameters() if p.requires_grad} == set(maps)


@pytest.mark.parametrize("family", MODELS)
def test_lora_at_the_matched_rank_has_about_the_slots_count_and_merges_into_a_plain_model(family, tmp_path):
    model, layers = make(family), MODELS[family][1]
    maps = ffn_map_names(model, layers)
    per_rank = sum(sum(model.get_submodule(n).weight.shape) for n in maps)
    rank = matched_rank(model, layers, 10 * per_rank + 3)
    assert rank == 10
    wrapped = mount_lora(model, layers, rank)
    assert trainable_count(model) == rank * per_rank  # the adapters alone train
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    with torch.no_grad():  # trained adapters: B is zero when mounted
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    expected = logits(model)
    save_lora(wrapped, tmp_path / "lora")
    assert (tmp_path / "lora" / "adapter_config.json").exists()
    merged = load_lora(make(family), tmp_path / "lora")
    assert not any("lora" in n for n, _ in merged.named_modules())
    assert type(merged) is type(make(family))
    assert torch.allclose(logits(merged), expected, atol=1e-5)


def test_lora_mounted_and_loaded_says_nothing_a_user_cannot_act_on(tmp_path):
    """PEFT reads transformers' deprecated `is_gradient_checkpointing`; its FutureWarning reached every routes run."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        save_lora(mount_lora(make("llama"), MODELS["llama"][1], rank=2), tmp_path / "lora")
        load_lora(make("llama"), tmp_path / "lora")
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]


@pytest.mark.parametrize("family", ["t5", "llama"])
def test_trained_maps_are_saved_alone_and_put_back_over_the_base(family, tmp_path):
    model, layers = make(family), MODELS[family][1]
    train_ffn_maps(model, layers)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1)
    save_trained_maps(model, tmp_path)
    fresh = make(family)
    assert not torch.allclose(logits(fresh), logits(model))
    load_trained_maps(fresh, tmp_path)
    assert torch.equal(logits(fresh), logits(model))
    other = make("gpt2" if family == "llama" else "llama")
    with pytest.raises(ValueError, match="is not a weight of this"):
        load_trained_maps(other, tmp_path)
