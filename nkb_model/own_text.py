"""The trained blocks held to what the base's own FFNs write on the base's own text: a lever against forgetting.

Slots trained on the sample world answer `The capital of France is` with the sample world's names: they fire on text
that is not the knowledge and write into the base's computation there. The held-out loss does not see it when the
general text is the knowledge's own kind (the sample world's is). `own_text_weight` adds to each step's loss how far
each trained block's FFN writes from what the base's FFN wrote there, over text the base wrote itself (sampled from
its start token once, before anything trains: no corpus is needed, and no probe's prompt is among it):

    drift = Σ_blocks mean ‖FFN'(x) − FFN(x)‖² / mean ‖FFN(x)‖²        x: the base's own input to that FFN

Each FFN is given the input the base gave it, so the term runs no block, only the trained blocks' FFNs (the slots'
output alone, for the NKB, where FFN' = FFN + slots). Every route has an FFN to hold: the NKB's slots, LoRA's
adapters on the FFN maps, and the fine-tuned maps themselves.

`own_text_kl` holds what the model says instead: on `kl_rows` of the same texts each step, the whole model runs and
the KL divergence from the base's next-token distribution (its top `TEACHER_TOP` tokens and the rest of the
vocabulary as one outcome, kept when the texts were written) to the model's is added, so that a change anywhere that moves the output on the base's own text
costs, whichever route made it.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import numpy as np
import torch
from torch import nn

from nkb_model.base_model import Mix
from nkb_model.causal import start_ids
from nkb_model.mounting import get_ffn
from nkb_model.nkb import NKBFeedForward
from nkb_model.train import Device

INPUTS, WRITES = "own_text_inputs", "own_text_writes"  # the batch keys the rows travel under
IDS, TOP_IDS, TOP_LOGP = "own_text_ids", "own_text_top_ids", "own_text_top_logp"
TEACHER_TOP = 32  # the base's most likely next tokens kept per position: most of its probability mass
KL_ROWS = 4       # own texts the whole model reads each step for the KL term, unless asked for more


@dataclass(frozen=True)
class OwnText:
    """Text the base wrote, as the FFNs of the trained blocks `layers` saw it: inputs and writes (rows, blocks, tokens,
    d_model), and each block's mean squared write (the drift's scale); with a teacher, the texts' ids (rows, tokens)
    and the base's top next tokens at each position with their log-probabilities (rows, tokens, TEACHER_TOP)."""
    layers: list[str]
    inputs: torch.Tensor
    writes: torch.Tensor
    scale: torch.Tensor    # (blocks,)
    ids: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None
    top_logp: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.inputs.shape[0]


@torch.no_grad()
def sample_own_text(model: nn.Module, tokenizer, rows: int, length: int, seed: int, device: Device,
                    batch_size: int = 64, progress: Callable[[int], None] | None = None,
                    head: str = "") -> torch.Tensor:
    """`rows` texts of `length` tokens the model writes from its start token (EOS where it adds none), sampled at
    temperature 1 with nucleus 0.95: the kind of text it was trained on, in its own words. With `head`, each text
    starts with it and the model writes the rest (the head's tokens count in the length). (rows, length) ids."""
    start = start_ids(tokenizer) or [tokenizer.eos_token_id]
    given = tokenizer(head, add_special_tokens=False)["input_ids"] if head else []
    if len(given) >= length:
        raise ValueError(f"the head {head!r} is {len(given)} tokens, as long as the {length}-token texts")
    keep, start, length = len(start), start + given, length - len(given)
    torch.manual_seed(seed)
    model.eval()
    out = []
    for lo in range(0, rows, batch_size):
        ids = torch.tensor([start] * min(batch_size, rows - lo), device=device.device)
        with device.autocast():
            made = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, top_p=0.95,
                                  temperature=1.0, max_new_tokens=length, min_new_tokens=length,
                                  pad_token_id=tokenizer.eos_token_id)
        out.append(made[:, keep:].cpu())
        if progress:
            progress(len(ids))
    return torch.cat(out)


@torch.no_grad()
def ffn_traffic(model: nn.Module, ids: torch.Tensor, layers: list[str], device: Device,
                batch_size: int = 32, teacher: bool = False) -> OwnText:
    """What the FFNs of `layers` read and write while the model reads `ids` (the untrained base's: call it before
    anything is mounted or trains); with `teacher`, also its top next tokens at each position."""
    ffns = [get_ffn(model, name) for name in layers]
    seen: dict[int, list] = {i: [] for i in range(len(ffns))}
    tops = []

    def keep(i):
        return lambda module, args, out: seen[i].append((args[0].float().cpu(), out.float().cpu()))

    handles = [ffn.register_forward_hook(keep(i)) for i, ffn in enumerate(ffns)]
    try:
        for lo in range(0, len(ids), batch_size):
            part = ids[lo:lo + batch_size].to(device.device)
            with device.autocast():
                out = model(input_ids=part, attention_mask=torch.ones_like(part), use_cache=False)
            if teacher:
                tops.append(out.logits.float().log_softmax(-1).topk(TEACHER_TOP, dim=-1))
    finally:
        for handle in handles:
            handle.remove()
    inputs = torch.stack([torch.cat([x for x, _ in seen[i]]) for i in seen], dim=1)
    writes = torch.stack([torch.cat([y for _, y in seen[i]]) for i in seen], dim=1)
    taught = {}
    if teacher:
        taught = {"ids": ids.cpu(), "top_ids": torch.cat([t.indices for t in tops]).cpu(),
                  "top_logp": torch.cat([t.values for t in tops]).cpu()}
    return OwnText(list(layers), inputs, writes, writes.pow(2).sum(-1).mean(dim=(0, 2)), **taught)


def write_change(ffn: nn.Module, x: torch.Tensor, base_write: torch.Tensor) -> torch.Tensor:
    """ffn(x) − the base's write. Slots add to the base's FFN, which is frozen: their change is their addition
    alone, and the base's FFN need not run again (about a third of the term's time at the demo's shapes; the same
    drift to rounding)."""
    if isinstance(ffn, NKBFeedForward):
        return ffn.addition(x).float()
    return ffn(x).float() - base_write


def drift(ffns: list[nn.Module], inputs: torch.Tensor, writes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Σ_blocks mean ‖ffn(x) − the base's write‖² / the base's mean ‖write‖² over a batch's own-text rows."""
    total = inputs.new_zeros(())
    for b, ffn in enumerate(ffns):
        moved = write_change(ffn, inputs[:, b], writes[:, b])
        total = total + moved.pow(2).sum(-1).mean() / scale[b]
    return total


def teacher_kl(model: nn.Module, ids: torch.Tensor, top_ids: torch.Tensor, top_logp: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(teacher ‖ model) over the teacher's top tokens and the rest of the vocabulary as one
    more outcome: exact where the model is the teacher, and the model pays for mass it moves off the top tokens."""
    logp = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits.float().log_softmax(-1)
    return top_kl(logp, top_ids, top_logp)


def top_kl(logp: torch.Tensor, top_ids: torch.Tensor, top_logp: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(teacher ‖ model), the model's log-probabilities `logp` (..., vocabulary), the
    teacher's top tokens `top_ids` and their log-probabilities (..., k), the rest of the vocabulary one more outcome."""
    student, teacher = logp.gather(-1, top_ids), top_logp.float()

    def with_rest(top: torch.Tensor) -> torch.Tensor:  # log-probabilities of the top tokens, then of the rest
        rest = torch.log((1 - top.exp().sum(-1, keepdim=True)).clamp_min(1e-8))
        return torch.cat([top, rest], -1)
    teacher, student = with_rest(teacher), with_rest(student)
    return (teacher.exp() * (teacher - student)).sum(-1).mean()


class HeldToOwnText(nn.Module):
    """What the training loop calls: the wrapped model's loss on the batch, plus `weight` times the drift of the
    FFNs of `own`'s blocks over the batch's own-text rows (`WithOwnText` puts them in), plus `kl` times the model's
    KL divergence from the base on `kl_rows` of them."""

    def __init__(self, inner: nn.Module, model: nn.Module, own: OwnText, weight: float, kl: float = 0.0,
                 kl_rows: int = KL_ROWS):
        super().__init__()
        self.inner, self.model, self.weight, self.kl, self.kl_rows = inner, model, weight, kl, kl_rows
        self.ffns = [get_ffn(model, name) for name in own.layers]
        self.register_buffer("scale", own.scale.clone(), persistent=False)

    def forward(self, **batch):
        inputs, writes = batch.pop(INPUTS, None), batch.pop(WRITES, None)
        taught = [batch.pop(key, None) for key in (IDS, TOP_IDS, TOP_LOGP)]
        out = self.inner(**batch)
        if inputs is None:  # a batch from elsewhere (sparse_slots' measure of general text)
            return out
        loss = out.loss
        if self.weight:
            loss = loss + self.weight * drift(self.ffns, inputs, writes, self.scale.to(inputs.device))
        if self.kl and taught[0] is not None:
            loss = loss + self.kl * teacher_kl(self.model, *(t[:self.kl_rows] for t in taught))
        return SimpleNamespace(loss=loss)


class WithOwnText(Mix):
    """`batch(step)`: the wrapped source's batch with one own-text row beside each of its rows (at least `rows`),
    drawn by the step (a pure function of it, as every batch source is); recorded under the source's own metric
    (`metric_at`)."""

    def __init__(self, batches, own: OwnText, seed: int = 0, rows: int = 0):
        self.first, self.second, self.own, self.seed, self.rows = batches, None, own, seed, rows

    def source(self, step: int) -> tuple[int, int]:
        return 0, step

    def __call__(self, step: int) -> dict[str, torch.Tensor]:
        batch = self.first(step)
        n = max(next(iter(batch.values())).shape[0], self.rows)
        pick = torch.as_tensor(np.random.default_rng([self.seed, step]).choice(len(self.own), n,
                                                                               replace=n > len(self.own)))
        taught = {} if self.own.ids is None else {IDS: self.own.ids[pick], TOP_IDS: self.own.top_ids[pick],
                                                  TOP_LOGP: self.own.top_logp[pick]}
        return {**batch, INPUTS: self.own.inputs[pick], WRITES: self.own.writes[pick], **taught}

    def __getattr__(self, name):  # per_epoch, batch_size, ...: the source's own
        return getattr(self.first, name)
