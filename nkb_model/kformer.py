"""Kformer (Yao et al., 2022) on a Hugging Face T5: retrieved texts as extra FFN key-value pairs.

Each retrieved document of a question becomes one knowledge vector: the mean of a trainable copy of
the token embeddings over the document's first `doc_tokens` tokens, padding excluded. In each injected
block two linear maps (d_model × d_model, no bias) turn a question's N knowledge vectors into N keys
and N values, used like rows of the block's own FFN:

    FFN'(x) = FFN(x) + act(x · Kᵀ) · V,    K = kformer_keys(knowledge), V = kformer_values(knowledge)

so every token of a question reads the documents of its own example, with the FFN's activation and
no softmax. Everything is trained end to end during fine-tuning. Like the NKB, the wrapper replaces
T5's DenseReluDense in place (T5's code untouched) and its weights are saved apart from T5's.

Value maps start at zero by default, so before training the model is exactly its base (that is also
what the tests check); keys start like T5's `wi` (std d_model^-0.5).

A batch's documents reach the layers in one of two ways: `model(..., knowledge_ids=ids)` (a forward
pre-hook takes them out of the keyword arguments, so training loops need no change), or
`with knowledge(model, ids): model.generate(...)` for generation, which calls the model many times.
`ids` is (batch, N, doc_tokens), padded with the pad id; a document of pad ids only is absent.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from nkb_model.mounting import (FeedForwardAddition, get_ffn, key_layer, layout, load_weights_exactly, mounted,
                                resolve_layers, restore, save_addition, set_ffn)
from nkb_model.nkb import NKBFeedForward

WEIGHTS_FILE = "kformer.safetensors"
CONFIG_FILE = "kformer_config.json"


@dataclass
class KformerConfig:
    layers: list[str] = field(default_factory=lambda: ["encoder.-3", "encoder.-2", "encoder.-1"])
    docs: int = 5                 # N knowledge vectors per question (the Kformer paper: 15-20 best on its tasks)
    doc_tokens: int = 64          # tokens of each document that are averaged
    rank_by_question: bool = False  # keep the N candidates whose vectors best match the mean question embedding
    zero_values: bool = True


class Knowledge(nn.Module):
    """The trainable embedding copy, and the knowledge vectors of the batch being run."""

    def __init__(self, embedding: nn.Embedding, pad_id: int, config: KformerConfig):
        super().__init__()
        self.kformer_embed = nn.Embedding.from_pretrained(embedding.weight.detach().clone(), freeze=False,
                                                          padding_idx=None)
        self.pad_id, self.config = pad_id, config
        self.vectors: torch.Tensor | None = None   # (batch, N, d_model)
        self.present: torch.Tensor | None = None   # (batch, N): 1 for a document, 0 for an empty one

    def mean_embedding(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Masked mean of the embeddings over the last axis of `ids`; and whether any token was there."""
        mask = (ids != self.pad_id).unsqueeze(-1).to(self.kformer_embed.weight.dtype)
        summed = (self.kformer_embed(ids) * mask).sum(-2)
        count = mask.sum(-2)
        return summed / count.clamp(min=1), (count.squeeze(-1) > 0).to(summed.dtype)

    def set(self, knowledge_ids: torch.Tensor, question_ids: torch.Tensor | None = None) -> None:
        vectors, present = self.mean_embedding(knowledge_ids)
        n = self.config.docs
        if self.config.rank_by_question and question_ids is not None and vectors.shape[1] > n:
            query, _ = self.mean_embedding(question_ids)                       # (batch, d)
            scores = torch.einsum("bnd,bd->bn", vectors, query).masked_fill(present == 0, float("-inf"))
            keep = scores.topk(n, dim=1).indices                              # (batch, n)
            vectors = vectors.gather(1, keep.unsqueeze(-1).expand(-1, -1, vectors.shape[-1]))
            present = present.gather(1, keep)
        self.vectors, self.present = vectors, present

    def clear(self) -> None:
        self.vectors = self.present = None


class KformerFeedForward(FeedForwardAddition):
    """T5's DenseReluDense plus the batch's knowledge as keys and values: `base_layer(x) + act(x Kᵀ) V`."""

    def __init__(self, base_layer: nn.Module, knowledge: Knowledge, zero_values: bool = True):
        super().__init__(base_layer)
        wi = key_layer(base_layer)
        self.kformer_keys = self.linear(self.d_model, self.d_model, like=wi)
        self.kformer_values = self.linear(self.d_model, self.d_model, like=wi)
        self.init_key_values(self.kformer_keys, self.kformer_values, self.d_model ** -0.5, zero_values)
        object.__setattr__(self, "knowledge", knowledge)  # shared, not a submodule: registered once, on the model

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # x: (rows, seq, d_model)
        out = self.base_layer(x)
        vectors, present = self.knowledge.vectors, self.knowledge.present
        if vectors is None:
            raise RuntimeError("a Kformer layer ran without knowledge: pass knowledge_ids=… to the model, or wrap "
                               "generate() in `with kformer.knowledge(model, ids):`")
        if vectors.shape[0] != x.shape[0]:  # generate() repeats each example for its beams
            vectors = vectors.repeat_interleave(x.shape[0] // vectors.shape[0], dim=0)
            present = present.repeat_interleave(x.shape[0] // present.shape[0], dim=0)
        vectors = vectors.to(x.dtype)
        keys, values = self.kformer_keys(vectors), self.kformer_values(vectors)       # (rows, N, d)
        weights = self.act(torch.einsum("bsd,bnd->bsn", x, keys)) * present.to(x.dtype).unsqueeze(1)
        return out + torch.einsum("bsn,bnd->bsd", weights, values).to(out.dtype)


# ---- mounting --------------------------------------------------------------------------------

def _pre_hook(module, args, kwargs):
    ids = kwargs.pop("knowledge_ids", None)
    if ids is not None:
        module.kformer.set(ids, kwargs.get("input_ids"))
        module._kformer_set_by_call = True
    return args, kwargs


def _post_hook(module, args, kwargs, output):
    if getattr(module, "_kformer_set_by_call", False):
        module.kformer.clear()
        module._kformer_set_by_call = False
    return output


def mount_kformer(model: nn.Module, config: KformerConfig | None = None) -> list[str]:
    """Mount Kformer on the given blocks' FFNs (in place); returns the canonical block names."""
    config = config or KformerConfig()
    if mounted(model, NKBFeedForward):
        raise ValueError("this model has NKB slots; Kformer is mounted on a model without them")
    if hasattr(model, "kformer"):
        raise ValueError("this model already has Kformer mounted")
    if "encoder" not in layout(model).stacks:
        raise ValueError(f"Kformer is mounted on a T5's encoder; a {type(model).__name__} has none")
    n_blocks = {"encoder": len(model.encoder.block), "decoder": len(model.decoder.block)}
    # "the top 3 layers" of a shallower model are all of its layers
    specs = [s for s in config.layers if not (s.split(".")[-1].startswith("-")
                                              and -int(s.split(".")[-1]) > n_blocks.get(s.split(".")[0], 0))]
    names = resolve_layers(model, specs)
    if not names:
        raise ValueError(f"no Kformer layers: {config.layers} name no block of this model")
    knowledge = Knowledge(model.get_input_embeddings(), model.config.pad_token_id, config)
    model.kformer = knowledge
    for name in names:
        set_ffn(model, name, KformerFeedForward(get_ffn(model, name), knowledge, config.zero_values))
    model.kformer_config = KformerConfig(**{**asdict(config), "layers": names})
    model._kformer_hooks = (model.register_forward_pre_hook(_pre_hook, with_kwargs=True),
                            model.register_forward_hook(_post_hook, with_kwargs=True))
    return names


def mounted_kformer(model: nn.Module) -> dict[str, KformerFeedForward]:
    return mounted(model, KformerFeedForward)


def kformer_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if ".kformer_" in f".{n}"}


def kformer_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in kformer_parameters(model).items()}


def unmount_kformer(model: nn.Module) -> dict[str, torch.Tensor]:
    """Put the original FFN modules back and drop the hooks; returns the removed Kformer weights."""
    removed = kformer_state_dict(model)
    restore(model, KformerFeedForward)
    for hook in getattr(model, "_kformer_hooks", ()):
        hook.remove()
    for attr in ("kformer", "kformer_config", "_kformer_hooks"):
        if hasattr(model, attr):
            delattr(model, attr)
    return removed


@contextlib.contextmanager
def knowledge(model: nn.Module, knowledge_ids: torch.Tensor, question_ids: torch.Tensor | None = None):
    """The batch's documents for every forward call inside the block (generation)."""
    model.kformer.set(knowledge_ids, question_ids)
    try:
        yield
    finally:
        model.kformer.clear()


def encode_documents(tokenizer, documents: list[list[str]], doc_tokens: int) -> torch.Tensor:
    """(batch, N, doc_tokens) ids of each example's documents: the first tokens of each, padded; examples
    with fewer documents get empty (all-pad) ones."""
    n = max(1, max((len(d) for d in documents), default=1))
    out = torch.full((len(documents), n, doc_tokens), tokenizer.pad_token_id, dtype=torch.long)
    for row, docs in enumerate(documents):
        for k, text in enumerate(docs):
            ids = tokenizer(text, add_special_tokens=False, truncation=True, max_length=doc_tokens)["input_ids"]
            out[row, k, :len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


# ---- saving and loading, apart from the base ------------------------------------------------

def save_kformer(model: nn.Module, directory: str | Path) -> Path:
    return save_addition(kformer_state_dict(model), json.dumps(asdict(model.kformer_config), indent=1), directory,
                         WEIGHTS_FILE, CONFIG_FILE)


def load_kformer(model: nn.Module, directory: str | Path) -> list[str]:
    """Mount a Kformer saved by `save_kformer` and load its weights exactly."""
    directory = Path(directory)
    names = mount_kformer(model, KformerConfig(**json.loads((directory / CONFIG_FILE).read_text())))
    load_weights_exactly(kformer_parameters(model), directory / WEIGHTS_FILE, "Kformer")
    return names
