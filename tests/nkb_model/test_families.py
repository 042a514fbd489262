from pathlib import Path

from nkb_model.architectures import ARCHITECTURES, architecture
from nkb_model.families import DECODER_ONLY, ENCODER_DECODER, family, family_of
from tests.nkb_model.test_nkb import tiny_t5

ROOT = Path(__file__).resolve().parents[2]


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1))


def test_a_model_and_its_config_tell_the_family():
    t5, llama = tiny_t5("relu"), tiny_llama()
    assert family(t5) is family(t5.config) is ENCODER_DECODER and family(llama) is DECODER_ONLY
    assert family_of("t5") is ENCODER_DECODER and family_of("llama") is family_of("gpt2") is DECODER_ONLY
    assert DECODER_ONLY.auto_class().__name__ == "AutoModelForCausalLM"


def test_pretraining_batches_follow_the_family():
    import numpy as np

    from nkb_model.base_model import train_tokenizer
    from tests.nkb_model.test_causal import TEXTS
    tokenizer = train_tokenizer(TEXTS, vocab_size=80)
    rows = np.arange(4 * 16).reshape(4, 16) % 60 + 2
    assert type(DECODER_ONLY.text_batches(rows, tokenizer, 2)).__name__ == "NextTokenBatches"
    assert type(ENCODER_DECODER.text_batches(rows, tokenizer, 2)).__name__ == "SpanCorruptionBatches"


def test_only_the_family_table_reads_is_encoder_decoder():
    readers = [str(p.relative_to(ROOT)) for package in ("corpus", "warehouse", "nkb_model", "stages", "flows", "bench")
               for p in (ROOT / package).rglob("*.py") if "is_encoder_decoder" in p.read_text()]
    assert readers == ["nkb_model/families.py"]


def _sources(*packages):
    return {str(p.relative_to(ROOT)): p.read_text() for package in packages for p in (ROOT / package).rglob("*.py")}


def test_what_differs_between_families_and_architectures_is_said_only_in_their_records():
    """No `decoder_only` branch outside the family records, and each architecture's name written once."""
    code = _sources("stages", "nkb_model", "bench", "flows")
    assert [path for path, text in code.items() if "decoder_only" in text] == ["nkb_model/families.py"]
    for name in ARCHITECTURES:
        assert [path for path, text in code.items() if f'"{name}"' in text] == ["nkb_model/architectures.py"], name


def test_an_unknown_architecture_is_refused_with_the_known_ones():
    import pytest
    with pytest.raises(ValueError, match="arch must be one of t5, llama, gpt2, not 'mamba'"):
        architecture("mamba")
