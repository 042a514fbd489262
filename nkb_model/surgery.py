"""Knowledge surgery (the NKB paper's section 6): change what a model answers by editing one slot's value.

The slot of a layer that fires most when the first answer token is generated gets
`v_slot += λ (e_target − e_original)`, the output-embedding rows of the wanted and the predicted token
(the sign of the paper's Table 7 and the authors' code). Every edit keeps the old value, so it can be
undone exactly. `sweep` measures the paper's Table 8 (success and change rate per strength); `edit_answer`
edits a whole multi-token answer, one slot per token; `edit_many` applies many edits to one model and
measures them the way knowledge-editing toolkits do (success, generalisation, locality).

The paper's λ is absolute: how far it moves a value depends on the scale of the model's output embeddings
and values (0.07 suits T5-base; it does nothing to a tiny model). A *strength* s is relative instead: the
edit gets the norm of s times the slot's current value, λ = s ‖v‖ / ‖e_target − e_original‖, so s = 1
doubles what the slot writes, in the new direction, on any model.

A model's answers may follow a prefix (a fine-tuned `answer: <extra_id_0>` model first writes the sentinel):
`prefix` is the decoder ids before the answer, so "the first answer token" is the one after them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from nkb_model.generation import generate
from nkb_model.nkb import mounted_layers
from nkb_model.train import Device


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


def edit_lambda(model: nn.Module, layer: str, slot: int, target_token: int, original_token: int,
                strength: float) -> float:
    """The paper's λ for relative `strength`: the edit's norm is `strength` times the slot value's norm."""
    value = mounted_layers(model)[layer].nkb_values.weight[:, slot].detach().float()
    delta = (output_embedding(model, target_token) - output_embedding(model, original_token)).float()
    return float(strength * value.norm() / delta.norm().clamp_min(1e-12))


def edit_slot(model: nn.Module, layer: str, slot: int, target_token: int, original_token: int, lam: float) -> Edit:
    """Apply the surgery to one slot with the paper's absolute λ."""
    values = mounted_layers(model)[layer].nkb_values.weight
    old = values[:, slot].detach().clone()
    delta = output_embedding(model, target_token) - output_embedding(model, original_token)
    with torch.no_grad():
        values[:, slot] += lam * delta.to(values.dtype)
    return Edit(layer, slot, lam, target_token, original_token, old)


def strong_edit(model: nn.Module, layer: str, slot: int, target_token: int, original_token: int, strength: float,
                relative: bool = True) -> Edit:
    """`edit_slot` with a relative strength (`relative`), or with `strength` as the paper's absolute λ."""
    lam = edit_lambda(model, layer, slot, target_token, original_token, strength) if relative else strength
    return edit_slot(model, layer, slot, target_token, original_token, lam)


def _decoder_ids(model: nn.Module, prefix: list[int], rows: int, device) -> torch.Tensor:
    return torch.tensor([[model.config.decoder_start_token_id] + list(prefix)] * rows, device=device)


@torch.no_grad()
def first_token(model: nn.Module, tokenizer, texts: list[str], prefix: list[int] = ()) -> list[int]:
    """The greedy first answer token (after `prefix`) for each input."""
    device = next(model.parameters()).device
    enc = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=256).to(device)
    logits = model(**enc, decoder_input_ids=_decoder_ids(model, prefix, len(texts), device)).logits[:, -1]
    return logits.argmax(-1).tolist()


def next_token(model: nn.Module, tokenizer, text: str, prefix: list[int]) -> int:
    """The greedy next token after the decoder ids `prefix` (teacher-forced)."""
    return first_token(model, tokenizer, [text], prefix)[0]


def top_slot(model: nn.Module, tokenizer, text: str, layer: str, prefix: list[int] = ()) -> int:
    """The slot of `layer` that fires most at the next decoding step after `prefix` (default: the first)."""
    ffn = mounted_layers(model)[layer]
    captured = []
    handle = ffn.register_forward_hook(lambda m, i, o: captured.append(m.slot_weights(i[0]).detach()))
    device = next(model.parameters()).device
    try:
        enc = tokenizer([text], return_tensors="pt").to(device)
        with torch.no_grad():
            model(**enc, decoder_input_ids=_decoder_ids(model, prefix, 1, device))
    finally:
        handle.remove()
    return int(captured[-1][0, -1].argmax())


def sweep(model: nn.Module, tokenizer, texts: list[str], gold_answers: list[str], layer: str, strengths: list[float],
          questions: int, others: int, seed: int = 0, relative: bool = True, prefix: list[int] = ()
          ) -> tuple[list[dict], int]:
    """The paper's Table 8 on `texts` (model inputs) and their gold answers.

    Of the inputs whose first predicted answer token is not the gold answer's, `questions` are chosen at random;
    for each, the top slot is edited toward the gold first token at every strength (relative, or the paper's
    absolute λ), and the edit is undone. Returns a row per (question, strength) — {question (index into texts),
    slot, strength, lambda (the λ applied), original, target, new (tokens), success, change_rate: the share of
    `others` other inputs whose first token changed (None without others)} — and how many were wrong."""
    gold = [tokenizer(a, add_special_tokens=False)["input_ids"][0] for a in gold_answers]
    predicted = first_token(model, tokenizer, texts, prefix)
    wrong = [i for i in range(len(texts)) if predicted[i] != gold[i]]
    rng = np.random.default_rng(seed)
    chosen = [int(i) for i in rng.permutation(wrong)[:questions]]
    token = tokenizer.convert_ids_to_tokens
    rows = []
    for i in chosen:
        slot = top_slot(model, tokenizer, texts[i], layer, prefix)
        checked = [int(j) for j in rng.choice([j for j in range(len(texts)) if j != i],
                                              size=min(others, len(texts) - 1), replace=False)]
        for strength in strengths:
            edit = strong_edit(model, layer, slot, gold[i], predicted[i], strength, relative)
            after = first_token(model, tokenizer, [texts[i]] + [texts[j] for j in checked], prefix)
            edit.undo(model)
            changed = sum(after[1 + n] != predicted[j] for n, j in enumerate(checked))
            changed = changed / len(checked) if checked else None  # a one-question split has no others to check
            rows.append({"question": i, "slot": slot, "strength": strength, "lambda": edit.lam,
                         "original": token(predicted[i]), "target": token(gold[i]), "new": token(after[0]),
                         "success": after[0] == gold[i], "change_rate": changed})
    return rows, len(wrong)


def edit_answer(model: nn.Module, tokenizer, text: str, answer: str, layer: str, strength: float, device: Device,
                relative: bool = True, prefix: list[int] = (), end: int | None = None) -> dict:
    """Edit the top slot at each step of the wanted answer (teacher-forced: step t sees the answer's first t
    tokens after `prefix`; a step already predicting its token is left alone), and at the step after it toward
    `end`, the token that closes an answer, so that the answer stops there. The model stays edited.

    Returns {old_answer, new_answer, steps: [{step, slot, lambda, original, target}]}."""
    old_answer = generate(model, tokenizer, [text], device, max_new_tokens=32)[0]
    wanted = tokenizer(answer, add_special_tokens=False)["input_ids"] + ([end] if end is not None else [])
    steps = []
    for t, token in enumerate(wanted):
        seen = list(prefix) + wanted[:t]
        predicted = next_token(model, tokenizer, text, seen)
        if predicted == token:
            continue
        slot = top_slot(model, tokenizer, text, layer, seen)
        edit = strong_edit(model, layer, slot, token, predicted, strength, relative)
        steps.append({"step": t, "slot": slot, "lambda": edit.lam,
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


def edit_many(model: nn.Module, tokenizer, requests: list[Request], unrelated: list[str], layer: str,
              strength: float, device: Device, relative: bool = True, prefix: list[int] = (),
              end: int | None = None) -> dict:
    """Apply every request's `edit_answer` to one model, in order, then measure them all together:
    success (the edited input gives its wanted answer), generalisation (a paraphrase gives it too) and
    locality (an `unrelated` input's answer is what it was before any edit), the metrics of
    knowledge-editing toolkits. The model stays edited.

    Returns {edits: [{old_answer, new_answer, steps, success, paraphrases_right}], success, generalization,
    locality} with the rates as shares (None when there was nothing to measure)."""
    from nkb_model.metrics import exact_match
    before = generate(model, tokenizer, unrelated, device) if unrelated else []
    done = [edit_answer(model, tokenizer, r.text, r.answer, layer, strength, device, relative, prefix, end)
            for r in requests]
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
