"""Kformer mounted on real Hugging Face T5 modules (tiny random configs, CPU)."""

import pytest
import torch

from nkb_model.kformer import (KformerConfig, KformerFeedForward, encode_documents, knowledge, load_kformer,
                               mount_kformer, mounted_kformer, save_kformer, unmount_kformer)
from nkb_model.nkb import NKBConfig, mount_nkb
from tests.nkb_model.test_nkb import VARIANTS, batch, tiny_t5


def docs(seed: int = 2, n: int = 3, length: int = 6) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, 64, (3, n, length), generator=g)


@pytest.mark.parametrize("ffn", VARIANTS)
def test_zero_value_projections_leave_outputs_unchanged(ffn):
    model = tiny_t5(ffn)
    with torch.no_grad():
        before = model(**batch()).logits
        names = mount_kformer(model, KformerConfig(zero_values=True))
        mounted = model(**batch(), knowledge_ids=docs()).logits
        unmount_kformer(model)
        after = model(**batch()).logits
    assert names == ["encoder.0", "encoder.1"]  # "the top 3" of a 2-block encoder
    assert torch.equal(before, mounted) and torch.equal(before, after)


@pytest.mark.parametrize("ffn", VARIANTS)
def test_knowledge_changes_outputs_per_example(ffn):
    model = tiny_t5(ffn)
    mount_kformer(model, KformerConfig(zero_values=False))
    with torch.no_grad():
        one = model(**batch(), knowledge_ids=docs(2)).logits
        other = model(**batch(), knowledge_ids=docs(3)).logits
    assert not torch.equal(one, other)
    assert model.kformer.vectors is None  # the call's knowledge does not outlive the call


def test_knowledge_vectors_ignore_padding():
    model = tiny_t5("gated-gelu")
    mount_kformer(model, KformerConfig(zero_values=False))
    ids = docs()
    padded = torch.cat([ids, torch.zeros(3, 3, 4, dtype=torch.long)], dim=-1)  # pad id 0 after each document
    with_empty = torch.cat([ids, torch.zeros(3, 2, 6, dtype=torch.long)], dim=1)  # two absent documents
    with torch.no_grad():
        reference = model(**batch(), knowledge_ids=ids).logits
        assert torch.equal(model(**batch(), knowledge_ids=padded).logits, reference)
        assert torch.allclose(model(**batch(), knowledge_ids=with_empty).logits, reference, atol=1e-6)
        vectors, present = model.kformer.mean_embedding(padded)
        brute = model.kformer.kformer_embed(ids).mean(-2)
    assert torch.allclose(vectors, brute, atol=1e-6) and present.bool().all()


def test_generate_reads_the_knowledge_and_beams_repeat_it():
    model = tiny_t5("gated-gelu")
    mount_kformer(model, KformerConfig(zero_values=False))
    inputs = batch()["input_ids"]
    with torch.no_grad(), knowledge(model, docs()):
        greedy = model.generate(input_ids=inputs, max_new_tokens=4, do_sample=False)
        beams = model.generate(input_ids=inputs, max_new_tokens=4, num_beams=3, do_sample=False)
    assert greedy.shape[0] == 3 and beams.shape[0] == 3
    with pytest.raises(RuntimeError, match="without knowledge"):
        model.generate(input_ids=inputs, max_new_tokens=2)


def test_rank_by_question_keeps_the_best_matching_documents():
    model = tiny_t5("gated-gelu")
    mount_kformer(model, KformerConfig(docs=2, rank_by_question=True))
    question = torch.tensor([[5, 6, 7]])
    candidates = torch.stack([torch.tensor([[9, 9, 9], [5, 6, 7], [11, 12, 13], [6, 7, 5]])])  # (1, 4, 3)
    model.kformer.set(candidates, question)
    want, _ = model.kformer.mean_embedding(candidates[:, [1, 3]])
    assert model.kformer.vectors.shape == (1, 2, 32)
    assert torch.allclose(model.kformer.vectors.sort(dim=1).values, want.sort(dim=1).values)


def test_save_load_round_trip_and_refuses_nkb(tmp_path):
    model = tiny_t5("relu")
    mount_kformer(model, KformerConfig(layers=["encoder.-1"], zero_values=False))
    save_kformer(model, tmp_path / "kformer")
    fresh = tiny_t5("relu")
    assert load_kformer(fresh, tmp_path / "kformer") == ["encoder.1"]
    assert isinstance(mounted_kformer(fresh)["encoder.1"], KformerFeedForward)
    with torch.no_grad():
        assert torch.equal(model(**batch(), knowledge_ids=docs()).logits, fresh(**batch(), knowledge_ids=docs()).logits)
    with_nkb = tiny_t5("relu")
    mount_nkb(with_nkb, NKBConfig())
    with pytest.raises(ValueError, match="NKB"):
        mount_kformer(with_nkb)


def test_encode_documents_pads_missing_documents():
    class Tok:
        pad_token_id = 0

        def __call__(self, text, add_special_tokens, truncation, max_length):
            return {"input_ids": [len(w) + 1 for w in text.split()][:max_length]}

    ids = encode_documents(Tok(), [["a bb ccc", "dddd"], ["e"]], doc_tokens=2)
    assert ids.tolist() == [[[2, 3], [5, 0]], [[2, 0], [0, 0]]]
