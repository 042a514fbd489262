"""The NKB mounted on real Hugging Face T5 modules (tiny random configs, CPU)."""

import pytest
import torch
from transformers import T5Config, T5ForConditionalGeneration

from nkb_model.base_model import FEED_FORWARD
from nkb_model.mounting import depth_index, resolve_layers
from nkb_model.nkb import (NKBConfig, NKBFeedForward, load_nkb, mark_only_nkb_trainable, mount_nkb, mounted_layers,
                           nkb_parameters, save_nkb, unmount_nkb)

# T5 v1.0's FFN, v1.1's, and v1.1's with the fused GELU kernel that the pipeline's own bases use
VARIANTS = {"relu": "relu", "gated-gelu": "gated-gelu", FEED_FORWARD: FEED_FORWARD}


def tiny_t5(ffn: str, seed: int = 0) -> T5ForConditionalGeneration:
    torch.manual_seed(seed)
    config = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
                      feed_forward_proj=ffn, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
                      eos_token_id=1)
    return T5ForConditionalGeneration(config).eval()


def batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(2, 64, (3, 7), generator=g), "labels": torch.randint(2, 64, (3, 5), generator=g)}


def test_a_share_of_the_depth_lands_on_the_same_place_in_models_of_other_depths():
    assert [depth_index(p, 30, "") for p in (33, 47, 67)] == [10, 14, 20]  # the demo's blocks on SmolLM2's 30
    assert [depth_index(p, 24, "") for p in (33, 47, 67)] == [8, 11, 16]
    assert [depth_index(p, 32, "") for p in (0, 33, 100)] == [0, 11, 31]


@pytest.mark.parametrize("ffn", VARIANTS)
def test_zero_values_give_bit_identical_logits(ffn):
    model = tiny_t5(ffn)
    with torch.no_grad():
        before = model(**batch()).logits
        mount_nkb(model, NKBConfig(layers=["decoder.-1", "encoder.0"], zero_values=True))
        mounted = model(**batch()).logits
        unmount_nkb(model)
        after = model(**batch()).logits
    assert torch.equal(before, mounted) and torch.equal(before, after)


@pytest.mark.parametrize("ffn", VARIANTS)
def test_nonzero_values_change_outputs_and_wrap_the_original(ffn):
    model = tiny_t5(ffn)
    original = model.decoder.block[-1].layer[-1].DenseReluDense
    with torch.no_grad():
        before = model(**batch()).logits
        names = mount_nkb(model)
        after = model(**batch()).logits
    assert names == ["decoder.1"] and not torch.equal(before, after)
    ffn_module = model.decoder.block[-1].layer[-1].DenseReluDense
    assert isinstance(ffn_module, NKBFeedForward) and ffn_module.base_layer is original
    assert ffn_module.nkb_keys.weight.shape == (48, 32) and ffn_module.nkb_values.weight.shape == (32, 48)
    unmount_nkb(model)
    assert model.decoder.block[-1].layer[-1].DenseReluDense is original


@pytest.mark.parametrize("ffn", VARIANTS)
def test_bounding_shrinks_only_slots_longer_than_the_ffns_longest_neuron(ffn):
    model = tiny_t5(ffn)
    mount_nkb(model, NKBConfig(layers=["decoder.-1"]))
    layer = mounted_layers(model)["decoder.1"]
    maps = [(layer.nkb_keys.weight, layer.base_layer.wi_0 if layer.gated else layer.base_layer.wi, 1),
            (layer.nkb_values.weight, layer.base_layer.wo, 0)]
    if layer.gated:
        maps.append((layer.nkb_keys_linear.weight, layer.base_layer.wi_1, 1))
    with torch.no_grad():
        for weight, _, dim in maps:  # slot 0 ten times too long, slot 1 tiny
            (weight[0] if dim == 1 else weight[:, 0]).mul_(10 * 50)
            (weight[1] if dim == 1 else weight[:, 1]).mul_(1e-3)
    before = [weight.clone() for weight, _, _ in maps]
    layer.bound_to_ffn_scale(2.0)
    for (weight, reference, dim), old in zip(maps, before):
        weight, limit = weight.detach(), 2.0 * reference.weight.detach().norm(dim=dim).max()
        norms, old_norms = weight.norm(dim=dim), old.norm(dim=dim)
        assert (norms <= limit * (1 + 1e-6)).all() and norms[0].item() == pytest.approx(limit.item(), rel=1e-5)
        kept = old_norms <= limit
        assert torch.equal(weight.index_select(1 - dim, kept.nonzero()[:, 0]),
                           old.index_select(1 - dim, kept.nonzero()[:, 0]))  # slots within the bound untouched
        first = (weight[0], old[0]) if dim == 1 else (weight[:, 0], old[:, 0])
        assert torch.nn.functional.cosine_similarity(*first, dim=0) > 0.9999  # direction kept


def test_init_follows_t5_scales():
    torch.manual_seed(0)
    config = T5Config(vocab_size=64, d_model=256, d_ff=1024, num_layers=1, num_heads=4, d_kv=64)
    model = T5ForConditionalGeneration(config)
    mount_nkb(model, NKBConfig(slots=4096))
    ffn = mounted_layers(model)["decoder.0"]
    assert ffn.nkb_keys.weight.std().item() == pytest.approx(256 ** -0.5, rel=0.02)
    assert ffn.nkb_values.weight.std().item() == pytest.approx(4096 ** -0.5, rel=0.02)


def test_layer_specs():
    model = tiny_t5("relu")
    assert resolve_layers(model, ["decoder.-1", "decoder.block.1", "encoder.0"]) == ["decoder.1", "encoder.0"]
    with pytest.raises(ValueError, match="has 2 blocks"):
        resolve_layers(model, ["encoder.5"])
    with pytest.raises(ValueError, match="bad layer spec 'decoder'; use e.g. 'encoder.-1' or 'decoder.-1'"):
        resolve_layers(model, ["decoder"])
    # a share of the depth: the nearest block, the top one at 100 %
    assert resolve_layers(model, ["encoder.0%", "decoder.50%", "decoder.100%"]) == ["encoder.0", "decoder.1"]
    with pytest.raises(ValueError, match="at most 100%"):
        resolve_layers(model, ["decoder.101%"])
    mount_nkb(model)
    with pytest.raises(ValueError, match="already has an NKB"):
        mount_nkb(model)


@pytest.mark.parametrize("ffn", VARIANTS)
def test_only_nkb_trains_and_base_stays_bit_identical(ffn):
    model = tiny_t5(ffn)
    base_before = {n: p.detach().clone() for n, p in model.named_parameters()}
    mount_nkb(model)
    nkb_before = {n: p.detach().clone() for n, p in nkb_parameters(model)}
    trainable = mark_only_nkb_trainable(model)
    key_maps = 2 if ffn.startswith("gated") else 1  # a gated FFN's slots have wi_0- and wi_1-like keys
    assert trainable == sum(p.numel() for _, p in nkb_parameters(model)) == (key_maps + 1) * 32 * 48
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for _ in range(3):
        optimizer.zero_grad()
        model(**batch()).loss.backward()
        optimizer.step()
    after = dict(model.named_parameters())
    base_after = {n.replace(".base_layer", ""): p for n, p in after.items() if ".nkb_" not in n}
    assert base_after.keys() == base_before.keys()
    assert all(torch.equal(base_after[n], t) for n, t in base_before.items())
    assert all(not torch.equal(after[n], t) for n, t in nkb_before.items())


@pytest.mark.parametrize("ffn", VARIANTS)
def test_save_load_round_trip_is_exact(ffn, tmp_path):
    model = tiny_t5(ffn)
    model.save_pretrained(tmp_path / "base")
    mount_nkb(model, NKBConfig(layers=["decoder.-1", "encoder.1"], slots=20))
    save_nkb(model, tmp_path / "nkb")
    fresh = T5ForConditionalGeneration.from_pretrained(tmp_path / "base").eval()
    assert load_nkb(fresh, tmp_path / "nkb") == ["decoder.1", "encoder.1"]
    with torch.no_grad():
        assert torch.equal(model(**batch()).logits, fresh(**batch()).logits)
    assert sorted(p.name for p in (tmp_path / "nkb").iterdir()) == ["nkb.safetensors", "nkb_config.json"]


def test_generate_works_with_the_nkb_mounted():
    model = tiny_t5("gated-gelu")
    mount_nkb(model)
    out = model.generate(input_ids=batch()["input_ids"], max_new_tokens=4, do_sample=False)
    assert out.shape[0] == 3 and out.shape[1] <= 5


def test_bf16_keeps_values_in_fp32_like_wo(tmp_path):
    tiny_t5("gated-gelu").save_pretrained(tmp_path / "base")
    model = T5ForConditionalGeneration.from_pretrained(tmp_path / "base", dtype=torch.bfloat16).eval()
    mount_nkb(model)
    ffn = mounted_layers(model)["decoder.1"]
    assert ffn.base_layer.wo.weight.dtype == ffn.nkb_values.weight.dtype
    assert ffn.nkb_keys.weight.dtype == torch.bfloat16
    with torch.no_grad():
        logits = model(**batch()).logits
    assert torch.isfinite(logits).all()


def test_a_plain_hugging_face_directory_loads_as_a_base(tmp_path):
    from nkb_model.checkpoint import load_model, read_info
    from transformers import T5Tokenizer
    tiny_t5("relu").save_pretrained(tmp_path / "t5")
    T5Tokenizer(vocab=[("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁a", -1.0)], extra_ids=3).save_pretrained(tmp_path / "t5")
    assert read_info(tmp_path / "t5") == {"name": "t5", "kind": "base"}
    model, tokenizer, info = load_model(tmp_path / "t5")
    assert info["kind"] == "base" and model.config.d_ff == 48 and tokenizer.pad_token_id == 0


@pytest.mark.parametrize("ffn", VARIANTS)
def test_slots_have_the_ffns_architecture(ffn):
    model = tiny_t5(ffn)
    mount_nkb(model)
    slots = mounted_layers(model)["decoder.1"]
    assert slots.gated == ffn.startswith("gated") == (slots.nkb_keys_linear is not None)
    x = torch.randn(2, 3, 32)
    with torch.no_grad():
        fired = slots.act(slots.nkb_keys(x)) * (slots.nkb_keys_linear(x) if slots.gated else 1)
        torch.testing.assert_close(slots.slot_weights(x), fired, rtol=0, atol=0)
    with pytest.raises(ValueError, match="gated NKB slots need a gated FFN"):
        mount_nkb(tiny_t5("relu"), NKBConfig(gated=True))


def test_ungated_slots_saved_before_gating_existed_still_load_on_a_gated_ffn(tmp_path):
    import json
    model = tiny_t5("gated-gelu")
    model.save_pretrained(tmp_path / "base")
    mount_nkb(model, NKBConfig(gated=False))
    save_nkb(model, tmp_path / "nkb")
    config_file = tmp_path / "nkb" / "nkb_config.json"
    saved = json.loads(config_file.read_text())
    assert saved.pop("gated") is False
    config_file.write_text(json.dumps(saved))  # as an older version wrote it
    fresh = T5ForConditionalGeneration.from_pretrained(tmp_path / "base").eval()
    load_nkb(fresh, tmp_path / "nkb")
    assert not mounted_layers(fresh)["decoder.1"].gated
    with torch.no_grad():
        assert torch.equal(model(**batch()).logits, fresh(**batch()).logits)


def test_a_derived_models_base_is_found_relative_to_it_or_at_an_older_folders_absolute_path(tmp_path):
    import json
    from nkb_model.checkpoint import INFO, hf_dir, relative_base
    base, model = tmp_path / "models" / "base-1", tmp_path / "models" / "base+nkb-2"
    for folder in (base, model):
        folder.mkdir(parents=True)
    (base / "config.json").write_text("{}")
    assert relative_base(base, model) == "../base-1"
    (model / INFO).write_text(json.dumps({"name": "base+nkb", "kind": "nkb", "base_folder": "../base-1"}))
    moved = tmp_path / "elsewhere"
    (tmp_path / "models").rename(moved)
    assert hf_dir(moved / "base+nkb-2") == (moved / "base-1").resolve()
    (moved / "base+nkb-2" / INFO).write_text(json.dumps({"name": "base+nkb", "kind": "nkb", "base_dir": "/old/base"}))
    assert str(hf_dir(moved / "base+nkb-2")) == "/old/base"
