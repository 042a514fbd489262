"""A small base of our own: a SentencePiece Unigram tokenizer with T5's special tokens, a T5 config in a
few sizes, and span-corruption pretraining batches; or a decoder-only model (`new_causal`: Llama or GPT-2) of
the same sizes, pretrained on next-token prediction (`nkb_model.causal.NextTokenBatches`) with the same
tokenizer. The result is an ordinary Hugging Face directory (`from_pretrained` loads it), standing in for
`t5-base` or a Llama where no checkpoint can be downloaded.

Any local Hugging Face directory or hub name of a supported family works in its place
(`nkb_model.checkpoint.load_model`).
"""

from __future__ import annotations

import io
from typing import Iterable

import numpy as np
import torch
from transformers import T5Config, T5ForConditionalGeneration, T5Tokenizer

from nkb_model.batches import PackedRowBatches, pad_pairs
from nkb_model.architectures import architecture
from nkb_model.span_corruption import corrupt

# T5 v1.1-style (gated-GELU) models. Their GELU is v1.1's tanh approximation as PyTorch's one fused kernel
# (`gelu_pytorch_tanh`) rather than `gelu_new`'s five elementwise ops: the same function to float rounding, and
# 10-15 % faster training steps for tiny and mini on CPU, where those ops are memory-bound.
FEED_FORWARD = "gated-gelu_pytorch_tanh"
# The pipeline's "larger base" row is "mini": twice tiny's parameters for ~1.4x its CPU step time, so it can be
# pretrained for the base's own number of steps.
SIZES: dict[str, dict] = {
    "tiny": dict(d_model=128, d_ff=512, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=32),
    "mini": dict(d_model=192, d_ff=768, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=48),
    "small": dict(d_model=256, d_ff=1024, num_layers=4, num_decoder_layers=4, num_heads=4, d_kv=64),
    "large": dict(d_model=384, d_ff=1536, num_layers=6, num_decoder_layers=6, num_heads=6, d_kv=64),
}
EXTRA_IDS = 100


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4000) -> T5Tokenizer:
    """SentencePiece Unigram on `texts`, laid out like T5's: <pad>=0, </s>=1, <unk>=2, then pieces,
    then <extra_id_0..99>. `vocab_size` counts the pieces; it shrinks if the text is too small for it."""
    import sentencepiece as spm
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0, hard_vocab_limit=False,
        num_threads=2, minloglevel=2, input_sentence_size=2_000_000, shuffle_input_sentence=True,
        max_sentence_length=1 << 16)
    processor = spm.SentencePieceProcessor(model_proto=model.getvalue())
    vocab = [(processor.id_to_piece(i), processor.get_score(i)) for i in range(processor.get_piece_size())]
    return T5Tokenizer(vocab=vocab, extra_ids=EXTRA_IDS)


def new_t5(tokenizer: T5Tokenizer, size: str = "small", dropout: float = 0.0, seed: int = 0) -> T5ForConditionalGeneration:
    """A randomly initialised T5 sized `size` for `tokenizer`'s vocabulary."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, not {size!r}")
    torch.manual_seed(seed)
    config = T5Config(vocab_size=len(tokenizer), feed_forward_proj=FEED_FORWARD, dropout_rate=dropout,
                      tie_word_embeddings=True, decoder_start_token_id=tokenizer.pad_token_id,
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, **SIZES[size])
    return T5ForConditionalGeneration(config)


MAX_POSITIONS = 1024  # a decoder-only base's longest sequence (GPT-2 learns a position embedding for each)


def new_causal(tokenizer, arch: str, size: str = "small", dropout: float = 0.0, seed: int = 0):
    """A randomly initialised decoder-only model of T5 size `size` for `tokenizer`'s vocabulary (`causal_config`)."""
    from transformers import AutoModelForCausalLM
    config = causal_config(arch, size, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, dropout)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def causal_config(arch: str, size: str, vocab_size: int, eos_id: int, pad_id: int, dropout: float = 0.0):
    """A decoder-only config of T5 size `size`: the same width, FFN width, heads and head size, with the encoder's
    and the decoder's blocks in one stack, so that it has about as many parameters (no cross-attention) and reads
    as many tokens per step; the architecture's own parts are its record's (`nkb_model.architectures`). Embeddings
    tied, as in our T5s; EOS also begins a sequence."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, not {size!r}")
    record = architecture(arch)
    if record.causal_config is None:
        raise ValueError(f"{arch} is not a decoder-only architecture")
    dims = SIZES[size]
    return record.causal_config(dims, dims["num_layers"] + dims["num_decoder_layers"], dropout,
                                max_position_embeddings=MAX_POSITIONS, vocab_size=vocab_size, tie_word_embeddings=True,
                                eos_token_id=eos_id, bos_token_id=eos_id, pad_token_id=pad_id)


def sentinel_ids(tokenizer) -> list[int]:
    return tokenizer.convert_tokens_to_ids([f"<extra_id_{i}>" for i in range(EXTRA_IDS)])


def pack(token_ids: Iterable[list[int]], length: int, eos_id: int) -> np.ndarray:
    """Documents joined with EOS and cut into rows of `length` tokens (the last partial row dropped)."""
    flat: list[int] = []
    for ids in token_ids:
        flat.extend(ids)
        flat.append(eos_id)
    rows = len(flat) // length
    if rows == 0:
        raise ValueError(f"not enough text for one sequence of {length} tokens ({len(flat)} tokens)")
    return np.asarray(flat[: rows * length], dtype=np.int64).reshape(rows, length)


def held_out_count(sequences: int, share: float) -> int:
    """How many of `sequences` packed rows to hold out for the no-forgetting check: `share` of them, and at least one
    where the share is not zero and a row is left to train on (4 rows at 5 % would otherwise hold out none)."""
    return max(int(sequences * share), 1 if share > 0 and sequences > 1 else 0)


class SpanCorruptionBatches(PackedRowBatches):
    """`batch(step)`: span-corrupted packed sequences, in `PackedRowBatches`' order; epochs redraw the noise."""

    def __init__(self, rows: np.ndarray, tokenizer, batch_size: int, seed: int = 0, keep_last: bool = False):
        super().__init__(rows, batch_size, seed, keep_last)
        self.sentinels, self.eos, self.pad = sentinel_ids(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id

    def __call__(self, step: int) -> dict[str, torch.Tensor]:
        epoch, index = divmod(step, self.per_epoch)
        rng = np.random.default_rng([self.seed, epoch, index])
        pairs = []
        for row in self.row_ids(step):
            inp, tgt = corrupt(self.rows[row].tolist(), self.sentinels, rng)
            pairs.append((inp + [self.eos], tgt + [self.eos]))
        return pad_pairs(pairs, self.pad)


class Named:
    """A source of batches and the metric its steps' losses are recorded as (`metric_at`)."""

    def __init__(self, batches, metric: str):
        self.batches, self.metric = batches, metric

    def __call__(self, step: int) -> dict[str, torch.Tensor]:
        return self.batches(step)

    def __getattr__(self, name):  # per_epoch, batch_size, ...: the source's own
        return getattr(self.batches, name)


def metric_at(batches, step: int) -> str:
    """The metric pipeline step `step`'s loss (0-based: `train` records it as step + 1) is recorded as: that of the
    `Named` source the step is drawn from, through any mixes (so that curves of different objectives are never drawn
    as one)."""
    while not isinstance(batches, Named):
        which, step = batches.source(step)
        batches = (batches.first, batches.second)[which]
    return batches.metric


class Mix:
    """`batch(step)` drawn from `first` or `second` as `source(step)` says, each source seeing its own consecutive
    step numbers, so that the mix stays a pure function of the step."""
    first: object
    second: object

    def source(self, step: int) -> tuple[int, int]:
        """(0, the first source's step) or (1, the second's) for pipeline step `step`."""
        raise NotImplementedError

    def __call__(self, step: int) -> dict[str, torch.Tensor]:
        which, own_step = self.source(step)
        return (self.second if which else self.first)(own_step)


class Sequenced(Mix):
    """The first `first_steps` steps from `first`, the rest from `second`."""

    def __init__(self, first, second, first_steps: int):
        self.first, self.second, self.first_steps = first, second, first_steps

    def source(self, step: int) -> tuple[int, int]:
        return (0, step) if step < self.first_steps else (1, step - self.first_steps)


class Interleaved(Mix):
    """A `share` of the steps, spread evenly, from `second`, the rest from `first`."""

    def __init__(self, first, second, share: float):
        if not 0 < share < 1:
            raise ValueError(f"share must be between 0 and 1, not {share}")
        self.first, self.second, self.share = first, second, share

    def source(self, step: int) -> tuple[int, int]:
        taken = int((step + 1) * self.share)  # steps of `second` up to and including this one
        return (1, taken - 1) if taken > int(step * self.share) else (0, step - taken)
