"""Training stages on several devices: the stage relaunches itself under torchrun (data parallel).

`launch` runs `python -m torch.distributed.run --standalone --nproc_per_node=N -m flows.distributed ...`;
every process joins a process group (NCCL on GPUs, Gloo on CPU) and runs the same stage function.
Rank 0 records the run and publishes the model; the other ranks train alongside and write nothing
(`warehouse.runs.FollowerRun`). The training loop splits each step's batch over the ranks and sums
the gradients (`nkb_model.train`), so the result matches a one-device run up to float rounding.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from warehouse import StageResult, Warehouse, get_run


def in_worker() -> bool:
    """True inside a torchrun-launched process (the stage then trains instead of launching)."""
    return "LOCAL_RANK" in os.environ


def launch(stage: str, wh: Warehouse, config, force: bool) -> StageResult:
    """Run `stage` with `config.devices` processes under torchrun; return rank 0's result."""
    with tempfile.TemporaryDirectory(prefix="nkb-torchrun-") as tmp:
        result = Path(tmp) / "result.json"
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={config.devices}",
                "-m", "flows.distributed", stage, "--home", str(wh.home), "--config", config.model_dump_json(),
                "--result", str(result)] + (["--force"] if force else [])
        done = subprocess.run(argv)
        if done.returncode != 0 or not result.exists():
            raise RuntimeError(f"{stage} on {config.devices} devices failed under torchrun (exit {done.returncode}); "
                               "its output is above")
        data = json.loads(result.read_text())
    return StageResult(run=get_run(wh, data["run_id"]), skipped=data["skipped"], value=data["value"])


def main(argv: list[str] | None = None) -> int:
    import torch
    from flows.registry import STAGES
    parser = argparse.ArgumentParser(prog="python -m flows.distributed",
                                     description="One torchrun process of a multi-device training stage.")
    parser.add_argument("stage", choices=[s for s in STAGES if "devices" in STAGES[s].config.model_fields])
    parser.add_argument("--home", required=True, help="warehouse directory")
    parser.add_argument("--config", required=True, help="the stage config as JSON")
    parser.add_argument("--result", required=True, help="where rank 0 writes {run_id, skipped, value} as JSON")
    parser.add_argument("--force", action="store_true", help="rerun even if the inputs are unchanged")
    args = parser.parse_args(argv)
    stage = STAGES[args.stage]
    config = stage.config.model_validate_json(args.config)
    use_nccl = config.device != "cpu" and torch.cuda.is_available()
    torch.distributed.init_process_group("nccl" if use_nccl else "gloo")
    try:
        result = stage.run(Warehouse(args.home), config, args.force)
        if torch.distributed.get_rank() == 0:
            Path(args.result).write_text(json.dumps({"run_id": result.run.run_id, "skipped": result.skipped,
                                                     "value": result.value}, default=str))
    finally:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
