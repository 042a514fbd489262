"""Slots as key-value memories, on tiny random T5s (CPU)."""

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


def test_categories_come_from_the_salient_span_labels():
    lexicon = analysis.SpanLexicon(["Ada Quint", "Velmora", "Orvel Works", "7 March 1901", "The Quiet Bell"],
                                   ["PERSON", "GPE", "ORG", "DATE", "WORK_OF_ART"])
    assert [lexicon.category(p) for p in ["▁Ada", "▁Velm", "Orv", "▁1901", "▁Quiet", "▁the", ",", "▁Q"]] == [
        "Person", "Place", "Organisation", "Date", "Other", "None", "None", "None"]


def test_a_byte_level_bpe_piece_is_categorised_by_the_text_it_writes():
    """GPT-2, Llama-3 and SmolLM2 vocabularies mark a space with `Ġ` and write `ø` as two byte characters: read raw,
    no piece of theirs names a span."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["Ada Quint studied at Grusøth Works in Velmora."] * 20, vocab_size=300, min_frequency=1)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer)
    lexicon = analysis.SpanLexicon(["Ada Quint", "Grusøth Works"], ["PERSON", "ORG"])
    pieces = tokenizer.convert_ids_to_tokens(tokenizer(" Grusøth Quint")["input_ids"])
    assert pieces[0].startswith("Ġ") and lexicon.category(pieces[0]) == "None"
    assert [lexicon.category(analysis.piece_text(tokenizer, p)) for p in pieces] == ["Organisation", "Person"]


def test_coherence_is_the_share_of_slots_whose_top_questions_share_a_relation():
    relation_of = ["born_in", "born_in", "employer", "employer"]
    assert analysis.coherence([[0, 1], [2, 3], [0, 2], [1]], relation_of) == pytest.approx(2 / 3)
