"""The field's ways of giving a model the documents instead of training them in: in the prompt, untrained (rag);
fine-tuned on the questions with the retrieved documents appended (concat) or fused into the FFNs as Kformer's
knowledge vectors (kformer, saved as `kformer/`)."""

from __future__ import annotations

from pathlib import Path

from nkb_model.method import Method


def load_kformer_folder(model, folder: Path):
    from nkb_model.kformer import load_kformer
    load_kformer(model, folder)
    return model


METHODS = (
    Method("rag", "prompt", "RAG", "The base, frozen, asked with each question's top 3 retrieved documents in its "
           "prompt (the retrieve stage's; no training): what every route is weighed against.",
           "the retrieved documents in its prompt", order=20, documents=3, later=True),
    Method("kformer", "finetune", "Kformer", "The base fine-tuned with Kformer (a fine-tuned model).",
           "the retrieved documents as Kformer knowledge vectors in its FFNs, trained end to end", order=100,
           folder="kformer", load=load_kformer_folder, load_order=90, needs_encoder=True),
    Method("concat", "finetune", "concat", "The base fine-tuned on questions with their retrieved documents "
           "appended (a fine-tuned model).",
           "the retrieved documents appended to each question (then cut to max_input_len), fine-tuned on the questions",
           order=110, needs_encoder=True),
)
