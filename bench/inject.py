"""Injection benchmark: step time and tokens/s of NKB (slots only, base frozen) vs NKB-a (everything),
at the same batch, on CPU, for the T5 base and for decoder-only bases of the same size (Llama, GPT-2: the
prompt and the target read as one sequence, the loss on the target), with slots on the last block and on every
block (as `nkb demo --arch` mounts them); and, when a CUDA GPU is present, the same
for a randomly initialised T5-base-sized model in bf16 with model FLOPs utilisation (MFU). Without a GPU that
part says it is skipped. Prints JSON and records `metrics` rows in `bench/results/inject`.

    python -m bench.inject [--steps 5] [--size small] [--record]

MFU counts model FLOPs from the model's structure (`step_flops`): each linear layer's matmuls on the
tokens it actually sees (the encoder's, and the decoder's cross-attention keys and values, on the input;
the rest of the decoder and the LM head on the target), plus the attention products. NKB-a's step is
three forward passes' worth. NKB's is one forward pass plus the only backward work there is when the
slots of the last decoder block alone train: the gradient through the LM head to the hidden states, and
the slots' own weight and input gradients. A test checks the count against PyTorch's FLOP counter.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable

import torch
from torch import nn
from transformers import T5Config, T5ForConditionalGeneration

from bench.recorded import ROOT, Records, kind_title, page_head, record_if_asked, record_option, run_line, this_cpu
from nkb_model.base_model import FEED_FORWARD, SIZES, causal_config
from nkb_model.architectures import ARCHITECTURES
from nkb_model.families import family, family_of
from nkb_model.nkb import NKBConfig, mark_only_nkb_trainable, mount_nkb
from nkb_model.train import Device, TrainConfig, choose_device, make_optimizer

# Dense bf16 peak FLOP/s by GPU name fragment (vendor data sheets, without sparsity).
# More specific names first: an "H100 PCIe" also contains "H100".
PEAK_BF16 = {"H200": 989e12, "H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "A100": 312e12,
             "L40S": 362e12, "A10G": 125e12, "L4": 121e12}
# SmolLM2-135M's shape (its config.json): Llama, 30 blocks, d_model 576, gated FFN 1,536, 9 heads of which 3 for keys
# and values, tied embeddings, a 49,152-token vocabulary.
SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=8192,
                    rms_norm_eps=1e-5, rope_theta=100000.0)
T5_BASE = dict(d_model=768, d_ff=3072, num_layers=12, num_decoder_layers=12, num_heads=12, d_kv=64,
               feed_forward_proj="relu", vocab_size=32128)


def model_for(arch: dict, variant: str, device: Device) -> T5ForConditionalGeneration:
    """A random T5 of `arch` (T5Config fields) with slots on its last decoder block, set up to train as `variant`."""
    torch.manual_seed(0)
    return prepared(T5ForConditionalGeneration(T5Config(dropout_rate=0.0, decoder_start_token_id=0, **arch)), variant,
                    device)


def causal_model_for(arch: str, size: str, vocab_size: int, variant: str, device: Device,
                     layers: tuple[str, ...] = ("decoder.-1",)) -> nn.Module:
    """A random decoder-only base of our `size` (Llama or GPT-2), with slots on `layers`."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    return prepared(AutoModelForCausalLM.from_config(causal_config(arch, size, vocab_size, 1, 0)), variant, device,
                    layers)


def prepared(model: nn.Module, variant: str, device: Device, layers: tuple[str, ...] = ("decoder.-1",)) -> nn.Module:
    mount_nkb(model, NKBConfig(layers=list(layers)))
    if variant == "nkb":
        mark_only_nkb_trainable(model)
        model.eval()
    else:
        model.train()
    return model.to(device.device)


def time_steps(model, device: Device, batch: int, input_len: int, target_len: int, steps: int) -> float:
    """Median seconds per optimizer step (after one warm-up step)."""
    vocab = model.config.vocab_size
    x = torch.randint(3, vocab, (batch, input_len), device=device.device)
    y = torch.randint(3, vocab, (batch, target_len), device=device.device)
    return median_step(model, family(model).training_inputs(x, y), device, steps)


def median_step(module: nn.Module, inputs: dict, device: Device, steps: int) -> float:
    """Median seconds of an optimizer step of `module(**inputs).loss` over its trainable parameters (after one
    warm-up step)."""
    optimizer = make_optimizer([p for p in module.parameters() if p.requires_grad],
                               TrainConfig(steps=steps, batch_size=1))
    sync = torch.cuda.synchronize if device.device.type == "cuda" else (lambda: None)
    times = []
    for i in range(steps + 1):
        sync()
        t = time.perf_counter()
        with device.autocast():
            loss = module(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        if i:
            times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def forward_flops(model: T5ForConditionalGeneration, batch: int, input_len: int, target_len: int) -> int:
    """Matmul FLOPs of one forward pass: 2 per weight and token for every linear layer (NKB slots included),
    on the tokens it sees, plus the attention scores and weighted sums (4 * inner * queries * keys a layer)."""
    def linear_weights(module: nn.Module, suffixes: tuple[str, ...] = ("",)) -> int:
        return sum(m.weight.numel() for name, m in module.named_modules()
                   if isinstance(m, nn.Linear) and name.endswith(suffixes))

    cross_kv = linear_weights(model.decoder, ("EncDecAttention.k", "EncDecAttention.v"))  # read the input
    on_input = linear_weights(model.encoder) + cross_kv
    on_target = linear_weights(model.decoder) - cross_kv + model.lm_head.weight.numel()
    c = model.config
    inner = c.num_heads * c.d_kv
    attention = 4 * inner * (c.num_layers * input_len ** 2
                             + c.num_decoder_layers * (target_len ** 2 + target_len * input_len))
    return batch * (2 * (on_input * input_len + on_target * target_len) + attention)


def step_flops(model: T5ForConditionalGeneration, variant: str, batch: int, input_len: int, target_len: int) -> int:
    """Model FLOPs of one training step. Backward costs twice the forward when everything trains (NKB-a);
    with only the last decoder block's slots trainable (NKB) it is the LM head's input gradient (2 per weight
    and target token), the slots' weight gradients (2 per slot weight) and the values' input gradient (2 per
    value weight; the keys' inputs need none)."""
    forward = forward_flops(model, batch, input_len, target_len)
    if variant == "nkb-a":
        return 3 * forward
    trainable = {name: p.numel() for name, p in model.named_parameters() if p.requires_grad}
    last_block = f"decoder.block.{len(model.decoder.block) - 1}."
    if not trainable or any(".nkb_" not in n or not n.startswith(last_block) for n in trainable):
        raise ValueError("the NKB count assumes that only slots in the last decoder block train")
    values = sum(n for name, n in trainable.items() if ".nkb_values." in name)
    return forward + batch * target_len * (2 * model.lm_head.weight.numel() + 2 * sum(trainable.values()) + 2 * values)


def compare(build: Callable[[str], nn.Module], device: Device, batch: int, input_len: int, target_len: int,
            steps: int) -> dict:
    """Both variants' (`build(variant)`) step time and throughput; FLOPs (for MFU) are counted for T5s only."""
    out = {}
    for variant in ("nkb", "nkb-a"):
        model = build(variant)
        seconds = time_steps(model, device, batch, input_len, target_len, steps)
        tokens = batch * (input_len + target_len)
        out[variant] = {"step_s": round(seconds, 4), "tokens_per_s": round(tokens / seconds, 1),
                        "params": sum(p.numel() for p in model.parameters()),
                        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad)}
        if family(model).has_encoder:  # the FLOPs count is T5's
            flops = step_flops(model, variant, batch, input_len, target_len)
            out[variant] |= {"flops_per_step": flops, "flops_per_s": round(flops / seconds)}
        del model
    out["nkb_over_nkb_a_step_time"] = round(out["nkb"]["step_s"] / out["nkb-a"]["step_s"], 3)
    return out


def cached_vs_uncached(device: Device, batch: int, prompt_len: int, target_len: int, steps: int,
                       layers: tuple[str, ...] = ("decoder.-2", "decoder.-1")) -> dict:
    """Injection on a SmolLM2-135M-sized Llama (its config, random weights: the speed is the same) with slots on
    `layers`, side by side: the uncached step (every block forward, the head on every position) and the cached one
    (`nkb_model.prefix_cache`: the frozen blocks below the slots once per segment, then the tail alone). Both train
    the same slots on the same sequences; tokens/s counts each sequence's tokens once a step in both."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from nkb_model.prefix_cache import CachedTail, first_trainable_block, prefix_states
    torch.manual_seed(0)
    model = prepared(AutoModelForCausalLM.from_config(LlamaConfig(**SMOLLM2_135M)), "nkb", device, layers)
    k = first_trainable_block(model)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (batch, prompt_len + target_len), generator=g).to(device.device)
    mask = torch.ones_like(ids)
    labels = torch.cat([torch.full_like(ids[:, :prompt_len], -100), ids[:, prompt_len:]], 1)
    sync = torch.cuda.synchronize if device.device.type == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    with device.autocast():
        states = prefix_states(model, ids, mask, k).float()  # what the cache holds: once per segment
    sync()
    cache_s = time.perf_counter() - t
    tail = CachedTail(model, k)
    paths = {"uncached": (model, {"input_ids": ids, "attention_mask": mask, "labels": labels}),
             "cached": (tail, {"inputs_embeds": states, "attention_mask": mask, "labels": labels})}
    out = {"model": f"SmolLM2-135M config, slots on {', '.join(layers)} (blocks {k}.. of "
                    f"{model.config.num_hidden_layers})", "batch": f"{batch} x ({prompt_len} + {target_len})"}
    for name, (module, inputs) in paths.items():
        step = median_step(module, inputs, device, steps)
        out[name] = {"step_s": round(step, 4), "tokens_per_s": round(batch * (prompt_len + target_len) / step, 1)}
    out["cache_s_per_segment"] = round(cache_s / batch, 5)
    out["cached_over_uncached_tokens_per_s"] = round(out["cached"]["tokens_per_s"] / out["uncached"]["tokens_per_s"],
                                                     2)
    # With the cache's one pass per segment counted: the speed-up over `epochs` passes of injection over the data.
    for epochs in (1, 10):
        cost = epochs * out["cached"]["step_s"] + out["cache_s_per_segment"] * batch
        out[f"speedup_with_cache_build_{epochs}_epochs"] = round(epochs * out["uncached"]["step_s"] / cost, 2)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant (after one warm-up)")
    parser.add_argument("--size", default="small", choices=list(SIZES), help="model size for the CPU comparison")
    parser.add_argument("--home", default="bench/results/inject", help="benchmark warehouse")
    record_option(parser)
    args = parser.parse_args(argv)

    result = {"benchmark": "inject"}
    cpu = choose_device("cpu")
    arch = dict(SIZES[args.size], feed_forward_proj=FEED_FORWARD, vocab_size=4100)
    result["cpu"] = {"model": args.size, "batch": "64 x (64 in + 8 out)",
                     **compare(lambda v: model_for(arch, v, cpu), cpu, 64, 64, 8, args.steps)}
    # Decoder-only bases of the same size: 72-token sequences, the loss on the last 8; slots on the last block, and
    # on every block as `nkb demo --arch` mounts them (the backward then runs through the whole stack).
    for arch_name in (name for name in ARCHITECTURES if not family_of(name).has_encoder):
        for where, layers in (("last", ("decoder.-1",)), ("all", tuple(f"decoder.{i}" for i in range(8)))):
            layers = layers[:SIZES[args.size]["num_layers"] + SIZES[args.size]["num_decoder_layers"]]
            result[f"cpu_{arch_name}_{where}"] = {
                "model": f"{args.size} {arch_name}, slots on {', '.join(layers)}", "batch": "64 x (64 prompt + 8 target)",
                **compare(lambda v: causal_model_for(arch_name, args.size, 4100, v, cpu, layers), cpu, 64, 64, 8,
                          args.steps)}
    # Cached against uncached injection at two lengths: a short training sentence, and an example cut from a
    # Wikipedia passage (segments of up to 300 words; the text up to a span halfway through, ~190 tokens).
    for where, prompt_len in (("cpu_smollm2_cached", 56), ("cpu_smollm2_cached_passage", 192)):
        result[where] = cached_vs_uncached(cpu, 16, prompt_len, 8, max(2, args.steps // 2))
    if torch.cuda.is_available():
        gpu = choose_device("cuda")
        name = torch.cuda.get_device_name(0)
        peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
        gpu_result = compare(lambda v: model_for(T5_BASE, v, gpu), gpu, 64, 512, 16, args.steps)
        for variant in ("nkb", "nkb-a"):
            r = gpu_result[variant]
            r["mfu"] = round(r["flops_per_s"] / peak, 4) if peak else None
        result["gpu"] = {"device": name, "model": "T5-base-sized, random init, bf16 autocast",
                         "batch": "64 x (512 in + 16 out)", "peak_bf16_flops": peak, **gpu_result}
    else:
        result["gpu"] = "skipped: no CUDA GPU on this machine"
    print(json.dumps(result, indent=1))

    from bench import record
    from warehouse import Warehouse
    places = [w for w in result if w.startswith(("cpu", "gpu")) and isinstance(result[w], dict) and "nkb" in result[w]]
    flat = {f"{where}.{variant}.{k}": v for where in places
            for variant in ("nkb", "nkb-a") for k, v in result[where][variant].items()}
    flat.update({f"{w}.nkb_over_nkb_a_step_time": result[w]["nkb_over_nkb_a_step_time"] for w in places})
    for where in ("cpu_smollm2_cached", "cpu_smollm2_cached_passage"):
        cached = result[where]
        flat.update({f"{where}.{path}.{k}": v for path in ("cached", "uncached") for k, v in cached[path].items()})
        flat.update({f"{where}.{k}": v for k, v in cached.items()})
    record(Warehouse(args.home), "inject", flat, {"steps": args.steps, "size": args.size})
    record_if_asked(args, __name__, result, argv)
    return 0


RECORDS = Records("inject")
PAGE = ROOT / "docs" / "inject.md"
WHAT = "injection's speed on CPU: the slots against every parameter, the segment cache"
kind_of = this_cpu
CACHED = {"cpu_smollm2_cached": "a training sentence", "cpu_smollm2_cached_passage": "a passage's text up to a span"}


def label(result: dict) -> str:
    return f"{result['cpu']['model']} models"


def headline(record: dict) -> str:
    run = next(iter(record["runs"].values()))
    ratios = [run["result"][key]["cached_over_uncached_tokens_per_s"] for key in CACHED if key in run["result"]]
    return (f"cached injection on SmolLM2 {min(ratios)}-{max(ratios)}x the uncached tokens/s; slots alone "
            f"{run['result']['cpu']['nkb_over_nkb_a_step_time']}x NKB-a's step time on T5 ({run['commit']})")


def page(records: list[dict]) -> str:
    lines = page_head("Injection's speed on CPU", RECORDS.name,
                      "`python -m bench.inject`: training steps of the slots alone (NKB, the base frozen) against every "
                      "parameter (NKB-a) at the same batch, on models of the project's own sizes (random weights: speed "
                      "does not depend on the values), and on SmolLM2-135M's config the injection the inject stage runs "
                      "on its segment cache (the states entering the lowest slot block read off the cache; the blocks "
                      "above, and the head at the target positions only) against training through the whole model. "
                      "Median step time after one warm-up; fp32. Remade by `python -m bench.inject --record`.")
    for record in records:
        lines += [f"## {kind_title(record['machine'])}", ""]
        for name, run in record["runs"].items():
            result = run["result"]
            lines += [f"### {name}", "", f"Measured at {run_line(run)}.", "",
                      "| model | batch | NKB s/step | NKB-a s/step | NKB ÷ NKB-a step time |", "|---|---|---|---|---|"]
            for key, place in result.items():
                if key.startswith("cpu") and isinstance(place, dict) and "nkb" in place:
                    lines.append(f"| {place['model']} | {place['batch']} | {place['nkb']['step_s']} | "
                                 f"{place['nkb-a']['step_s']} | {place['nkb_over_nkb_a_step_time']} |")
            lines += ["", "| SmolLM2-135M, sequence | uncached s/step | cached s/step | tokens/s ratio | cache build, s "
                          "per segment | 10 epochs with the cache's build |", "|---|---|---|---|---|---|"]
            for key, what in CACHED.items():
                if key in result:
                    c = result[key]
                    lines.append(f"| {what}, {c['batch']} | {c['uncached']['step_s']} | {c['cached']['step_s']} | "
                                 f"**{c['cached_over_uncached_tokens_per_s']}x** | {c['cache_s_per_segment']} | "
                                 f"{c['speedup_with_cache_build_10_epochs']}x |")
            lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
