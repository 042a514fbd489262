"""Knowledge surgery (the NKB paper's section 6): change what a model answers by editing one slot's value.

The slot of a layer that fires most when the first answer token is generated gets
`v_slot += λ (e_target − e_original)`, the output-embedding rows of the wanted and the predicted token
(the sign of the paper's Table 7 and the authors' code). Every edit keeps the old value, so it can be
undone exactly. `sweep` measures the paper's Table 8 (success and change rate per λ); `edit_answer`
edits a whole multi-token answer, one slot per token.
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


def edit_slot(model: nn.Module, layer: str, slot: int, target_token: int, original_token: int, lam: float) -> Edit:
    """Apply the surgery to one slot."""
    values = mounted_layers(model)[layer].nkb_values.weight
    old = values[:, slot].detach().clone()
    delta = output_embedding(model, target_token) - output_embedding(model, original_token)
    with torch.no_grad():
        values[:, slot] += lam * delta.to(values.dtype)
    return Edit(layer, slot, lam, target_token, original_token, old)


@torch.no_grad()
def first_token(model: nn.Module, tokenizer, texts: list[str]) -> list[int]:
    """The greedy first answer token for each input."""
    device = next(model.parameters()).device
    enc = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=256).to(device)
    start = torch.full((len(texts), 1), model.config.decoder_start_token_id, device=device)
    logits = model(**enc, decoder_input_ids=start).logits[:, -1]
    return logits.argmax(-1).tolist()


@torch.no_grad()
def next_token(model: nn.Module, tokenizer, text: str, prefix: list[int]) -> int:
    """The greedy next answer token after `prefix` (teacher-forced)."""
    device = next(model.parameters()).device
    enc = tokenizer([text], return_tensors="pt").to(device)
    ids = torch.tensor([[model.config.decoder_start_token_id] + prefix], device=device)
    return int(model(**enc, decoder_input_ids=ids).logits[0, -1].argmax())


def top_slot(model: nn.Module, tokenizer, text: str, layer: str, prefix: list[int] | None = None) -> int:
    """The slot of `layer` that fires most at the next decoding step after `prefix` (default: the first)."""
    ffn = mounted_layers(model)[layer]
    captured = []
    handle = ffn.register_forward_hook(lambda m, i, o: captured.append(m.slot_weights(i[0]).detach()))
    device = next(model.parameters()).device
    try:
        enc = tokenizer([text], return_tensors="pt").to(device)
        ids = torch.tensor([[model.config.decoder_start_token_id] + (prefix or [])], device=device)
        with torch.no_grad():
            model(**enc, decoder_input_ids=ids)
    finally:
        handle.remove()
    return int(captured[-1][0, -1].argmax())


def sweep(model: nn.Module, tokenizer, texts: list[str], gold_answers: list[str], layer: str, lambdas: list[float],
          questions: int, others: int, seed: int = 0) -> tuple[list[dict], int]:
    """The paper's Table 8 on `texts` (model inputs) and their gold answers.

    Of the inputs whose first predicted token is not the gold answer's, `questions` are chosen at random; for
    each, the top slot is edited toward the gold first token at every λ, and the edit is undone. Returns a row
    per (question, λ) — {question (index into texts), slot, lambda, original, target, new (tokens), success,
    change_rate: the share of `others` other inputs whose first token changed (None without
    others)} — and how many were wrong."""
    gold = [tokenizer(a, add_special_tokens=False)["input_ids"][0] for a in gold_answers]
    predicted = first_token(model, tokenizer, texts)
    wrong = [i for i in range(len(texts)) if predicted[i] != gold[i]]
    rng = np.random.default_rng(seed)
    chosen = [int(i) for i in rng.permutation(wrong)[:questions]]
    token = tokenizer.convert_ids_to_tokens
    rows = []
    for i in chosen:
        slot = top_slot(model, tokenizer, texts[i], layer)
        checked = [int(j) for j in rng.choice([j for j in range(len(texts)) if j != i],
                                              size=min(others, len(texts) - 1), replace=False)]
        for lam in lambdas:
            edit = edit_slot(model, layer, slot, gold[i], predicted[i], lam)
            after = first_token(model, tokenizer, [texts[i]] + [texts[j] for j in checked])
            edit.undo(model)
            changed = sum(after[1 + n] != predicted[j] for n, j in enumerate(checked))
            changed = changed / len(checked) if checked else None  # a one-question split has no others to check
            rows.append({"question": i, "slot": slot, "lambda": lam, "original": token(predicted[i]),
                         "target": token(gold[i]), "new": token(after[0]), "success": after[0] == gold[i],
                         "change_rate": changed})
    return rows, len(wrong)


def edit_answer(model: nn.Module, tokenizer, text: str, answer: str, layer: str, lam: float,
                device: Device) -> dict:
    """Edit the top slot at each step of the wanted answer (teacher-forced: step t sees the answer's first t
    tokens; a step already predicting its token is left alone). The model stays edited.

    Returns {old_answer, new_answer, steps: [{step, slot, original, target}]}."""
    old_answer = generate(model, tokenizer, [text], device, max_new_tokens=32)[0]
    wanted = tokenizer(answer, add_special_tokens=False)["input_ids"]
    steps = []
    for t, token in enumerate(wanted):
        predicted = next_token(model, tokenizer, text, wanted[:t])
        if predicted == token:
            continue
        slot = top_slot(model, tokenizer, text, layer, prefix=wanted[:t])
        edit_slot(model, layer, slot, token, predicted, lam)
        steps.append({"step": t, "slot": slot, "original": tokenizer.convert_ids_to_tokens(predicted),
                      "target": tokenizer.convert_ids_to_tokens(token)})
    new_answer = generate(model, tokenizer, [text], device, max_new_tokens=32)[0]
    return {"old_answer": old_answer, "new_answer": new_answer, "steps": steps}
