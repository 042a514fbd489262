"""The injection benchmark's model-FLOP count (the numerator of its MFU), checked against PyTorch's own
FLOP counter on one real training step of a tiny T5."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from bench.inject import model_for, step_flops
from nkb_model.base_model import FEED_FORWARD, SIZES
from nkb_model.train import choose_device

VOCAB = 300


@pytest.mark.parametrize("ffn", [FEED_FORWARD, "relu"])
@pytest.mark.parametrize("variant", ["nkb", "nkb-a"])
def test_step_flops_equal_pytorchs_count(variant, ffn):
    model = model_for(dict(SIZES["tiny"], feed_forward_proj=ffn, vocab_size=VOCAB), variant, choose_device("cpu"))
    batch, input_len, target_len = 2, 24, 5  # a target much shorter than the input, as in injection
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randint(3, VOCAB, (batch, input_len), generator=generator)
    labels = torch.randint(3, VOCAB, (batch, target_len), generator=generator)
    # The math attention kernel is made of matmuls the counter sees; fused CPU attention kernels are not counted.
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(input_ids=inputs, labels=labels).loss.backward()
    assert step_flops(model, variant, batch, input_len, target_len) == counter.get_total_flops()


def test_nkb_count_refuses_slots_it_does_not_model():
    model = model_for(dict(SIZES["tiny"], feed_forward_proj=FEED_FORWARD, vocab_size=VOCAB), "nkb", choose_device("cpu"))
    model.encoder.block[0].layer[0].SelfAttention.q.weight.requires_grad_(True)
    with pytest.raises(ValueError, match="last decoder block"):
        step_flops(model, "nkb", 2, 24, 5)
