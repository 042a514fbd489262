"""The injection profile's accounting: its steps are the training loop's own, every profiled operator's time is
counted under one kind, and the matrix-product probe runs at the step's size."""

from types import SimpleNamespace

import pytest
import torch

from bench.inject import causal_model_for
from bench.profile_inject import cpu_of, ffn_matmul_speed, profiled_steps, step_flops, work_of
from nkb_model.families import family
from nkb_model.train import TrainConfig, choose_device

VOCAB = 300


def test_operators_are_sorted_by_kind():
    assert work_of("aten::mm") == work_of("aten::addmm") == work_of("aten::linear") == "matmul"
    assert work_of("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert work_of("Optimizer.step#Adafactor.step") == "optimizer"
    assert work_of("aten::copy_") == "copies"
    assert work_of("aten::mul") == work_of("aten::silu") == "other"


def test_the_cpu_is_named_by_its_family_and_model_numbers_where_its_name_is_the_vendors_alone():
    cpuinfo = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
               "model name\t: AMD EPYC\nflags\t\t: fpu avx512f avx512_bf16\n\nprocessor\t: 1\ncpu family\t: 25\n")
    assert cpu_of(cpuinfo) == {"cpu": "AMD EPYC", "cpu_family": 26, "cpu_model": 2, "avx512_bf16": True,
                               "amx_bf16": False}


@pytest.mark.slow  # a model trained under the profiler: ~10 s
def test_profiled_steps_are_the_training_loops_and_their_time_is_all_counted():
    device = choose_device("cpu")
    model = causal_model_for("llama", "tiny", VOCAB, "nkb", device)
    generator = torch.Generator().manual_seed(0)
    batch = family(model).training_inputs(torch.randint(3, VOCAB, (2, 12), generator=generator),
                                          torch.randint(3, VOCAB, (2, 4), generator=generator))
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])  # as the pair batches give it
    hooked = []
    config = SimpleNamespace(train_config=lambda steps: TrainConfig(steps=steps, batch_size=2))
    result = profiled_steps(model, lambda step: batch, config, device, lambda: hooked.append(1), warmup=2, steps=3)
    assert len(hooked) == 5  # the stage's after-step hook runs after every step, profiled or not
    assert result["steps_per_second"] > 0
    shares = {k: v for k, v in result.items() if k.startswith("share_")}
    assert shares["share_matmul"] > 0 and abs(sum(shares.values()) - 100) < 0.5
    assert len(result["top_operators"]) == 10

    speed = ffn_matmul_speed(model, batch, device, repeats=2)
    width, inner = model.config.hidden_size, model.config.intermediate_size
    assert speed["matmul_shape"] == f"{batch['attention_mask'].numel()}x{width} @ {width}x{inner}"
    assert speed["matmul_gflops_bf16"] > 0 and speed["matmul_gflops_fp32"] > 0

    from torch.utils.flop_counter import FlopCounterMode
    with device.attention(), FlopCounterMode(display=False) as forward_only:  # the kernel a training step runs
        loss = model(**batch).loss
    with FlopCounterMode(display=False) as backward_only:
        loss.backward()
    flops = step_flops(model, lambda step: batch, config, device)
    assert backward_only.get_total_flops() > 0
    assert flops == forward_only.get_total_flops() + backward_only.get_total_flops()  # one step: both passes
    assert flops == step_flops(model, lambda step: batch, config, device, steps=3)  # per step, whatever the count
