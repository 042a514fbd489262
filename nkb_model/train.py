"""The training loop shared by pretraining, NKB injection and fine-tuning.

Batches are a pure function of the step number (`batch_for_step`), so a run resumed from its
checkpoint sees exactly the batches an uninterrupted run would have seen; the checkpoint holds the
trainable weights, optimizer and scheduler state, RNG state and the loss curve so far. On CPU the
resumed run is bit-identical to the uninterrupted one.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm import tqdm

CHECKPOINT = "trainer.pt"


@dataclass
class TrainConfig:
    steps: int
    batch_size: int                    # examples per optimizer step
    micro_batch_size: int | None = None  # examples per forward pass; gradients accumulate up to batch_size
    lr: float = 1e-3
    warmup_steps: int = 0              # linear warm-up, then constant (the NKB paper's schedule) ...
    decay: bool = False                # ... or falling linearly to zero at the last step
    optimizer: str = "adafactor"       # "adafactor" (the paper's) or "adamw"
    weight_decay: float = 0.0
    clip: float = 1.0                  # gradient norm clip
    checkpoint_every: int = 200
    compile: bool = False              # steps through torch.compile: worth its minute of compiling on a GPU


@dataclass(frozen=True)
class Device:
    """Where and in what precision training runs; chosen once, at a stage's entry."""
    device: torch.device
    autocast_dtype: torch.dtype | None   # bf16 autocast (CUDA; a CPU when asked), else None: fp32

    def autocast(self) -> torch.autocast:
        """The stage's precision for a forward pass: bf16 autocast where chosen, else a no-op (fp32)."""
        return torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                              enabled=self.autocast_dtype is not None)

    def attention(self) -> contextlib.AbstractContextManager:
        """The attention kernel of a training step: on a CPU, scaled-dot-product attention's math kernel. PyTorch
        picks its CPU flash kernel, whose backward pass is slow over a step's short sequences (~30 tokens); the math
        kernel computes a bf16 attention in fp32 as the flash kernel does (a gradient as close to float64's; HF's
        eager attention rounds the scores to bf16 and trains worse slots), in less time (docs/decisions.md). A GPU
        keeps its fused kernels."""
        return sdpa_kernel([SDPBackend.MATH]) if self.device.type == "cpu" else contextlib.nullcontext()

    @property
    def batch_tokens(self) -> int | None:
        """The most tokens one batch of generation reads at once (its rows times its longest prompt), None: no
        bound. On a CPU, the activations of a larger batch are each more than the 32 MB up to which glibc's allocator
        reuses freed memory: above it every tensor is fresh memory from the system, faulted in page by page, and the
        time goes to the kernel; smaller batches give the same logits (docs/decisions.md)."""
        return CPU_BATCH_TOKENS if self.device.type == "cpu" else None

    @property
    def precision(self) -> str:
        """The precision chosen: bf16 or fp32."""
        return "bf16" if self.autocast_dtype else "fp32"

    @property
    def name(self) -> str:
        kind = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        return f"{kind} ({self.precision})"

    def hold(self, model: nn.Module) -> nn.Module:
        """Move `model` to the device for training. Under bf16 its frozen parameters are stored in bf16: they never
        change, so an fp32 copy buys nothing but a cast of every weight at every step and twice the memory traffic
        of the residual stream; the trainable ones stay fp32 for the optimizer. Call it once the trainable
        parameters are marked, and never on a model whose frozen weights are saved afterwards."""
        model.to(self.device)
        if self.autocast_dtype is not None:
            for p in model.parameters():
                if not p.requires_grad:
                    p.data = p.data.to(self.autocast_dtype)
        return model


class DeviceUnavailable(ValueError):
    """A device was asked for that this machine does not have."""


def require_device(preference: str) -> None:
    """Refuse a device this machine lacks (`cuda` without a CUDA GPU), in one line."""
    if preference == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable("device=cuda was asked for, but this machine has no CUDA GPU that torch can use: "
                                "leave device at auto (a GPU where there is one) or run where one is")


def choose_device(preference: str = "auto", precision: str = "auto") -> Device:
    """Where and in what precision a stage runs. auto: CUDA with bf16 autocast when available (or asked for), else
    CPU in fp32 with flush-denormal on. precision bf16: bf16 autocast on a CPU too, where it computes bf16 faster
    than fp32 (`cpu_bf16_pays`; elsewhere fp32); fp32: no autocast anywhere. Under torchrun each process takes the
    GPU of its LOCAL_RANK."""
    if preference not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, not {preference!r}")
    if precision not in ("auto", "fp32", "bf16"):
        raise ValueError(f"precision must be auto, fp32 or bf16, not {precision!r}")
    require_device(preference)
    if preference != "cpu" and torch.cuda.is_available():
        cuda = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(cuda)
        native = torch.cuda.is_bf16_supported()
        return Device(cuda, torch.bfloat16 if native and precision != "fp32" else None)
    # Freshly initialised models produce denormal gradients that make CPU steps several times slower.
    torch.set_flush_denormal(True)
    faster = precision == "bf16" and cpu_bf16_pays()
    return Device(torch.device("cpu"), torch.bfloat16 if faster else None)


CPU_BATCH_TOKENS = 4096  # `Device.batch_tokens` on a CPU: SmolLM2's FFN activations 24 MB in fp32 at this size

CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})  # /proc/cpuinfo's names for bf16 arithmetic


def cpu_computes_bf16() -> bool:
    """Whether this CPU has bf16 arithmetic (AVX512-BF16 or AMX) for oneDNN's matrix products: oneDNN's own answer,
    through a private torch function; where a torch lacks it, the CPU's flags (Linux; elsewhere no: fp32)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        try:
            return bool(CPU_BF16_FLAGS & cpu_flags(Path("/proc/cpuinfo").read_text()))
        except OSError:
            return False


# bf16 autocast on a CPU only where its products run at least this much faster than fp32's. Measured (bench.
# profile_inject, the FFN's product): AMX 6-10x, the Zen 5 EPYC's AVX512-BF16 ~4x, the Zen 4's 2.2x; an Intel Xeon
# with AVX512-BF16 and no AMX 0.6x, where the demo's bf16 steps ran 0.84 a second against fp32's 1.19 (journal,
# 2026-12-06 (late morning)). The margin keeps a machine from flipping between runs on timing noise.
BF16_MIN_SPEEDUP = 1.3


def cpu_bf16_pays() -> bool:
    """Whether bf16 autocast makes this CPU's matrix products faster: bf16 arithmetic there at all
    (`cpu_computes_bf16`), and at least `BF16_MIN_SPEEDUP` times fp32's throughput (`cpu_bf16_speedup`)."""
    return cpu_computes_bf16() and cpu_bf16_speedup() >= BF16_MIN_SPEEDUP


@functools.cache
def cpu_bf16_speedup() -> float:
    """bf16's throughput over fp32's on a product of an FFN's size (256 tokens, 1,024 by 2,816), on this process's
    threads: the best of five runs each, interleaved so that a busy machine slows both alike; a fifth of a
    second, once a process. AVX512-BF16 says only that oneDNN can run bf16: on an Intel Xeon without AMX it runs
    it slower than fp32."""
    inputs = {dtype: (torch.randn(256, 1024, dtype=dtype), torch.randn(1024, 2816, dtype=dtype))
              for dtype in (torch.float32, torch.bfloat16)}
    for a, b in inputs.values():
        a @ b  # oneDNN builds its kernel on the first call
    best = dict.fromkeys(inputs, math.inf)
    for _ in range(5):
        for dtype, (a, b) in inputs.items():
            start = time.perf_counter()
            a @ b
            best[dtype] = min(best[dtype], time.perf_counter() - start)
    return best[torch.float32] / best[torch.bfloat16]


def cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of /proc/cpuinfo's first processor."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def make_optimizer(params: list[nn.Parameter], config: TrainConfig) -> torch.optim.Optimizer:
    if config.optimizer == "adafactor":
        from transformers.optimization import Adafactor
        return Adafactor(params, lr=config.lr, scale_parameter=False, relative_step=False, warmup_init=False,
                         weight_decay=config.weight_decay)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    raise ValueError(f"optimizer must be adafactor or adamw, not {config.optimizer!r}")


def lr_schedule(config: TrainConfig) -> Callable[[int], float]:
    """The LR factor for step (0-based): linear warm-up, then 1 (constant) or falling linearly to 0 after the last step."""
    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        if config.decay:
            return (config.steps - step) / max(1, config.steps - config.warmup_steps)
        return 1.0
    return factor


def _world() -> tuple[int, int]:
    """(rank, world size): (0, 1) unless running in a torch.distributed process group (torchrun)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _all_reduce_grads(params: list[nn.Parameter]) -> None:
    """Sum every trainable gradient over the processes, in one flat buffer (one collective per step)."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    torch.distributed.all_reduce(flat)
    offset = 0
    for p, g in zip(params, grads):
        p.grad = flat[offset:offset + g.numel()].view_as(g)
        offset += g.numel()


def train(model: nn.Module, batch_for_step: Callable[[int], dict[str, torch.Tensor]], config: TrainConfig,
          device: Device, checkpoint_dir: str | os.PathLike | None = None, desc: str = "train",
          progress: Callable[..., tqdm] | None = None,
          after_step: Callable[[], None] | None = None) -> list[tuple[int, float]]:
    """Train the parameters that require grad for `config.steps` steps; returns [(step, loss), ...].

    Resumes from `checkpoint_dir` when it holds a checkpoint. The caller sets train/eval modes (so
    frozen parts can stay without dropout). Under torchrun (data parallel) every process takes its
    share of each step's batch and the gradients are summed, so a step sees the same batch as on one
    device; only rank 0 writes checkpoints. `progress` makes the progress bar (tqdm's keyword arguments;
    default: a tqdm redrawn once a second). `after_step()` runs after each optimizer step (e.g. to keep weights
    within bounds)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise ValueError("no parameter requires grad; nothing to train")
    params = [p for _, p in named]
    optimizer = make_optimizer(params, config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(config))
    losses: list[tuple[int, float]] = []
    start = 0
    path = Path(checkpoint_dir) / CHECKPOINT if checkpoint_dir else None
    if path and path.exists():
        start, losses = _load_checkpoint(path, dict(named), optimizer, scheduler, device)
    forward = torch.compile(model) if config.compile else model
    micro = config.micro_batch_size or config.batch_size
    rank, world = _world()
    disabled = os.environ.get("NKB_PROGRESS", "1") == "0" or rank > 0
    shown_loss, seen_tokens, seen_seconds = None, 0, 0.0  # what the bar shows: smoothed, not one noisy step
    progress = progress or functools.partial(tqdm, mininterval=1.0)  # a redraw a second, not one a step
    with progress(total=config.steps, initial=start, desc=desc, unit=" step", disable=disabled) as bar:
        for step in range(start, config.steps):
            started = time.perf_counter()
            batch = batch_for_step(step)
            n = next(iter(batch.values())).shape[0]
            total, tokens = _backward(forward, batch, range(rank * n // world, (rank + 1) * n // world), micro, device)
            if world > 1:
                total, tokens = _sum_over_ranks(params, total, tokens, device)
            torch.nn.utils.clip_grad_norm_(params, config.clip)
            optimizer.step()
            if after_step:
                after_step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if not math.isfinite(total):
                raise FloatingPointError(f"loss became {total} at step {step + 1}")
            losses.append((step + 1, total))
            shown_loss = total if shown_loss is None else 0.95 * shown_loss + 0.05 * total
            seen_tokens, seen_seconds = seen_tokens + tokens, seen_seconds + time.perf_counter() - started
            # refresh=False: the bar redraws at most once a second (mininterval), not every step, so a
            # log file or the Prefect UI gets a line a second instead of one per step.
            bar.set_postfix(loss=f"{shown_loss:.3f}", tok_s=f"{seen_tokens / seen_seconds:.0f}", refresh=False)
            bar.update(1)
            if path and rank == 0 and ((step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps):
                _save_checkpoint(path, step + 1, dict(named), optimizer, scheduler, losses, config)
    return losses


def _backward(forward, batch: dict[str, torch.Tensor], mine: range, micro: int, device: Device) -> tuple[float, int]:
    """This process's rows `mine` of a step's batch, forward and backward micro-batch by micro-batch (the gradients
    accumulate); returns their loss and the tokens they read."""
    label_tokens = int((batch["labels"] != -100).sum())
    total, tokens = 0.0, 0
    for lo in range(mine.start, mine.stop, micro):
        part = {k: v[lo:min(lo + micro, mine.stop)].to(device.device, non_blocking=True) for k, v in batch.items()}
        with device.autocast(), device.attention():
            # Weighted by label tokens, so that micro-batches and ranks add up to the whole
            # batch's token-mean loss exactly as one forward pass over it would give.
            loss = forward(**part).loss * (int((part["labels"] != -100).sum()) / label_tokens)
        loss.backward()
        total += loss.item()
        tokens += int(part["attention_mask"].sum()) + int((part["labels"] != -100).sum())
    return total, tokens


def _sum_over_ranks(params: list, total: float, tokens: int, device: Device) -> tuple[float, int]:
    """The gradients, loss and tokens of every rank of a data-parallel run, summed."""
    _all_reduce_grads(params)
    summed = torch.tensor([total, tokens], dtype=torch.float64, device=device.device)
    torch.distributed.all_reduce(summed)
    return summed[0].item(), int(summed[1].item())


def _save_checkpoint(path: Path, step: int, named: dict, optimizer, scheduler, losses, config: TrainConfig) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"step": step, "params": {n: p.detach().cpu() for n, p in named.items()},
             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "losses": losses,
             "torch_rng": torch.get_rng_state(), "config": asdict(config),
             "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # a crash while saving leaves the previous checkpoint


def _load_checkpoint(path: Path, named: dict, optimizer, scheduler, device: Device) -> tuple[int, list]:
    state = torch.load(path, map_location="cpu", weights_only=False)
    missing = set(named) ^ set(state["params"])
    if missing:
        raise ValueError(f"{path}: checkpoint does not match the trainable parameters ({sorted(missing)[:3]}...)")
    with torch.no_grad():
        for name, tensor in state["params"].items():
            named[name].copy_(tensor)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    if state.get("cuda_rng") is not None and device.device.type == "cuda":
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return state["step"], [tuple(x) for x in state["losses"]]
