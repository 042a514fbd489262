"""Merging the NKB into T5's FFN: a stock transformers model with the same outputs."""

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

from nkb_model.merge import merge_nkb
from nkb_model.nkb import NKBConfig, mount_nkb
from tests.nkb_model.test_nkb import VARIANTS, batch, tiny_t5


@pytest.mark.parametrize("ffn", VARIANTS)
def test_the_merged_model_is_a_stock_t5_with_the_mounted_models_outputs(ffn, tmp_path):
    model = tiny_t5(ffn)
    mount_nkb(model, NKBConfig(layers=["decoder.-1", "encoder.0"], slots=20))
    merged = merge_nkb(model)
    merged.save_pretrained(tmp_path / "export")
    stock = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "export").eval()
    assert type(stock).__name__ == "T5ForConditionalGeneration" and stock.config.d_ff == 48 + 20
    inputs = batch()
    with torch.no_grad():
        expected, got = model(**inputs).logits, stock(**inputs).logits
        unchanged = tiny_t5(ffn)(**inputs).logits
    assert not torch.allclose(expected, unchanged, atol=1e-3), "the slots must matter for this test to mean much"
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    generated = [m.generate(input_ids=inputs["input_ids"], max_new_tokens=6, do_sample=False) for m in (model, stock)]
    assert torch.equal(*generated)


def test_blocks_without_slots_are_unchanged_by_their_zero_neurons():
    model = tiny_t5("gated-gelu")
    mount_nkb(model, NKBConfig(layers=["decoder.-1"], slots=8))
    merged = merge_nkb(model)
    untouched = merged.encoder.block[0].layer[-1].DenseReluDense
    assert untouched.wi_0.weight.shape == (56, 32) and not untouched.wi_0.weight[48:].any()
    assert not untouched.wo.weight[:, 48:].any()


def test_what_cannot_merge_is_refused():
    with pytest.raises(ValueError, match="no NKB slots"):
        merge_nkb(tiny_t5("relu"))
    model = tiny_t5("gated-gelu")
    mount_nkb(model, NKBConfig(gated=False))
    with pytest.raises(ValueError, match="ungated on a gated FFN"):
        merge_nkb(model)
