"""Where an injection's time goes on this machine: the demo's injection (or any route of an experiment) set up as
the inject stage sets it up, then a few of its steps under PyTorch's profiler, with what the CPU can do beside it.

    python -m bench.profile_inject --home .nkb [--row base+nkb] [--steps 30] [--warmup 10] [--set KEY=VALUE] [--record]

Prints, and records as `metrics` rows in `bench/results/profile_inject`:
- the machine: CPU model, the instruction sets bf16 matrix products can use (AVX512-BF16, AMX), PyTorch's CPU
  capability and thread count; the precision the stage chose (`precision`) and the one asked for;
- the set-up's seconds: the base loaded (and, with `own_text_weight`, the base's own text written), the blocks below
  the trained ones cached over the corpus;
- the profiled steps (after `--warmup` steps, which also take the questions `qa_order: before` puts first): steps a
  second, and their time by kind of work (matrix products, attention, the optimizer,
  the rest), with the ten operators of most time;
- the matrix products one block's FFN does at the step's size, alone, in bf16 and fp32 (GFLOP/s): what this CPU
  gives the work that dominates a step. Two machines whose steps differ while these agree lose the time elsewhere;
- a step's GFLOP (PyTorch's FLOP counter, forward and backward) and the GFLOP/s the steps ran at, beside the
  product's own.

Nothing is written to the experiment's warehouse: the steps train a copy that is dropped.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections import defaultdict

from bench.recorded import ROOT, Records, kind_title, page_head, record_if_asked, record_option, run_line, this_cpu
from stages.configs import FIELD_ROUTES
from stages.experiment import SAMPLE_WORLD_SMOLLM2

# Operator name fragments by kind of work; the first that matches names an operator's kind.
KINDS = (("matmul", ("mm", "matmul", "linear", "addmm", "bmm", "baddbmm", "mkldnn")),
         ("attention", ("attention", "softmax", "sdpa", "flash")),
         ("optimizer", ("optimizer", "adafactor", "clip_grad", "foreach", "_fused")),
         ("copies", ("copy_", "to_copy", "_to_copy", "cat", "clone", "contiguous", "index", "gather", "scatter")))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", required=True, help="the warehouse the experiment built (its base, data, spans)")
    parser.add_argument("--experiment", default=str(SAMPLE_WORLD_SMOLLM2), help="the experiment file it ran")
    parser.add_argument("--row", default="base+nkb",
                        help=f"the route profiled: base+nkb, {', '.join(FIELD_ROUTES)}")
    parser.add_argument("--steps", type=int, default=30, help="steps profiled")
    parser.add_argument("--warmup", type=int, default=10, help="steps run first, not profiled")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an experiment setting, e.g. stages.inject.precision=fp32 (repeatable)")
    parser.add_argument("--results", default="bench/results/profile_inject", help="benchmark warehouse for the figures")
    record_option(parser)
    args = parser.parse_args(argv)
    if args.steps < 2 or args.warmup < 0:
        parser.error("--steps: at least 2 (a rate needs two step ends); --warmup: 0 or more")

    from bench import record
    from bench.levers import route
    from warehouse import Warehouse, WarehouseError
    try:
        wh = Warehouse(args.home, create=False)  # a mistyped --home: no warehouse there, not a new empty one
        _, inject, _ = route(wh, args.experiment, args.row, args.set)
    except (ValueError, WarehouseError) as exc:
        parser.error(str(exc))

    result = {"row": args.row, "sets": args.set, "warmup": args.warmup, "steps": args.steps, **machine()}
    model, trained, batches, device, after, setup = prepared(wh, inject, args.warmup + args.steps)
    result.update(setup)
    result.update(profiled_steps(trained, batches, inject, device, after, args.warmup, args.steps))
    result.update(ffn_matmul_speed(model, batches(args.warmup), device))
    result["step_gflop"] = round(step_flops(trained, batches, inject, device) / 1e9, 2)
    result["step_gflops"] = round(result["step_gflop"] * result["steps_per_second"], 1)  # beside matmul_gflops_*
    record(Warehouse(args.results), "profile_inject", result, vars(args))
    print(json.dumps(result, indent=1))
    record_if_asked(args, __name__, result, argv)
    return 0


RECORDS = Records("profile_inject")
PAGE = ROOT / "docs" / "profile-inject.md"
WHAT = "where an injection step's time goes"
kind_of = this_cpu


def label(result: dict) -> str:
    return " ".join([result["row"], *result["sets"], f"after {result['warmup']} steps, {result['steps']} profiled"])


def headline(record: dict) -> str:
    return "; ".join(f"{name}: {run['result']['steps_per_second']} steps/s, matrix products "
                     f"{run['result'].get('share_matmul', 0)} % of the time ({run['commit']})"
                     for name, run in record["runs"].items())


def page(records: list[dict]) -> str:
    lines = page_head("Where an injection step's time goes", RECORDS.name,
                      "`python -m bench.profile_inject --home WAREHOUSE`: the demo's injection (or a route's) set up "
                      "as the inject stage sets it up in the warehouse of a `make demo`, then steps of its training "
                      "loop under PyTorch's profiler, by kind of work (the operators' own CPU time); beside them, one "
                      "FFN's up-projection alone at the step's size in bf16 and fp32, and a step's GFLOP by PyTorch's "
                      "FLOP counter with the rate the steps ran at. Remade by `python -m bench.profile_inject --home "
                      "H --warmup W --steps S --record`.")
    for record in records:
        lines += [f"## {kind_title(record['machine'])}", "",
                  "| steps profiled | steps a second | matrix products | attention | copies | optimizer | the rest | "
                  "a step's GFLOP, run at GFLOP/s | the FFN's product alone, bf16 / fp32 GFLOP/s | commit, date |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for name, run in record["runs"].items():
            r = run["result"]
            lines.append(f"| {name} | **{r['steps_per_second']}** | {r.get('share_matmul', 0)} % | "
                         f"{r.get('share_attention', 0)} % | {r.get('share_copies', 0)} % | {r.get('share_optimizer', 0)} % | "
                         f"{r.get('share_other', 0)} % | {r['step_gflop']}, {r['step_gflops']} | "
                         f"{r['matmul_gflops_bf16']} / {r['matmul_gflops_fp32']} ({r['matmul_tokens']} tokens) | "
                         f"{run['commit']}, {run['date']} |")
        lines.append("")
        for name, run in record["runs"].items():
            r = run["result"]
            lines += [f"- {name}: {run_line(run)}; precision {r['precision']}, PyTorch {r['torch']} (CPU capability "
                      f"{r['torch_cpu_capability']}, {r['torch_threads']} threads); set-up: the base loaded "
                      f"{r['setup_load_seconds']} s, the batches and the segment cache {r['setup_batches_seconds']} s. "
                      f"The top operators: {'; '.join(r['top_operators'][:5])}."]
        lines.append("")
    return "\n".join(lines)


def machine() -> dict:
    """The CPU and what PyTorch makes of it."""
    import torch
    try:
        cpu = cpu_of(open("/proc/cpuinfo", encoding="utf-8").read())
    except OSError:  # not Linux: the flags stay unknown
        cpu = {"cpu": platform.processor(), "avx512_bf16": False, "amx_bf16": False}
    return {**cpu, "torch": torch.__version__, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads()}


def cpu_of(cpuinfo: str) -> dict:
    """/proc/cpuinfo's first processor: its model name, family and model numbers, and whether it has bf16 units.
    A virtual machine's model name may be the vendor's alone (`AMD EPYC`); the family and model numbers still tell
    its generation apart (AMD's family 25 is Zen 3 and Zen 4, 26 is Zen 5), and with it how fast its bf16 units are."""
    found, flags = {"cpu": platform.processor()}, set()
    for line in cpuinfo.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "model name":
            found["cpu"] = value
        elif key in ("cpu family", "model") and value.isdigit():
            found["cpu_" + key.removeprefix("cpu ")] = int(value)
        elif key == "flags":
            flags = set(value.split())
            break
    return {**found, "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags}


def prepared(wh, config, steps: int):
    """The inject stage's own set-up of `config` (base, route, device, batches, the after-step hook), timed."""
    from nkb_model.injection import Injection
    from nkb_model.train import choose_device
    from stages.inputs import one_corpus
    from stages.models import source_model
    from stages.training import injection_data
    config = config.model_copy(update={"corpus": one_corpus(wh, config.corpus), "steps": steps})
    base = source_model(wh, config.base_model)
    started = time.perf_counter()
    model, tokenizer, _ = base.load()
    device = choose_device(config.device, config.precision)
    data = injection_data(wh, config, model, tokenizer, base)
    loaded = time.perf_counter()
    ready = Injection(config, data, device).prepare(model, tokenizer)  # as the stage does
    trained, batches, after = ready.module, ready.batches, ready.after_step
    return model, trained, batches, device, after, {
        "setup_load_seconds": round(loaded - started, 1),
        "setup_batches_seconds": round(time.perf_counter() - loaded, 1),
        "precision": device.precision, "precision_asked": config.precision}


def profiled_steps(trained, batches, config, device, after, warmup: int, steps: int) -> dict:
    """`warmup` steps, then `steps` under the profiler, of the stage's own training loop; their time by kind."""
    from torch.profiler import ProfilerActivity, profile, schedule

    from nkb_model.train import train
    times = []

    window = schedule(wait=0, warmup=warmup, active=steps, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], schedule=window) as prof:
        def after_step():
            if after:
                after()
            times.append(time.perf_counter())
            prof.step()
        train(trained, batches, config.train_config(warmup + steps), device, None, "profiled steps",
              after_step=after_step)
    active = times[warmup - 1:] if warmup else times
    seconds = active[-1] - active[0]
    by_kind, top = defaultdict(float), []
    for event in prof.key_averages():
        if event.self_cpu_time_total <= 0:
            continue
        by_kind[work_of(event.key)] += event.self_cpu_time_total
        top.append((event.self_cpu_time_total, event.key, event.count))
    total = sum(by_kind.values())
    top.sort(reverse=True)
    return {"steps_per_second": round((len(active) - 1) / seconds, 3),
            **{f"share_{kind}": round(100 * t / total, 1) for kind, t in sorted(by_kind.items())},
            "top_operators": [f"{key}: {100 * t / total:.1f} % ({n} calls)" for t, key, n in top[:10]]}


def step_flops(trained, batches, config, device, steps: int = 2) -> float:
    """FLOPs of one of the stage's training steps (forward and backward), by PyTorch's FLOP counter over `steps`
    more steps: with the steps a second, the rate the step's products run at."""
    from torch.utils.flop_counter import FlopCounterMode

    from nkb_model.train import train
    with FlopCounterMode(display=False) as counter:
        train(trained, batches, config.train_config(steps), device, None, "counted steps")
    return counter.get_total_flops() / steps


def work_of(operator: str) -> str:
    name = operator.lower()
    return next((kind for kind, fragments in KINDS if any(f in name for f in fragments)), "other")


def ffn_matmul_speed(model, batch, device, repeats: int = 20) -> dict:
    """GFLOP/s of one FFN's up-projection at the step's token count, in bf16 and fp32, forward only: `F.linear`
    on a weight laid out as `nn.Linear` holds it (out x in), as the model runs it. (`x @ w` on an in x out weight
    is another kernel, and a slower one on a CPU.)"""
    import torch
    import torch.nn.functional as F
    tokens = int((batch["attention_mask"] if "attention_mask" in batch else batch["labels"]).numel())  # pads too
    width = getattr(model.config, "hidden_size", None) or model.config.d_model
    inner = getattr(model.config, "intermediate_size", None) or model.config.d_ff
    out = {"matmul_tokens": tokens, "matmul_shape": f"{tokens}x{width} @ {width}x{inner}"}
    for dtype, label in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        x = torch.randn(tokens, width, dtype=dtype, device=device.device)
        w = torch.randn(inner, width, dtype=dtype, device=device.device)
        for _ in range(3):
            F.linear(x, w)
        started = time.perf_counter()
        for _ in range(repeats):
            F.linear(x, w)
        seconds = (time.perf_counter() - started) / repeats
        out[f"matmul_gflops_{label}"] = round(2 * tokens * width * inner / seconds / 1e9, 1)
    return out


if __name__ == "__main__":
    sys.exit(main())
