import contextlib

import pytest
import torch

from nkb_model.nkb import mark_only_nkb_trainable, mount_nkb, nkb_state_dict
from nkb_model.train import Device, TrainConfig, choose_device, cpu_computes_bf16, cpu_flags, lr_schedule, train
from tests.nkb_model.test_nkb import tiny_t5


def batch_for_step(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(2, 64, (4, 9), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.randint(2, 64, (4, 5), generator=g)}


def nkb_model():
    model = tiny_t5("gated-gelu")
    mount_nkb(model)
    mark_only_nkb_trainable(model)
    return model


@pytest.mark.parametrize("optimizer", ["adafactor", "adamw"])
def test_interrupted_and_resumed_equals_uninterrupted(tmp_path, optimizer):
    device = choose_device("cpu")
    config = TrainConfig(steps=6, batch_size=4, micro_batch_size=2, lr=1e-2, warmup_steps=2, optimizer=optimizer,
                         checkpoint_every=3)
    straight = nkb_model()
    losses = train(straight, batch_for_step, config, device, tmp_path / "a")

    first = nkb_model()
    train(first, batch_for_step, TrainConfig(**{**config.__dict__, "steps": 3}), device, tmp_path / "b")
    resumed = nkb_model()  # a new process would start from fresh weights and the checkpoint
    resumed_losses = train(resumed, batch_for_step, config, device, tmp_path / "b")

    assert resumed_losses == losses and [s for s, _ in losses] == list(range(1, 7))
    a, b = nkb_state_dict(straight), nkb_state_dict(resumed)
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_gradient_accumulation_matches_one_big_batch(tmp_path):
    device = choose_device("cpu")
    whole, split = nkb_model(), nkb_model()
    train(whole, batch_for_step, TrainConfig(steps=2, batch_size=4, optimizer="adamw"), device)
    train(split, batch_for_step, TrainConfig(steps=2, batch_size=4, micro_batch_size=1, optimizer="adamw"), device)
    a, b = nkb_state_dict(whole), nkb_state_dict(split)
    assert all(torch.allclose(a[n], b[n], atol=1e-6) for n in a)


@pytest.mark.parametrize("decay", [False, True])
def test_learning_rate_warms_up_then_stays_or_falls_to_zero(decay):
    factor = lr_schedule(TrainConfig(steps=10, batch_size=1, warmup_steps=2, decay=decay))
    factors = [factor(step) for step in range(10)]
    assert factors[:2] == [0.5, 1.0]
    assert factors[2:] == ([1.0 - i / 8 for i in range(8)] if decay else [1.0] * 8)


def test_nothing_to_train():
    model = tiny_t5("relu")
    for p in model.parameters():
        p.requires_grad = False
    with pytest.raises(ValueError, match="nothing to train"):
        train(model, batch_for_step, TrainConfig(steps=1, batch_size=4), choose_device("cpu"))


def test_device_choice():
    assert choose_device("cpu").device.type == "cpu" and choose_device("cpu").autocast_dtype is None
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="this machine has no CUDA GPU"):
            choose_device("cuda")


def test_bf16_on_a_cpu_only_where_it_computes_bf16_faster_than_fp32(monkeypatch):
    from nkb_model import train as train_module
    # (bf16 arithmetic, its speed over fp32's): AMX; an Intel Xeon with AVX512-BF16 alone; AVX2
    for native, speedup, chosen in ((True, 6.0, torch.bfloat16), (True, 0.57, None), (False, 6.0, None)):
        monkeypatch.setattr(train_module, "cpu_computes_bf16", lambda: native)
        monkeypatch.setattr(train_module, "cpu_bf16_speedup", lambda: speedup)
        assert choose_device("cpu", "bf16").autocast_dtype == chosen
        assert choose_device("cpu", "fp32").autocast_dtype is None
        assert choose_device("cpu", "auto").autocast_dtype is None  # a CPU's default stays fp32
    assert choose_device("cpu", "bf16").name == "cpu (fp32)"
    with pytest.raises(ValueError, match="precision must be auto, fp32 or bf16"):
        choose_device("cpu", "fp16")


def test_bf16s_speed_over_fp32s_is_measured_once_a_process():
    from nkb_model.train import cpu_bf16_speedup
    speedup = cpu_bf16_speedup()
    assert 0.05 < speedup < 50  # a ratio of two timed products, not a flag
    assert cpu_bf16_speedup() is speedup


def test_without_torchs_bf16_check_the_cpu_flags_decide(monkeypatch):
    from nkb_model import train as train_module
    assert cpu_flags("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16\n\nflags : other") == {
        "fpu", "sse", "avx512f", "avx512_bf16"}
    assert cpu_flags("processor : 0\n") == set()

    class NoCheck:  # a torch whose mkldnn ops lack the private check
        def __getattr__(self, name):
            raise AttributeError(name)
    monkeypatch.setattr(torch.ops, "mkldnn", NoCheck())
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    for cpuinfo, native in (("flags : avx512f avx512_bf16", True), ("flags : amx_bf16", True),
                            ("flags : avx2 avx512f", False)):
        monkeypatch.setattr(train_module.Path, "read_text", lambda self, *a, text=cpuinfo, **k: text)
        assert cpu_computes_bf16() is native


def test_a_device_runs_forward_passes_in_its_precision():
    layer, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    with choose_device("cpu").autocast():
        assert layer(x).dtype == torch.float32
    with Device(torch.device("cpu"), torch.bfloat16).autocast():
        assert layer(x).dtype == torch.bfloat16


@pytest.mark.slow  # trains 200 steps
def test_the_progress_bar_redraws_about_once_a_second_not_every_step(monkeypatch, capsys):
    monkeypatch.setenv("NKB_PROGRESS", "1")
    steps = 200  # well under a second a step: a redraw per step would show as ~200 lines
    train(nkb_model(), batch_for_step, TrainConfig(steps=steps, batch_size=4), choose_device("cpu"), desc="bar")
    draws = [d for d in capsys.readouterr().err.split("\r") if d.startswith("bar:")]
    assert "200/200" in draws[-1] and "loss=" in draws[-1] and "tok_s=" in draws[-1]
    assert len(draws) < steps // 4


def test_a_frozen_base_held_in_bf16_trains_only_the_fp32_slots():
    device = Device(torch.device("cpu"), torch.bfloat16)   # what choose_device gives on a GPU, here on the CPU
    full, held = nkb_model(), nkb_model()
    base = {n: p.detach().clone() for n, p in held.named_parameters() if not p.requires_grad}
    device.hold(held)
    assert all(p.dtype == (torch.float32 if p.requires_grad else torch.bfloat16) for p in held.parameters())
    config = TrainConfig(steps=3, batch_size=4, lr=1e-2, optimizer="adamw")
    reference = train(full, batch_for_step, config, device)
    losses = train(held, batch_for_step, config, device)
    # the same training within bf16's rounding of the base's weights
    assert all(abs(a - b) < 0.02 * abs(a) for (_, a), (_, b) in zip(reference, losses))
    frozen = dict(held.named_parameters())
    assert all(torch.equal(frozen[n], w.to(torch.bfloat16)) for n, w in base.items())


@pytest.mark.slow
def test_compiled_steps_give_the_eager_losses():
    device = choose_device("cpu")
    config = TrainConfig(steps=3, batch_size=4, lr=1e-2, optimizer="adamw")
    eager = train(nkb_model(), batch_for_step, config, device)
    compiled = train(nkb_model(), batch_for_step, TrainConfig(**{**config.__dict__, "compile": True}), device)
    assert [s for s, _ in compiled] == [1, 2, 3]
    assert all(abs(a - b) < 1e-4 * max(1.0, abs(a)) for (_, a), (_, b) in zip(eager, compiled))


def llama_batch_for_step(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, 64, (4, 12), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def test_a_cpu_training_step_runs_the_math_attention_kernel_not_the_flash_one():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                         attn_implementation="sdpa"))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiled:
        train(model, llama_batch_for_step, TrainConfig(steps=1, batch_size=4), Device(torch.device("cpu"), None))
    ran = {event.key for event in profiled.key_averages()}
    assert "aten::_scaled_dot_product_attention_math" in ran
    assert not any("flash" in name for name in ran)


def test_the_cpu_training_attention_in_bf16_has_the_gradient_of_fp32_scores():
    """The math kernel on a CPU computes a bf16 attention's scores and softmax in fp32, as the flash kernel does: its
    gradient stays as close to float64's. Scores rounded to bf16 first (HF's eager attention, which trained worse
    slots) are ~0.03 off here; a PyTorch whose math kernel did that would fail."""
    torch.manual_seed(0)
    q, k, v = (3 * torch.randn(4, 9, 40, 64)).bfloat16(), (3 * torch.randn(4, 9, 40, 64)).bfloat16(), \
        (3 * torch.randn(4, 9, 40, 64)).bfloat16()

    def grad_of_q(dtype, attention):
        query = q.to(dtype).requires_grad_()
        with attention:
            out = torch.nn.functional.scaled_dot_product_attention(query, k.to(dtype), v.to(dtype), is_causal=True)
        out.double().pow(2).sum().backward()
        return query.grad.double()

    exact = grad_of_q(torch.float64, contextlib.nullcontext())
    trained = grad_of_q(torch.bfloat16, Device(torch.device("cpu"), torch.bfloat16).attention())
    assert (trained - exact).norm() / exact.norm() < 0.01
