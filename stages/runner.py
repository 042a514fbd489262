"""How a stage runs: in this process, or on several devices under torchrun. Stages never decide this.

`dispatch` is the one entry to a stage for the command line and the Prefect flows (which decide before it
whether a stage runs here or on a worker of its pool, through its deployment). A training stage whose
config asks for `devices` > 1 is launched as `python -m torch.distributed.run --standalone
--nproc_per_node=N -m stages.runner STAGE ...`: every process joins a process group (NCCL on GPUs, Gloo on
CPU) and runs the same stage function on a warehouse that knows whether this process is the leader (rank
0), which records the run and publishes the model; the others train alongside and write nothing. The
training loop splits each step's batch over the ranks and sums the gradients (`nkb_model.train`), so the
result matches a one-device run up to float rounding.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from stages.configs import StageConfig
from stages.registry import STAGES, Stage, model_of, run_subject
from warehouse import PARQUET_TABLES, StageResult, Warehouse, get_run


def dispatch(name: str, wh: Warehouse, config: StageConfig, force: bool = False, **options) -> StageResult:
    """Run stage `name` with `config`: under torchrun when it asks for several devices, else here.
    `options` go to the stage function (e.g. salient-spans' `map_shards`)."""
    stage = STAGES[name]
    if getattr(config, "devices", 1) > 1:
        return _launch(stage, wh, config, force)
    return stage.entry(wh, config, force, **options)


def require_devices(runs: list[tuple[str, StageConfig]], elsewhere: frozenset[str] = frozenset()) -> None:
    """Refuse, before the first of `runs` starts, a device that a stage running here asks for and this machine
    lacks (device=cuda without a GPU), so that no data stage runs first only for training to fail after it. Stages
    of the pools in `elsewhere` run on those pools' workers, which have their own devices."""
    if any(getattr(config, "device", "auto") == "cuda" for name, config in runs if STAGES[name].pool not in elsewhere):
        from nkb_model.train import require_device
        require_device("cuda")


def precision_notes(runs: list[tuple[str, StageConfig]]) -> list[str]:
    """What a user should know before `runs` start about the precision they will get here: `precision: bf16` on
    a CPU without bf16 arithmetic, or whose bf16 is no faster than its fp32, runs fp32
    (`nkb_model.train.choose_device`)."""
    bf16 = [(name, getattr(config, "device", "auto")) for name, config in runs
            if getattr(config, "precision", None) == "bf16"]
    if not bf16:
        return []
    import torch

    from nkb_model.train import BF16_MIN_SPEEDUP, cpu_bf16_pays, cpu_bf16_speedup, cpu_computes_bf16
    # where choose_device puts a stage: the CPU when asked for, or when `auto` finds no GPU
    asked = sorted({name for name, device in bf16
                    if device == "cpu" or (device != "cuda" and not torch.cuda.is_available())})
    if not asked or cpu_bf16_pays():
        return []
    if cpu_computes_bf16():
        return [f"precision bf16 is asked of {', '.join(asked)}, but this CPU's bf16 matrix products run at "
                f"{cpu_bf16_speedup():.2f}x its fp32 ones' speed (bf16 needs {BF16_MIN_SPEEDUP}x to be chosen; "
                "AVX512-BF16 without AMX on an Intel Xeon is slower than fp32): they run in fp32, the faster here"]
    return [f"precision bf16 is asked of {', '.join(asked)}, but this CPU has no bf16 arithmetic (PyTorch's "
            f"CPU capability: {torch.backends.cpu.get_cpu_capability()}; bf16 needs AVX512-BF16 or AMX): they run "
            "in fp32, about twice bf16's time on the same cores"]


def summarize(stage: str, result: StageResult, seconds: float) -> dict[str, Any]:
    """One row describing a stage run: what it wrote, how long it took, how fast."""
    run = result.run
    value = result.value if isinstance(result.value, dict) else {}
    tables = {k: v for k, v in run.outputs.items() if k in PARQUET_TABLES}
    row: dict[str, Any] = {"stage": stage, "for": run_subject(stage, run.config), "run_id": run.run_id,
                           "skipped": result.skipped,
                           "rows_written": sum(tables.values()),
                           "written": ", ".join(f"{v} {k}" + (f" ({run.outputs[f'{k}_dropped']})"
                                                               if f"{k}_dropped" in run.outputs else "")
                                                for k, v in tables.items()),
                           "seconds": round(seconds, 3)}
    others = {k: v for k, v in run.outputs.items()  # parameters, files, steps...
              if k not in tables and k.removesuffix("_dropped") not in tables} | value
    row.update({k: v for k, v in others.items() if k not in row and not isinstance(v, (list, dict))})
    row.update({f"{k}.{part}": v for k, parts in others.items() if isinstance(parts, dict)  # an EM per dataset
                for part, v in parts.items() if isinstance(v, (int, float, str))})
    if STAGES[stage].publishes_model and run.checkpoint:
        row["model"], row["folder"] = model_of(stage, run.config), run.checkpoint
    if not result.skipped and row["rows_written"] and seconds > 0:
        row["rows_per_second"] = round(row["rows_written"] / seconds, 1)
    return row


def _launch(stage: Stage, wh: Warehouse, config: StageConfig, force: bool) -> StageResult:
    """Run `stage` with `config.devices` processes under torchrun; return the leader's result."""
    with tempfile.TemporaryDirectory(prefix="nkb-torchrun-") as tmp:
        result = Path(tmp) / "result.json"
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={config.devices}",
                "-m", "stages.runner", stage.name, "--home", str(wh.home), "--config", config.model_dump_json(),
                "--result", str(result)] + (["--force"] if force else [])
        done = subprocess.run(argv)
        if done.returncode != 0 or not result.exists():
            raise RuntimeError(f"{stage.name} on {config.devices} devices failed under torchrun "
                               f"(exit {done.returncode}); its output is above")
        data = json.loads(result.read_text())
    return StageResult(run=get_run(wh, data["run_id"]), skipped=data["skipped"], value=data["value"])


def main(argv: list[str] | None = None) -> int:
    """One torchrun process of a multi-device stage."""
    import torch
    parser = argparse.ArgumentParser(prog="python -m stages.runner",
                                     description="One torchrun process of a multi-device training stage.")
    parser.add_argument("stage", choices=[s for s in STAGES if "devices" in STAGES[s].config.model_fields])
    parser.add_argument("--home", required=True, help="warehouse directory")
    parser.add_argument("--config", required=True, help="the stage config as JSON")
    parser.add_argument("--result", required=True, help="where the leader writes {run_id, skipped, value} as JSON")
    parser.add_argument("--force", action="store_true", help="rerun even if the inputs are unchanged")
    args = parser.parse_args(argv)
    stage = STAGES[args.stage]
    config = stage.config.model_validate_json(args.config)
    use_nccl = config.device != "cpu" and torch.cuda.is_available()
    torch.distributed.init_process_group("nccl" if use_nccl else "gloo")
    try:
        leader = torch.distributed.get_rank() == 0
        result = stage.entry(Warehouse(args.home, leader=leader), config, args.force)
        if leader:
            Path(args.result).write_text(json.dumps({"run_id": result.run.run_id, "skipped": result.skipped,
                                                     "value": result.value}, default=str))
    finally:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def picked(plan: list[tuple[str, StageConfig]], only: list[str] | None = None,
           start: str | None = None) -> list[tuple[str, StageConfig]]:
    """The part of an experiment's plan to rerun: every run of the stages `only` names (each evaluation of every
    row for `evaluate`), or every run from the first of stage `start` on; the whole plan when neither is given.
    A name the plan lacks is refused, naming the plan's stages in order."""
    if only and start:
        raise ValueError("give --only or --from, not both")
    stages = list(dict.fromkeys(name for name, _ in plan))
    for name in [*(only or []), *([start] if start else [])]:
        if name not in stages:
            known = "" if name in STAGES else " (no stage has that name)"
            raise ValueError(f"stage {name!r}{known} is not in this experiment's plan; its stages, in order: "
                             f"{', '.join(stages)}")
    if only:
        return [(name, config) for name, config in plan if name in only]
    if start:
        return plan[next(i for i, (name, _) in enumerate(plan) if name == start):]
    return plan

