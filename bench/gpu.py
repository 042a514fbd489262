"""The GPU path in one run, for the first time a GPU machine is available (`make bench-gpu`):

1. the CUDA tests (`pytest -m gpu`): zero slots bit-identical in bf16, unmounted slots give the base back, a resumed
   run equals an uninterrupted one, the export equals the mounted model;
2. injection (slots on the last block, the base frozen) and fine-tuning (every parameter) steps in bf16 autocast,
   on a T5-base-sized model (t5-base's config, random weights: speed does not depend on the values) and on a
   SmolLM2-135M-sized Llama (its config): tokens/s, model FLOPs utilisation by the project's own FLOP count
   (`bench.inject`), peak memory; and the paper's 30K-step injection (batch 256) extrapolated to hours;
3. batched greedy decoding, as the evaluate stage decodes: questions/s;
4. with more than one GPU, `devices=N` under torchrun: the same losses as one process.

Prints JSON and records `metrics` rows in `bench/results/gpu`. Without CUDA it says so in one line and exits 0.

    python -m bench.gpu [--steps 10] [--batch 64] [--record]

`--record` keeps the run in the GPU kind's record (`bench/records/gpu/`), by what it timed, and writes docs/gpu.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

from bench.recorded import (Records, dagger, gpu_kind, page_head, record_if_asked, record_option, run_line,
                            transcribed_lines)

ROOT = Path(__file__).resolve().parents[1]
RECORDS = Records("gpu")
PAGE = ROOT / "docs" / "gpu.md"
WHAT = "the GPU path: CUDA tests, training steps' MFU, decoding"
MODELS = {"t5_base": "t5-base", "smollm2_135m": "SmolLM2-135M"}
PAPER_STEPS, PAPER_BATCH = 30_000, 256  # the paper's injection: 30K steps at batch 256, 512 tokens


def gpu_tests() -> dict:
    """`pytest -m gpu` in a child process: its counts, and the names of any failing test. Only the files that hold
    GPU tests are collected: the GPU machine's image lacks what the data stages' tests import (Prefect, spaCy)."""
    files = sorted(str(f.relative_to(ROOT)) for f in (ROOT / "tests").rglob("test_*.py") if "mark.gpu" in f.read_text())
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-rfEs", *files],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|error)", out.stdout)}
    return {"returncode": out.returncode, **counts,
            "not_passed": re.findall(r"^(?:FAILED|ERROR|SKIPPED) (.+)$", out.stdout, re.M)}


def causal_forward_flops(model: nn.Module, batch: int, seq: int) -> int:
    """Matmul FLOPs of a decoder-only forward pass: 2 per linear weight and token (slots and the output head
    included, every position), plus the attention scores and weighted sums in full (4 * d_model * seq^2 a block)."""
    linear = sum(m.weight.numel() for name, m in model.named_modules() if isinstance(m, nn.Linear))
    c = model.config
    return batch * (2 * linear * seq + 4 * c.num_attention_heads * (c.hidden_size // c.num_attention_heads)
                    * c.num_hidden_layers * seq * seq)


def causal_step_flops(model: nn.Module, variant: str, batch: int, seq: int) -> int:
    """A training step's model FLOPs: three forward passes when everything trains; with only the last block's
    slots training, the forward pass plus the output head's input gradient and the slots' weight and value-input
    gradients, at every position (the matmuls run over the whole sequence; the prompt's gradients are zeros)."""
    forward = causal_forward_flops(model, batch, seq)
    if variant == "nkb-a":
        return 3 * forward
    trainable = {name: p.numel() for name, p in model.named_parameters() if p.requires_grad}
    last_block = f"layers.{model.config.num_hidden_layers - 1}."
    if not trainable or any(".nkb_" not in n or last_block not in n for n in trainable):
        raise ValueError("the NKB count assumes that only slots in the last block train")
    values = sum(n for name, n in trainable.items() if ".nkb_values." in name)
    return forward + batch * seq * (2 * model.lm_head.weight.numel() + 2 * sum(trainable.values()) + 2 * values)


def measure(build, flops, device, batch: int, prompt: int, target: int, steps: int, peak: float | None,
            compile: bool = False, hold: bool = True, mode: str | None = None,
            parts: tuple[str, ...] = ("inject", "finetune")) -> dict:
    """Injection (nkb) and fine-tuning (every parameter, as nkb-a trains) steps of `build(variant)`; with `compile`,
    through `torch.compile` (its compilation happens in the untimed warm-up step); with `hold`, the frozen base
    stored in bf16 as the inject stage holds it (`Device.hold`)."""
    from bench.inject import time_steps
    out = {}
    for name, variant in (("inject", "nkb"), ("finetune", "nkb-a")):
        if name not in parts:
            continue
        model = device.hold(build(variant)) if hold else build(variant)
        cuda = device.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        step_flops = flops(model, variant)
        seconds = time_steps(torch.compile(model, mode=mode) if compile else model, device, batch, prompt, target, steps)
        out[name] = {"step_s": round(seconds, 4), "tokens_per_s": round(batch * (prompt + target) / seconds),
                     "tflops_per_s": round(step_flops / seconds / 1e12, 3),
                     "mfu": round(step_flops / seconds / peak, 4) if peak else None,
                     "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
                     "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad)}
        print(f"bench.gpu: {name}: {out[name]}", file=sys.stderr, flush=True)  # kept if a later part times out
        del model
        if cuda:
            torch.cuda.empty_cache()
    if "inject" in out:
        out["paper_injection_hours"] = round(PAPER_STEPS * out["inject"]["step_s"] * PAPER_BATCH / batch / 3600, 2)
    return out


def greedy_throughput(model: nn.Module, device, questions: int, prompt: int, new_tokens: int) -> dict:
    """Questions per second of batched greedy decoding (`generate`, as the evaluate stage decodes)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (questions, prompt), generator=g).to(device.device)
    model.eval()
    sync = torch.cuda.synchronize if device.device.type == "cuda" else (lambda: None)
    with torch.no_grad(), device.autocast():
        model.generate(input_ids=ids[:8], max_new_tokens=2, do_sample=False, pad_token_id=0)  # warm-up
        sync()
        started = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        sync()
    seconds = time.perf_counter() - started
    return {"questions": questions, "prompt_tokens": prompt, "new_tokens": new_tokens,
            "questions_per_s": round(questions / seconds, 1)}


def data_parallel(steps: int = 6) -> dict:
    """`devices=N`: the same training under torchrun on every GPU must give one process's losses."""
    n = torch.cuda.device_count()
    if n < 2:
        return {"skipped": f"{n} GPU: data parallel needs two or more"}
    script = ("import json, os, torch\n"
              "from nkb_model.train import TrainConfig, choose_device, train\n"
              "from tests.nkb_model.test_train import batch_for_step, nkb_model\n"
              "if 'LOCAL_RANK' in os.environ: torch.distributed.init_process_group('nccl')\n"
              "d = choose_device('cuda')\n"
              f"losses = train(nkb_model().to(d.device), batch_for_step, TrainConfig(steps={steps}, batch_size=4), d)\n"
              "if 'LOCAL_RANK' not in os.environ or torch.distributed.get_rank() == 0:\n"
              "    print('LOSSES', json.dumps(losses))\n")
    worker = ROOT / "bench" / "results" / "ddp_worker.py"
    worker.parent.mkdir(parents=True, exist_ok=True)
    worker.write_text(script)

    def losses(argv: list[str]) -> list:
        out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        line = next((x for x in out.stdout.splitlines() if x.startswith("LOSSES ")), None)
        if line is None:
            raise RuntimeError(f"{' '.join(argv)}: {out.stderr[-500:]}")
        return json.loads(line.removeprefix("LOSSES "))

    one = losses([sys.executable, str(worker)])
    many = losses([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", str(worker)])
    close = all(abs(a[1] - b[1]) < 1e-3 * max(1.0, abs(a[1])) for a, b in zip(one, many))
    return {"gpus": n, "same_losses": close and len(one) == len(many), "one": one, "data_parallel": many}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per measurement (after one "
                                                              "warm-up)")
    parser.add_argument("--batch", type=int, default=64, help="sequences per step (the paper's 256 is extrapolated)")
    parser.add_argument("--home", default="bench/results/gpu", help="benchmark warehouse")
    parser.add_argument("--skip-tests", action="store_true", help="leave out the CUDA tests")
    parser.add_argument("--only", choices=("t5_base", "smollm2_135m"), help="measure one model only")
    parser.add_argument("--compile", action="store_true", help="time the training steps through torch.compile")
    parser.add_argument("--mode", choices=("default", "max-autotune-no-cudagraphs", "reduce-overhead"),
                        help="torch.compile's mode, with --compile")
    parser.add_argument("--parts", nargs="+", choices=("inject", "finetune"), default=("inject", "finetune"),
                        help="which training steps to time (fine-tuning's compilation takes a minute of a short lease)")
    parser.add_argument("--frozen-fp32", action="store_true", help="keep the frozen base in fp32 under bf16 autocast "
                                                                   "(before: the inject stage holds it in bf16)")
    record_option(parser)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.gpu: skipped: no CUDA GPU on this machine (torch.cuda.is_available() is False)")
        return 0

    from transformers import AutoModelForCausalLM, LlamaConfig

    from bench.inject import PEAK_BF16, SMOLLM2_135M, T5_BASE, model_for, prepared, step_flops
    from nkb_model.train import choose_device
    device = choose_device("cuda")
    name = torch.cuda.get_device_name(0)
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    started = time.perf_counter()
    result = {"benchmark": "gpu", "device": name, "gpus": torch.cuda.device_count(), "torch": torch.__version__,
              "peak_bf16_flops": peak, "precision": "bf16 autocast (the stages' choice on CUDA)"}
    result["tests"] = {"skipped": "--skip-tests"} if args.skip_tests else gpu_tests()

    batch = args.batch
    if args.only in (None, "t5_base"):
        result["t5_base"] = {"model": "t5-base config, random weights, slots on decoder.-1 (3,072)",
                             "batch": f"{batch} x (512 in + 16 out)", "compiled": args.compile,
                             "frozen_base": "fp32" if args.frozen_fp32 else "bf16",
                             **measure(lambda v: model_for(T5_BASE, v, device),
                                       lambda m, v: step_flops(m, v, batch, 512, 16), device, batch, 512, 16,
                                       args.steps, peak, args.compile, not args.frozen_fp32, args.mode, args.parts)}
        t5 = model_for(T5_BASE, "nkb", device)
        result["t5_base"]["greedy"] = greedy_throughput(t5, device, 512, 32, 8)
        del t5

    def smollm2(variant: str) -> nn.Module:
        torch.manual_seed(0)
        return prepared(AutoModelForCausalLM.from_config(LlamaConfig(**SMOLLM2_135M)), variant, device)

    if args.only in (None, "smollm2_135m"):
        result["smollm2_135m"] = {"model": "SmolLM2-135M config, random weights, slots on layers.-1",
                                  "batch": f"{batch} x (496 prompt + 16 target)", "compiled": args.compile,
                                  "frozen_base": "fp32" if args.frozen_fp32 else "bf16",
                                  **measure(smollm2, lambda m, v: causal_step_flops(m, v, batch, 512), device,
                                            batch, 496, 16, args.steps, peak, args.compile, not args.frozen_fp32,
                                            args.mode, args.parts)}
        model = smollm2("nkb")
        result["smollm2_135m"]["greedy"] = greedy_throughput(model, device, 512, 32, 8)
        del model
    result["data_parallel"] = data_parallel()
    result["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, indent=1))

    from bench import record
    from warehouse import Warehouse
    models = [m for m in ("t5_base", "smollm2_135m") if m in result]
    flat = {f"{m}.{part}.{k}": v for m in models for part in ("inject", "finetune", "greedy")
            if part in result[m] for k, v in result[m][part].items()}
    flat.update({f"{m}.paper_injection_hours": result[m]["paper_injection_hours"] for m in models
                 if "paper_injection_hours" in result[m]})
    flat.update({f"tests.{k}": v for k, v in result["tests"].items()})
    config = {"steps": args.steps, "batch": batch, "only": args.only, "compile": args.compile,
              "frozen_fp32": args.frozen_fp32, "mode": args.mode, "parts": list(args.parts)}
    record(Warehouse(args.home), "gpu", flat, config)
    record_if_asked(args, __name__, result, argv)
    tests = result["tests"]
    return 1 if tests.get("failed") or tests.get("error") or tests.get("returncode", 0) not in (0, 5) else 0


def kind_of(result: dict) -> dict:
    return gpu_kind(result["device"])


def timed(result: dict) -> list[tuple[str, str, dict]]:
    """(model key, part, its figures) of every training step a run timed."""
    return [(m, part, result[m][part]) for m in MODELS if m in result for part in ("inject", "finetune")
            if part in result[m]]


def label(result: dict) -> str:
    return "; ".join(f"{MODELS[m]} {part} at batch {result[m]['batch'].split()[0]}, "
                     f"{'compiled' if result[m]['compiled'] else 'eager'}, frozen base {result[m]['frozen_base']}"
                     for m, part, _ in timed(result))


def headline(record: dict) -> str:
    best = max(((run, m, figures) for run in record["runs"].values() for m, part, figures in timed(run["result"])
                if part == "inject"), key=lambda found: found[2]["mfu"] or 0)
    run, model, figures = best
    hours = run["result"][model].get("paper_injection_hours")
    return (f"{MODELS[model]} injection at {100 * figures['mfu']:.1f} % MFU ({run['commit']})"
            + (f"; the paper's 30K-step injection {hours} h" if hours else ""))


def page(records: list[dict]) -> str:
    lines = page_head("The GPU path", RECORDS.name,
                      "`python -m bench.gpu` on a lent GPU machine: the CUDA tests (`pytest -m gpu`), training steps in "
                      "bf16 autocast on random weights of each model's config (speed does not depend on the values): "
                      "injection (slots on the last block, the base frozen and held in bf16 unless the row says fp32) "
                      "and fine-tuning (every parameter); model FLOPs by the project's own count (`bench.inject`), MFU "
                      "against the card's dense bf16 datasheet peak; the paper's injection (30K steps at batch 256) "
                      "extrapolated from the step time; batched greedy decoding (512 questions, 32 prompt and 8 new "
                      "tokens). Remade by `python -m bench.gpu --record` (with `--compile`, `--batch`, `--only`, "
                      "`--parts` for each row).")
    for record in records:
        lines += [f"## {record['machine']['name']}", "", *transcribed_lines(record["runs"].values()),
                  "| model, step | batch | frozen base | compiled | s/step | MFU | peak GiB | the paper's injection, h "
                  "| commit, date |", "|---|---|---|---|---|---|---|---|---|"]
        for run in record["runs"].values():
            for model, part, f in timed(run["result"]):
                place = run["result"][model]
                peak = f"{f['peak_memory_gib']}" if f.get("peak_memory_gib") is not None else "-"
                lines.append(f"| {MODELS[model]}, {part} | {place['batch'].split()[0]} | "
                             f"{place['frozen_base'] if part == 'inject' else '(all trained)'} | "
                             f"{'yes' if place['compiled'] else 'no'} | {f['step_s']} | {100 * f['mfu']:.1f} % | {peak} | "
                             f"{place.get('paper_injection_hours', '-') if part == 'inject' else ''} | "
                             f"{run['commit']}, {run['date']}{dagger(run)} |")
        lines.append("")
        for name, run in record["runs"].items():
            tests = run["result"].get("tests", {})
            greedy = [f"{MODELS[m]} {run['result'][m]['greedy']['questions_per_s']:,.0f}" for m in MODELS
                      if "greedy" in run["result"].get(m, {})]
            lines.append(f"- {name}: {run_line(run)}; torch {run['result']['torch']}; CUDA tests "
                         + (f"{tests.get('passed', 0)} passed, {tests.get('failed', 0)} failed, "
                            f"{tests.get('skipped', 0)} skipped" if "passed" in tests else "not run")
                         + (f"; greedy decoding, questions/s: {', '.join(greedy)}" if greedy else "") + ".")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
