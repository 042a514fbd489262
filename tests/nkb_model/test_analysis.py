"""Slots as key-value memories and knowledge surgery, on tiny random T5s (CPU)."""

import pytest
import torch

from nkb_model import analysis
from nkb_model.nkb import NKBConfig, mount_nkb, mounted_layers
from tests.nkb_model.test_nkb import VARIANTS, batch, tiny_t5


def brute_force_probs(model, value: torch.Tensor) -> torch.Tensor:
    """The output path written out by hand: T5 RMS norm with its scale, tied-embedding rescale, lm_head."""
    norm = model.get_decoder().final_layer_norm
    normed = value / torch.sqrt(value.pow(2).mean() + norm.variance_epsilon) * norm.weight
    if model.config.tie_word_embeddings:
        normed = normed * model.config.d_model ** -0.5
    logits = torch.stack([torch.dot(row, normed) for row in model.get_output_embeddings().weight])
    return torch.softmax(logits, dim=0)


@pytest.mark.parametrize("ffn", VARIANTS)
@pytest.mark.parametrize("kind", ["nkb", "ffn"])
def test_value_projection_equals_brute_force(ffn, kind):
    model = tiny_t5(ffn)
    mount_nkb(model, NKBConfig(layers=["decoder.-1"], slots=12))
    memory = analysis.memories(model, "decoder.-1", kind)
    assert memory.values.shape == (12 if kind == "nkb" else 48, 32) and memory.keys.shape == memory.values.shape
    ids, probs = analysis.project_values(model, memory.values, top_k=5)
    for slot in range(memory.values.shape[0]):
        expected = brute_force_probs(model, memory.values[slot]).topk(5)
        assert ids[slot].tolist() == expected.indices.tolist()
        torch.testing.assert_close(probs[slot], expected.values, rtol=1e-5, atol=1e-7)


def test_memories_name_the_layer_and_refuse_a_layer_without_nkb():
    model = tiny_t5("relu")
    mount_nkb(model, NKBConfig(layers=["decoder.1"]))
    assert analysis.memories(model, "decoder.-1").layer == "decoder.1"
    with pytest.raises(ValueError, match="no NKB is mounted on encoder.0; mounted: decoder.1"):
        analysis.memories(model, "encoder.0")


@pytest.mark.parametrize("ffn", VARIANTS)
def test_an_edit_changes_the_slot_and_undo_restores_every_bit(ffn):
    model = tiny_t5(ffn)
    mount_nkb(model, NKBConfig(layers=["decoder.-1"]))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    logits = model(**batch()).logits
    edit = analysis.edit_slot(model, "decoder.1", slot=3, target_token=7, original_token=9, lam=0.5)
    values = mounted_layers(model)["decoder.1"].nkb_values.weight
    delta = model.get_output_embeddings().weight[7] - model.get_output_embeddings().weight[9]
    torch.testing.assert_close(values[:, 3], before["decoder.block.1.layer.2.DenseReluDense.nkb_values.weight"][:, 3]
                               + 0.5 * delta)
    assert not torch.equal(model(**batch()).logits, logits)
    edit.undo(model)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(model(**batch()).logits, logits)


def test_a_strong_edit_of_the_top_slot_makes_the_target_the_first_token():
    model = tiny_t5("relu")
    mount_nkb(model, NKBConfig(layers=["decoder.-1"]))

    class Tok:  # the ids are the text: "3 4 5" -> [3, 4, 5]
        def __call__(self, texts, return_tensors="pt", **_):
            ids = torch.tensor([[int(x) for x in t.split()] for t in texts])
            return type("Enc", (dict,), {"to": lambda self, d: self})({"input_ids": ids,
                                                                       "attention_mask": torch.ones_like(ids)})
    tok = Tok()
    first = analysis.first_token(model, tok, ["3 4 5"])[0]
    target = (first + 5) % 64
    slot = analysis.top_slot(model, tok, "3 4 5", "decoder.1")
    analysis.edit_slot(model, "decoder.1", slot, target, first, lam=200.0)
    assert analysis.first_token(model, tok, ["3 4 5"]) == [target]


def test_categories_come_from_the_salient_span_labels():
    lexicon = analysis.SpanLexicon(["Ada Quint", "Velmora", "Orvel Works", "7 March 1901", "The Quiet Bell"],
                                   ["PERSON", "GPE", "ORG", "DATE", "WORK_OF_ART"])
    assert [lexicon.category(p) for p in ["▁Ada", "▁Velm", "Orv", "▁1901", "▁Quiet", "▁the", ",", "▁Q"]] == [
        "Person", "Place", "Organisation", "Date", "Other", "None", "None", "None"]


def test_coherence_is_the_share_of_slots_whose_top_questions_share_a_relation():
    relation_of = ["born_in", "born_in", "employer", "employer"]
    assert analysis.coherence([[0, 1], [2, 3], [0, 2], [1]], relation_of) == pytest.approx(2 / 3)
