"""The NKB on every supported FFN family: tiny random GPT-2, Llama, Qwen2 and Mistral models (and T5, whose own
tests are in test_nkb.py), real Hugging Face modules on CPU."""

import pytest
import torch
from transformers import (BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)

from nkb_model.analysis import memories, output_logits
from nkb_model.decoding import greedy_rows
from nkb_model.merge import merge_nkb
from nkb_model.mounting import get_ffn, resolve_layers
from nkb_model.nkb import NKBConfig, NKBFeedForward, load_nkb, mount_nkb, save_nkb, unmount_nkb
from tests.nkb_model.test_nkb import tiny_t5

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
# family: (model, its last block's canonical name, its FFN width)
FAMILIES = {
    "gpt2": (lambda: GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_inner=48,
                                                n_positions=64, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)), "h.1"),
    "gpt2-default-width": (lambda: GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=16, n_layer=2, n_head=4,
                                                              n_positions=64)), "h.1"),
    "llama": (lambda: LlamaForCausalLM(LlamaConfig(**SMALL)), "layers.1"),
    "llama-mlp-bias": (lambda: LlamaForCausalLM(LlamaConfig(**SMALL, mlp_bias=True)), "layers.1"),
    "qwen2": (lambda: Qwen2ForCausalLM(Qwen2Config(**SMALL)), "layers.1"),
    "mistral": (lambda: MistralForCausalLM(MistralConfig(**SMALL)), "layers.1"),
}


def tiny(family: str, seed: int = 0):
    torch.manual_seed(seed)
    return FAMILIES[family][0]().eval()


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 64, (3, 9), generator=torch.Generator().manual_seed(seed))


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=tokens()).logits


@pytest.mark.parametrize("family", FAMILIES)
def test_zero_values_give_bit_identical_logits_and_unmounting_restores_the_ffn(family):
    model = tiny(family)
    before, original = logits(model), get_ffn(model, FAMILIES[family][1])
    names = mount_nkb(model, NKBConfig(layers=["decoder.0", "decoder.-1"], zero_values=True))
    assert names == [FAMILIES[family][1].replace(".1", ".0"), FAMILIES[family][1]]  # as the model names them
    assert torch.equal(logits(model), before)
    unmount_nkb(model)
    assert get_ffn(model, names[-1]) is original and torch.equal(logits(model), before)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_share_of_the_depth_names_the_familys_own_block(family):
    last = FAMILIES[family][1]
    assert resolve_layers(tiny(family), ["decoder.0%", "decoder.100%"]) == [last.replace(".1", ".0"), last]


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_rows_leaving_the_batch_write_what_generate_writes(family):
    model = tiny(family)
    ids = tokens()
    mask = torch.ones_like(ids)
    mask[0, :4], mask[1, :2] = 0, 0  # left padding of unequal lengths
    enc = {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}
    with torch.no_grad():
        full = model.generate(**enc, max_new_tokens=6, do_sample=False, pad_token_id=0)[:, ids.shape[1]:].tolist()
        rows = greedy_rows(model, enc, set(), 6, lambda row, written: len(written) > 2 * row)
    assert rows == [full[0][:1], full[1][:3], full[2][:5]]


@pytest.mark.parametrize("family", FAMILIES)
def test_slots_are_neurons_of_the_ffns_own_kind(family):
    model = tiny(family)
    ffn = get_ffn(model, FAMILIES[family][1])
    mount_nkb(model)
    slots = get_ffn(model, FAMILIES[family][1])
    assert isinstance(slots, NKBFeedForward) and slots.base_layer is ffn
    gated = family not in ("gpt2", "gpt2-default-width")
    width = 4 * 16 if family == "gpt2-default-width" else 48  # default slot count: the FFN's width
    assert slots.gated == gated and slots.nkb_keys.weight.shape[0] == width
    # a key bias where the FFN's input map has one (GPT-2's c_fc, Llama with mlp_bias)
    assert (slots.nkb_keys.bias is not None) == (family in ("gpt2", "gpt2-default-width", "llama-mlp-bias"))
    assert slots.act is (ffn.act_fn if gated else ffn.act)
    assert not torch.equal(logits(model), logits(tiny(family)))


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_save_load_round_trip_and_the_merged_stock_model_compute_the_same(family, tmp_path):
    model = tiny(family)
    mount_nkb(model, NKBConfig(layers=["decoder.-1"], slots=20))
    with torch.no_grad():  # slot biases nonzero too, so that merging them is checked
        for name, param in model.named_parameters():
            if ".nkb_" in name and name.endswith(".bias"):
                param.normal_(0, 0.5)
    mounted = logits(model)
    save_nkb(model, tmp_path / "nkb")
    fresh = tiny(family)
    load_nkb(fresh, tmp_path / "nkb")
    assert torch.equal(logits(fresh), mounted)
    merged = merge_nkb(model)
    assert type(merged) is type(model) and not any(".nkb_" in n for n, _ in merged.named_parameters())
    assert torch.allclose(merged(input_ids=tokens()).logits, mounted, atol=1e-5)
    merged.save_pretrained(tmp_path / "stock")
    again = type(model).from_pretrained(tmp_path / "stock").eval()
    assert torch.allclose(logits(again), mounted, atol=1e-5)
    width = (64 if family == "gpt2-default-width" else 48) + 20
    assert (again.config.n_inner if family.startswith("gpt2") else again.config.intermediate_size) == width


@pytest.mark.parametrize("family", FAMILIES)
def test_values_read_through_the_models_final_norm(family):
    model = tiny(family)
    mount_nkb(model, NKBConfig(layers=["decoder.-1"]))
    memory = memories(model, "decoder.-1")
    ffn_memory = memories(model, "decoder.-1", kind="ffn")
    assert memory.keys.shape == (memory.values.shape[0], 32 if family != "gpt2-default-width" else 16)
    assert ffn_memory.values.shape == memory.values.shape  # as many slots as neurons by default
    assert output_logits(model, memory.values[:5]).shape == (5, 64)


def test_an_unsupported_model_or_ffn_is_named_in_the_error():
    with pytest.raises(ValueError, match="BertModel: not a supported model"):
        mount_nkb(BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                       intermediate_size=48)))
    phi3 = Phi3ForCausalLM(Phi3Config(**{**SMALL, "pad_token_id": 0}))  # fused gate_up_proj: no table entry yet
    with pytest.raises(ValueError, match="Phi3MLP: not a supported feed-forward block"):
        mount_nkb(phi3)


def test_layer_names_follow_the_model_and_decoder_is_an_alias_on_decoder_only_models():
    llama, gpt2, t5 = tiny("llama"), tiny("gpt2"), tiny_t5("relu")
    assert resolve_layers(llama, ["layers.-1", "decoder.0", "decoder.1"]) == ["layers.1", "layers.0"]
    assert resolve_layers(gpt2, ["h.0", "decoder.-2"]) == ["h.0"]
    assert resolve_layers(t5, ["decoder.-1", "encoder.0"]) == ["decoder.1", "encoder.0"]
    with pytest.raises(ValueError, match="layers are named layers.N"):
        resolve_layers(llama, ["encoder.0"])
    with pytest.raises(ValueError, match="layers are named encoder.N or decoder.N"):
        resolve_layers(t5, ["layers.0"])
    with pytest.raises(ValueError, match="the h has 2 blocks"):
        resolve_layers(gpt2, ["h.2"])


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_slots_with_a_key_bias_gate_themselves_and_export_as_the_ffns_bias(family, tmp_path):
    model = tiny(family)
    before = logits(model)
    mount_nkb(model, NKBConfig(layers=["decoder.-1"], slots=20, key_bias=-2.0))
    slots = get_ffn(model, FAMILIES[family][1])
    assert torch.equal(slots.nkb_keys.bias, torch.full((20,), -2.0))
    x = torch.randn(3, 9, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        quiet = slots.addition(x).norm()
        slots.nkb_keys.bias.zero_()
        assert slots.addition(x).norm() > 2 * quiet  # the bias quiets the slots
        slots.nkb_keys.bias.normal_(-1.0, 0.5)
    mounted = logits(model)
    assert not torch.equal(mounted, before)
    save_nkb(model, tmp_path / "nkb")
    fresh = tiny(family)
    load_nkb(fresh, tmp_path / "nkb")
    assert torch.equal(logits(fresh), mounted)
    merged = merge_nkb(model)
    merged.save_pretrained(tmp_path / "stock")
    stock = type(model).from_pretrained(tmp_path / "stock").eval()
    assert torch.allclose(logits(stock), mounted, atol=1e-5)
    if family != "gpt2":  # the maps' biases turned on for the slots' alone
        assert stock.config.mlp_bias
        mlp = stock.model.layers[0].mlp
        assert not mlp.gate_proj.bias.any() and not mlp.up_proj.bias.any() and not mlp.down_proj.bias.any()


def test_slots_with_a_key_bias_and_zero_values_leave_the_base_bit_identical_and_ffns_without_a_bias_refuse_them():
    model = tiny("llama")
    before = logits(model)
    mount_nkb(model, NKBConfig(layers=["decoder.-1"], key_bias=-3.0, zero_values=True))
    assert torch.equal(logits(model), before)
    for other in (tiny_t5("relu"), tiny("qwen2")):
        mount_nkb(other, NKBConfig(layers=["decoder.-1"], slots=4, key_bias=-1.0))
        with pytest.raises(ValueError, match="key bias and .*'s FFN has no bias to hold it: export them with --adapter"):
            merge_nkb(other)
