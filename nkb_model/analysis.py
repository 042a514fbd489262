"""Reading NKB slots (and any supported FFN) as key-value memories (editing them is `nkb_model.slot_edits`).

A FFN (or the NKB) computes `Σ_i act(x·k_i) v_i`: key i decides how strongly slot i fires, value i is
what it adds to the residual stream (Geva et al.; the NKB paper's sections 5 and 6).

Values are read through the model's own output path: the final norm (T5's decoder RMS norm, GPT-2's `ln_f`,
Llama's `norm`, with their learned scales), then, on a T5 that ties the output embedding to the input one,
the `d_model ** -0.5` rescaling T5 applies before the tied `lm_head`, then softmax. Both are applied
because that is what happens to anything added to the last block's residual stream; the
norm changes which tokens come first (its scale is per dimension), the rescaling only sharpens or
flattens the probabilities. For slots in earlier blocks this is the "logit lens" reading.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from torch import nn

from nkb_model.mounting import (architecture_of, ffn_maps, final_norm, get_ffn, is_gated, key_layer, linear_layer,
                                resolve_layers, rows, value_layer)
from nkb_model.families import family, teacher_forced
from nkb_model.nkb import NKBFeedForward, mounted_layers

CATEGORIES = {"PERSON": "Person", "GPE": "Place", "LOC": "Place", "FAC": "Place", "ORG": "Organisation",
              "DATE": "Date"}


# ---- memories: keys and values of a layer ------------------------------------------------------

@dataclass
class Memory:
    """The key-value memory of one FFN-like layer: keys (slots, d_model), values (slots, d_model)."""
    layer: str
    kind: str          # "nkb" or "ffn"
    keys: torch.Tensor
    values: torch.Tensor


def memories(model: nn.Module, layer: str, kind: str = "nkb") -> Memory:
    """The slots of the NKB mounted on `layer`, or (kind="ffn") the neurons of its original FFN (for a
    gated FFN the key is the gate's row: the gate decides whether the neuron fires)."""
    (name,) = resolve_layers(model, [layer])
    ffn = get_ffn(model, name)
    if kind == "nkb":
        if not isinstance(ffn, NKBFeedForward):
            raise ValueError(f"no NKB is mounted on {name}; mounted: {', '.join(mounted_layers(model)) or 'none'}")
        return Memory(name, kind, ffn.nkb_keys.weight.detach(), ffn.nkb_values.weight.detach().T)
    base = ffn.base_layer if isinstance(ffn, NKBFeedForward) else ffn
    return Memory(name, kind, rows(key_layer(base)).detach(), rows(value_layer(base)).detach().T)


def output_logits(model: nn.Module, vectors: torch.Tensor) -> torch.Tensor:
    """Vocabulary logits for vectors added to the decoder's residual stream (see the module docstring)."""
    lm_head = model.get_output_embeddings()
    with torch.no_grad():
        hidden = final_norm(model)(vectors.to(lm_head.weight.dtype))
        if architecture_of(model).scales_tied_output and model.config.tie_word_embeddings:
            hidden = hidden * model.config.d_model ** -0.5
        return lm_head(hidden).float()


def project_values(model: nn.Module, values: torch.Tensor, top_k: int = 10, batch: int = 4096):
    """(token ids, probabilities), each (slots, top_k): the tokens every value vector promotes most."""
    ids, probs = [], []
    for lo in range(0, values.shape[0], batch):
        p = output_logits(model, values[lo:lo + batch]).softmax(-1)
        top = p.topk(top_k, dim=-1)
        ids.append(top.indices)
        probs.append(top.values)
    return torch.cat(ids), torch.cat(probs)


class SpanLexicon:
    """Which entity category a vocabulary piece belongs to, learned from the salient spans: a piece
    belongs to the labels of the spans with a word that starts with it (majority label wins)."""

    def __init__(self, texts: list[str], labels: list[str]):
        self._labels: dict[str, Counter] = {}
        for text, label in zip(texts, labels):
            for word in text.split():
                for end in range(2, len(word) + 1):
                    self._labels.setdefault(word[:end], Counter())[label] += 1

    def category(self, piece: str) -> str:
        """The category of a vocabulary piece's text (`piece_text`; a SentencePiece piece may be passed as it is)."""
        piece = piece.replace("▁", "").strip()
        found = self._labels.get(piece) if len(piece) >= 2 else None
        if not found:
            return "None"
        return CATEGORIES.get(found.most_common(1)[0][0], "Other")


def piece_text(tokenizer, piece: str) -> str:
    """A vocabulary piece as the text it writes: SentencePiece's `▁` and byte-level BPE's `Ġ` and byte characters
    (`GrusÃ¸th` for `Grusøth`) turned back into text."""
    return tokenizer.convert_tokens_to_string([piece])


# ---- keys: which inputs make a slot fire --------------------------------------------------------

def first_step_weights(model: nn.Module, tokenizer, texts: list[str], layers: list[str], kind: str = "nkb",
                       batch_size: int = 64) -> dict[str, torch.Tensor]:
    """How strongly each slot of each of `layers` fires when the first answer token is generated: {layer: (texts,
    slots)}, every layer read in the same forward passes.

    Decoder layers (every layer of a decoder-only model): at the step that writes the first answer token. T5's
    encoder layers (no decoding step there): the strongest activation over the input's tokens."""
    read = {layer: memories(model, layer, kind).layer for layer in layers}
    captured: dict[str, list[torch.Tensor]] = {layer: [] for layer in layers}

    def capture(ffn: nn.Module, out: list[torch.Tensor]):
        def hook(_module, inputs, _output):
            x = inputs[0]
            out.append((ffn.slot_weights(x) if kind == "nkb" else _neuron_weights(ffn, x)).detach())
        return hook
    handles = []
    for layer, name in read.items():
        ffn = get_ffn(model, name)
        handles.append(ffn.register_forward_hook(capture(ffn, captured[layer])))
    rows: dict[str, list[torch.Tensor]] = {layer: [] for layer in layers}
    try:
        for lo in range(0, len(texts), batch_size):
            batch = texts[lo:lo + batch_size]
            inputs, offsets = teacher_forced(model, tokenizer, batch, [[] for _ in batch])
            for out in captured.values():
                out.clear()
            with torch.no_grad():
                model(**inputs)
            for layer, name in read.items():
                weights = captured[layer][-1]
                if family(model).reads_answer_at(name):
                    rows[layer].append(weights[torch.arange(len(batch)), torch.tensor(offsets)].float().cpu())
                else:
                    mask = inputs["attention_mask"].unsqueeze(-1).bool()
                    rows[layer].append(weights.masked_fill(~mask, float("-inf")).amax(1).float().cpu())
    finally:
        for handle in handles:
            handle.remove()
    return {layer: torch.cat(r) for layer, r in rows.items()}


def _neuron_weights(ffn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    base = ffn.base_layer if isinstance(ffn, NKBFeedForward) else ffn
    weights = getattr(base, ffn_maps(base).act)(key_layer(base)(x))
    return weights * linear_layer(base)(x) if is_gated(base) else weights


def coherence(top_questions: list[list[int]], relation_of: list[str]) -> float:
    """Share of slots whose top questions all share one relation (slots with fewer than 2 are left out)."""
    judged = [rows for rows in top_questions if len(rows) >= 2]
    if not judged:
        return 0.0
    return sum(len({relation_of[i] for i in rows}) == 1 for rows in judged) / len(judged)
