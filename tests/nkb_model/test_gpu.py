"""CUDA checks; skipped cleanly on machines without a GPU (CI has none)."""

import pytest
import torch

from nkb_model.nkb import NKBConfig, mount_nkb, unmount_nkb
from nkb_model.train import choose_device
from tests.nkb_model.test_nkb import batch, tiny_t5

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("ffn", ["relu", "gated-gelu"])
def test_zero_nkb_is_exact_on_cuda_in_bf16(ffn):
    device = choose_device("cuda")
    model = tiny_t5(ffn).to(device.device)
    inputs = {k: v.to(device.device) for k, v in batch().items()}
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        before = model(**inputs).logits
        mount_nkb(model, NKBConfig(zero_values=True))
        mounted = model(**inputs).logits
        unmount_nkb(model)
    assert torch.equal(before, mounted) and torch.isfinite(mounted).all()
