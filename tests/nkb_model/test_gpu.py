"""CUDA checks in bf16, the precision the stages choose on a GPU; skipped cleanly on machines without one (CI has
none). `python -m bench.gpu` runs them first, the first time a GPU machine is available."""

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

from nkb_model.merge import merge_nkb
from nkb_model.nkb import NKBConfig, mount_nkb, nkb_state_dict, unmount_nkb
from nkb_model.train import TrainConfig, choose_device, train
from tests.nkb_model.test_nkb import batch, tiny_t5
from tests.nkb_model.test_train import batch_for_step, nkb_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def on_gpu(inputs: dict, device) -> dict:
    return {k: v.to(device.device) for k, v in inputs.items()}


@pytest.mark.parametrize("ffn", ["relu", "gated-gelu"])
def test_zero_nkb_is_exact_on_cuda_in_bf16(ffn):
    device = choose_device("cuda")
    model = tiny_t5(ffn).to(device.device)
    inputs = on_gpu(batch(), device)
    with torch.no_grad(), device.autocast():
        before = model(**inputs).logits
        mount_nkb(model, NKBConfig(zero_values=True))
        mounted = model(**inputs).logits
        unmount_nkb(model)
    assert torch.equal(before, mounted) and torch.isfinite(mounted).all()


@pytest.mark.parametrize("ffn", ["relu", "gated-gelu"])
def test_unmounted_slots_give_the_base_back_exactly_on_cuda_in_bf16(ffn):
    device = choose_device("cuda")
    model = tiny_t5(ffn).to(device.device)
    inputs = on_gpu(batch(), device)
    with torch.no_grad(), device.autocast():
        before = model(**inputs).logits
        mount_nkb(model, NKBConfig(slots=16))  # random values: the outputs change while mounted
        mounted = model(**inputs).logits
        unmount_nkb(model)
        after = model(**inputs).logits
    assert not torch.equal(before, mounted) and torch.equal(before, after)


def test_a_resumed_run_matches_an_uninterrupted_one_on_cuda(tmp_path):
    device = choose_device("cuda")
    config = TrainConfig(steps=6, batch_size=4, micro_batch_size=2, lr=1e-2, warmup_steps=2, checkpoint_every=3)
    straight = nkb_model().to(device.device)
    losses = train(straight, batch_for_step, config, device, tmp_path / "a")
    train(nkb_model().to(device.device), batch_for_step, TrainConfig(**{**config.__dict__, "steps": 3}), device,
          tmp_path / "b")
    resumed = nkb_model().to(device.device)  # a new process: fresh weights and the checkpoint
    assert train(resumed, batch_for_step, config, device, tmp_path / "b") == losses
    a, b = nkb_state_dict(straight), nkb_state_dict(resumed)
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_the_export_equals_the_mounted_model_on_cuda(tmp_path):
    """Merging is exact arithmetic, so it is checked in fp32 on the GPU. In bf16 the merged weight (W + slots in one
    matmul) and the mounted model (two matmuls, summed) round differently: seen on an H200, one logit of 960 off by
    0.023. There the check is bf16's own resolution: within 3 units in the last place of the logits' scale."""
    device = choose_device("cuda")
    model = tiny_t5("gated-gelu")
    mount_nkb(model, NKBConfig(layers=["decoder.-1", "encoder.0"], slots=20))
    merge_nkb(model).save_pretrained(tmp_path / "export")
    stock = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "export").eval().to(device.device)
    model = model.to(device.device)
    inputs = on_gpu(batch(), device)
    with torch.no_grad():
        exact, merged = model(**inputs).logits, stock(**inputs).logits
        torch.testing.assert_close(merged, exact, rtol=1e-4, atol=1e-4)
        generated = [m.generate(input_ids=inputs["input_ids"], max_new_tokens=6, do_sample=False)
                     for m in (model, stock)]
        assert torch.equal(*generated)
        with device.autocast():
            a, b = stock(**inputs).logits.float(), model(**inputs).logits.float()
    ulp = 2.0 ** -7 * exact.abs().max().item()  # bf16 keeps 8 significant bits
    assert (a - b).abs().max().item() <= 3 * ulp


def test_compiled_steps_on_a_bf16_held_base_follow_the_eager_fp32_ones_on_cuda():
    device = choose_device("cuda")
    config = TrainConfig(steps=4, batch_size=4, lr=1e-2)
    eager = train(nkb_model().to(device.device), batch_for_step, config, device)
    held = device.hold(nkb_model())
    compiled = train(held, batch_for_step, TrainConfig(**{**config.__dict__, "compile": True}), device)
    assert all(abs(a - b) < 0.02 * abs(a) for (_, a), (_, b) in zip(eager, compiled))
    assert all(p.dtype == torch.float32 for p in held.parameters() if p.requires_grad)
