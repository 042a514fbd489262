"""What differs between model families, in one table (as `mounting.py` is for feed-forward layers).

An encoder-decoder model (T5) reads an input with its encoder and writes a target with its decoder. A decoder-only
model (GPT-2, Llama-style) reads both as one sequence and is trained on the target's tokens (`nkb_model.causal`):
its pairs, batches, pretraining text, decoding, probes and held-out loss differ accordingly. Stages and batch
builders ask a model's family (`family(model)`) for what they need; this module is the one place that tells a
model's family from its config.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    decoder_only: bool  # prompt and target read as one sequence, the loss on the target

    def pair_batches(self, examples_for_epoch, tokenizer, batch_size: int, seed: int = 0, max_input_len: int = 512,
                     max_target_len: int = 64, knowledge_ids=None, target_eos: bool = True,
                     group_by_length: bool = False):
        """Training batches of (input, target) text pairs (`nkb_model.batches.PairBatches`) as this family reads
        them. `target_eos`: whether a decoder-only model's targets end with EOS (answers do, masked spans do not)."""
        from nkb_model.batches import PairBatches
        return PairBatches(examples_for_epoch, tokenizer, batch_size, seed, max_input_len, max_target_len,
                           knowledge_ids=knowledge_ids, decoder_only=self.decoder_only, target_eos=target_eos,
                           group_by_length=group_by_length)

    def text_batches(self, rows, tokenizer, batch_size: int, seed: int = 0):
        """Pretraining batches of packed token rows: next-token prediction, or T5's span corruption."""
        if self.decoder_only:
            from nkb_model.causal import NextTokenBatches
            return NextTokenBatches(rows, batch_size, seed)
        from nkb_model.base_model import SpanCorruptionBatches
        return SpanCorruptionBatches(rows, tokenizer, batch_size, seed)

    def new_model(self, tokenizer, arch: str, size: str, dropout: float = 0.0, seed: int = 0):
        """A randomly initialised base of this family for `tokenizer` (`nkb_model.base_model`'s sizes)."""
        from nkb_model import base_model
        if self.decoder_only:
            return base_model.new_causal(tokenizer, arch, size, dropout, seed)
        return base_model.new_t5(tokenizer, size, dropout, seed)

    def auto_class(self):
        """The transformers Auto class that loads a model of this family."""
        from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM
        return AutoModelForCausalLM if self.decoder_only else AutoModelForSeq2SeqLM


ENCODER_DECODER = Family("encoder-decoder", decoder_only=False)
DECODER_ONLY = Family("decoder-only", decoder_only=True)


def family(model_or_config) -> Family:
    """The family of a model (or of its config)."""
    config = getattr(model_or_config, "config", model_or_config)
    return ENCODER_DECODER if config.is_encoder_decoder else DECODER_ONLY


def family_of_arch(arch: str) -> Family:
    """The family of a base built here: `t5`, or a decoder-only `llama` or `gpt2`."""
    return ENCODER_DECODER if arch == "t5" else DECODER_ONLY
