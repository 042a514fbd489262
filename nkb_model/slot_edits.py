"""Knowledge surgery (the NKB paper's section 6): change what a model answers by editing one slot's value.

A slot of a block that fires when the first answer token is generated gets `v_slot += λ (e_target − e_original)`,
the output-embedding rows of the wanted and the predicted token (the sign of the paper's Table 7 and the
authors' code). Every edit keeps the old value, so it can be undone exactly. `sweep` measures the paper's
Table 8 (success and change rate per strength); `edit_answer` edits a whole multi-token answer, one slot per
token; `edit_many` applies many edits to one model and measures them the way knowledge-editing toolkits do
(success, generalisation, locality).

Two choices make one setting work on any model:
- **Strength.** The paper's λ is absolute: what it does depends on the scale of the model's embeddings, values
  and activations (0.07 suits T5-base; it does nothing to a tiny model). A relative strength s sets λ so that
  the edit adds to the residual stream, at the step edited, a vector s times as long as the stream there:
  λ = s ‖h‖ / (a ‖e_target − e_original‖), with a the slot's activation and h the block's output. s = 1 makes the
  new direction as strong as everything else the model carries at that step, whatever its scale.
- **Slot.** The paper edits the slot that fires most. Some slots fire for whole kinds of answers (every year,
  every name starting alike), and editing them changes other questions' answers too. With a profile of how each
  slot fires on reference questions (`slot_profile`), the slot chosen is the one that fires most above its
  usual: the most specific to this question, or none where no slot fires above its usual (then the step is
  not the NKB's to edit). docs/pipeline.md has how often each choice changed other answers.

A model's answers may follow a prefix (a fine-tuned `answer: <extra_id_0>` model first writes the sentinel):
`Site.prefix` is the decoder ids before the answer, so "the first answer token" is the one after them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from nkb_model.families import answer_ids, generate, teacher_forced
from nkb_model.mounting import block
from nkb_model.nkb import mounted_layers
from nkb_model.train import Device


@dataclass(frozen=True)
class Site:
    """Where edits go: an NKB block, the decoder ids before an answer, and how the slot is chosen: the one that
    fires most (the paper's; `typical` None) or the one that fires most over its `typical` activation."""
    layer: str
    prefix: tuple[int, ...] = ()
    typical: torch.Tensor | None = None  # (slots,): each slot's RMS activation at the first answer step


@dataclass(frozen=True)
class Firing:
    """The slot chosen at one decoding step, how strongly it fires there, and the norm of the block's output."""
    slot: int
    weight: float
    residual: float


@dataclass
class Edit:
    """v_slot += lam * (e_target - e_original) on one NKB value: exactly undoable (the old row is kept)."""
    layer: str
    slot: int
    lam: float
    target_token: int
    original_token: int
    old_value: torch.Tensor

    def undo(self, model: nn.Module) -> None:
        values = mounted_layers(model)[self.layer].nkb_values.weight
        with torch.no_grad():
            values[:, self.slot] = self.old_value.to(values.device, values.dtype)


def default_layer(model: nn.Module) -> str:
    """The block whose slots are edited unless told otherwise: the last decoder block with an NKB."""
    names = list(mounted_layers(model))
    if not names:
        raise ValueError("the model has no NKB mounted; surgery edits NKB slots")
    decoder = [n for n in names if n.startswith("decoder")]
    return (decoder or names)[-1]


def output_embedding(model: nn.Module, token: int) -> torch.Tensor:
    return model.get_output_embeddings().weight[token].detach()


def edit_slot(model: nn.Module, layer: str, slot: int, target_token: int, original_token: int, lam: float) -> Edit:
    """Apply the surgery to one slot with the paper's absolute λ."""
    values = mounted_layers(model)[layer].nkb_values.weight
    old = values[:, slot].detach().clone()
    delta = output_embedding(model, target_token) - output_embedding(model, original_token)
    with torch.no_grad():
        values[:, slot] += lam * delta.to(values.dtype)
    return Edit(layer, slot, lam, target_token, original_token, old)


def edit_lambda(model: nn.Module, firing: Firing, target_token: int, original_token: int, strength: float) -> float:
    """The paper's λ for relative `strength`: the edit adds `strength` ‖h‖ to the residual stream at the step."""
    delta = (output_embedding(model, target_token) - output_embedding(model, original_token)).float().norm()
    if abs(firing.weight) < 1e-12 or delta == 0:
        raise ValueError(f"slot {firing.slot} does not fire at this step; a relative strength cannot be applied")
    return float(strength * firing.residual / (firing.weight * delta))


@torch.no_grad()
def read_step(model: nn.Module, tokenizer, texts: list[str], prefix, layer: str | None = None):
    """Logits at the step after `prefix` for each text and, with `layer`, that block's slot activations and
    output there: (logits (texts, vocab), weights (texts, slots) or None, outputs (texts, d_model) or None)."""
    captured: dict[str, torch.Tensor] = {}
    handles = []
    if layer is not None:
        ffn = mounted_layers(model)[layer]
        handles = [ffn.register_forward_hook(lambda m, i, o: captured.__setitem__("weights", m.slot_weights(i[0]))),
                   block(model, layer).register_forward_hook(
                       lambda m, i, o: captured.__setitem__("out", o[0] if isinstance(o, tuple) else o))]
    try:
        inputs, offsets = teacher_forced(model, tokenizer, texts, [list(prefix)] * len(texts))
        at = (torch.arange(len(texts)), torch.tensor(offsets) + len(prefix))  # each row's step after `prefix`
        logits = model(**inputs).logits[at]
    finally:
        for handle in handles:
            handle.remove()
    if layer is None:
        return logits, None, None
    return logits, captured["weights"][at].float(), captured["out"][at].float()


def first_token(model: nn.Module, tokenizer, texts: list[str], prefix=()) -> list[int]:
    """The greedy first answer token (after `prefix`) for each input."""
    return read_step(model, tokenizer, texts, prefix)[0].argmax(-1).tolist()


def next_token(model: nn.Module, tokenizer, text: str, prefix) -> int:
    """The greedy next token after the decoder ids `prefix` (teacher-forced)."""
    return first_token(model, tokenizer, [text], prefix)[0]


@torch.no_grad()
def slot_profile(model: nn.Module, tokenizer, texts: list[str], answers: list[str], layer: str, prefix=(),
                 end: int | None = None, batch_size: int = 64) -> torch.Tensor:
    """Each slot's RMS activation over every step of the reference answers (teacher-forced, `texts` → `answers`,
    e.g. the training split's questions): how strongly it usually fires, so that `Site.typical` can pick the slot
    particular to one question."""
    ffn = mounted_layers(model)[layer]
    total, count = None, 0
    for lo in range(0, len(texts), batch_size):
        batch = texts[lo:lo + batch_size]
        targets = [list(prefix) + ids + ([end] if end is not None else [])
                   for ids in answer_ids(model, tokenizer, batch, answers[lo:lo + batch_size])]
        inputs, offsets = teacher_forced(model, tokenizer, batch, [t[:-1] for t in targets])
        rows = torch.tensor([r for r, t in enumerate(targets) for _ in range(len(prefix), len(t))])
        steps = torch.tensor([offsets[r] + k for r, t in enumerate(targets) for k in range(len(prefix), len(t))])
        captured = []
        handle = ffn.register_forward_hook(lambda m, i, o: captured.append(m.slot_weights(i[0])))
        try:
            model(**inputs)
        finally:
            handle.remove()
        squares = captured[-1].float()[rows, steps].pow(2).sum(0)
        total, count = squares if total is None else total + squares, count + len(steps)
    return (total / count).sqrt()


def fired(model: nn.Module, tokenizer, text: str, site: Site, prefix=None) -> Firing | None:
    """The slot to edit at the step after `prefix` (default: the site's, the first answer step), or None when the
    site has a profile and no slot fires above its usual activation there: the NKB does not hold that step, and an
    edit of it would need a λ large enough to move every context in which the slot fires a little."""
    _, weights, out = read_step(model, tokenizer, [text], site.prefix if prefix is None else prefix, site.layer)
    weights = weights[0]
    if site.typical is None:
        slot = int(weights.argmax())
    else:
        above = weights / site.typical.to(weights).clamp_min(1e-12)
        slot = int(above.argmax())
        if above[slot] < 1:
            return None
    return Firing(slot, float(weights[slot]), float(out[0].norm()))


def strong_edit(model: nn.Module, firing: Firing, layer: str, target_token: int, original_token: int,
                strength: float, absolute: bool = False) -> Edit:
    """`edit_slot` at a relative strength, or with `strength` as the paper's absolute λ."""
    lam = strength if absolute else edit_lambda(model, firing, target_token, original_token, strength)
    return edit_slot(model, layer, firing.slot, target_token, original_token, lam)


def sweep(model: nn.Module, tokenizer, texts: list[str], gold_answers: list[str], site: Site, strengths: list[float],
          questions: int, others: int, seed: int = 0, absolute: bool = False) -> tuple[list[dict], int]:
    """The paper's Table 8 on `texts` (model inputs) and their gold answers.

    Of the inputs whose first predicted answer token is not the gold answer's, `questions` are chosen at random;
    for each, the site's slot is edited toward the gold first token at every strength (relative, or the paper's
    absolute λ), and the edit is undone. Returns a row per (question, strength) — {question (index into texts),
    slot, strength, lambda (the λ applied), original, target, new (tokens), success, change_rate: the share of
    `others` other inputs whose first token changed (None without others)} — and how many were wrong."""
    gold = [ids[0] for ids in answer_ids(model, tokenizer, texts, gold_answers)]
    predicted = first_token(model, tokenizer, texts, site.prefix)
    wrong = [i for i in range(len(texts)) if predicted[i] != gold[i]]
    rng = np.random.default_rng(seed)
    chosen = [int(i) for i in rng.permutation(wrong)[:questions]]
    token = tokenizer.convert_ids_to_tokens
    rows = []
    for i in chosen:
        firing = fired(model, tokenizer, texts[i], site)
        checked = [int(j) for j in rng.choice([j for j in range(len(texts)) if j != i],
                                              size=min(others, len(texts) - 1), replace=False)]
        for strength in strengths:
            row = {"question": i, "slot": None, "strength": strength, "lambda": None, "original": token(predicted[i]),
                   "target": token(gold[i]), "new": token(predicted[i]), "success": False,
                   "change_rate": 0.0 if checked else None}  # no slot holds it: not edited, a failure
            if firing is not None:
                edit = strong_edit(model, firing, site.layer, gold[i], predicted[i], strength, absolute)
                after = first_token(model, tokenizer, [texts[i]] + [texts[j] for j in checked], site.prefix)
                edit.undo(model)
                changed = sum(after[1 + n] != predicted[j] for n, j in enumerate(checked))
                row |= {"slot": firing.slot, "lambda": edit.lam, "new": token(after[0]), "success": after[0] == gold[i],
                        "change_rate": changed / len(checked) if checked else None}  # one question: none to check
            rows.append(row)
    return rows, len(wrong)


def edit_answer(model: nn.Module, tokenizer, text: str, answer: str, site: Site, strength: float, device: Device,
                absolute: bool = False, end: int | None = None) -> dict:
    """Edit a slot at each step of the wanted answer (teacher-forced: step t sees the answer's first t tokens
    after the site's prefix; a step already predicting its token is left alone), and at the step after it toward
    `end`, the token that closes an answer, so that the answer stops there. The model stays edited.

    Returns {old_answer, new_answer, steps: [{step, slot, lambda, original, target}]}; a step no slot holds
    (`fired`) has slot and lambda None and is left as it was."""
    old_answer = generate(model, tokenizer, [text], device, max_new_tokens=32)[0]
    wanted = answer_ids(model, tokenizer, [text], [answer])[0] + ([end] if end is not None else [])
    steps = []
    for t, token in enumerate(wanted):
        seen = list(site.prefix) + wanted[:t]
        predicted = next_token(model, tokenizer, text, seen)
        if predicted == token:
            continue
        firing = fired(model, tokenizer, text, site, seen)
        edit = strong_edit(model, firing, site.layer, token, predicted, strength, absolute) if firing else None
        steps.append({"step": t, "slot": firing and firing.slot, "lambda": edit and edit.lam,
                      "original": tokenizer.convert_ids_to_tokens(predicted),
                      "target": tokenizer.convert_ids_to_tokens(token)})
    new_answer = generate(model, tokenizer, [text], device, max_new_tokens=32)[0]
    return {"old_answer": old_answer, "new_answer": new_answer, "steps": steps}


@dataclass
class Request:
    """One edit of a batch: a model input, the answer wanted for it, and inputs that ask for the same fact in
    other words (they should change with it)."""
    text: str
    answer: str
    paraphrases: list[str]


def edit_many(model: nn.Module, tokenizer, requests: list[Request], unrelated: list[str], site: Site,
              strength: float, device: Device, absolute: bool = False, end: int | None = None) -> dict:
    """Apply every request's `edit_answer` to one model, in order, then measure them all together:
    success (the edited input gives its wanted answer), generalisation (a paraphrase gives it too) and
    locality (an `unrelated` input's answer is what it was before any edit), the metrics of
    knowledge-editing toolkits. The model stays edited.

    Returns {edits: [{old_answer, new_answer, steps, success, paraphrases_right}], success, generalization,
    locality} with the rates as shares (None when there was nothing to measure)."""
    from nkb_model.metrics import exact_match
    before = generate(model, tokenizer, unrelated, device) if unrelated else []
    done = [edit_answer(model, tokenizer, r.text, r.answer, site, strength, device, absolute, end) for r in requests]
    results, paraphrases_right = [], []
    for request, edit in zip(requests, done):
        now = generate(model, tokenizer, [request.text] + request.paraphrases, device)
        right = [exact_match(answer, [request.answer]) for answer in now]
        paraphrases_right += right[1:]
        results.append({**edit, "new_answer": now[0], "success": right[0], "paraphrases_right": sum(right[1:])})
    after = generate(model, tokenizer, unrelated, device) if unrelated else []

    def share(flags: list[bool]) -> float | None:
        return sum(flags) / len(flags) if flags else None
    return {"edits": results, "success": share([r["success"] for r in results]),
            "generalization": share(paraphrases_right),
            "locality": share([a == b for a, b in zip(before, after)])}
