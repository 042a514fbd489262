"""The GPU benchmark's parts that do not need a GPU: its decoder-only FLOP count against PyTorch's counter, its
measurements on a tiny CPU model, and its one-line skip where there is no CUDA (as in CI)."""

import subprocess
import sys

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM, LlamaConfig

from bench.gpu import causal_step_flops, greedy_throughput, measure
from bench.inject import prepared
from nkb_model.train import choose_device

TINY = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=300, tie_word_embeddings=True)


def tiny_llama(variant: str):
    torch.manual_seed(0)
    return prepared(AutoModelForCausalLM.from_config(LlamaConfig(**TINY)), variant, choose_device("cpu"))


@pytest.mark.parametrize("variant", ["nkb", "nkb-a"])
def test_decoder_only_step_flops_equal_pytorchs_count(variant):
    model = tiny_llama(variant)
    batch, seq, target = 2, 20, 4
    ids = torch.randint(3, 300, (batch, seq), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[:, :seq - target] = -100
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=labels).loss.backward()
    assert causal_step_flops(model, variant, batch, seq) == counter.get_total_flops()


def test_the_measurements_run_on_any_device():
    cpu = choose_device("cpu")
    result = measure(tiny_llama, lambda m, v: causal_step_flops(m, v, 2, 12), cpu, 2, 8, 4, 1, None)
    assert result["inject"]["trainable"] < result["finetune"]["trainable"]
    assert result["inject"]["tokens_per_s"] > 0 and result["paper_injection_hours"] > 0
    assert greedy_throughput(tiny_llama("nkb"), cpu, 4, 6, 3)["questions_per_s"] > 0
    only_inject = measure(tiny_llama, lambda m, v: causal_step_flops(m, v, 2, 12), cpu, 2, 8, 4, 1, None,
                          parts=("inject",))
    assert "finetune" not in only_inject and only_inject["paper_injection_hours"] > 0


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip without CUDA")
def test_without_cuda_it_says_so_in_one_line_and_succeeds():
    out = subprocess.run([sys.executable, "-m", "bench.gpu"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().splitlines() == [
        "bench.gpu: skipped: no CUDA GPU on this machine (torch.cuda.is_available() is False)"]
