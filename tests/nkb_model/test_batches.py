"""PairBatches (a T5's): batches are a pure function of the step; pairs that repeat every epoch are tokenised
once."""

import numpy as np
import torch

from nkb_model.base_model import train_tokenizer
from nkb_model.families import ENCODER_DECODER

TEXTS = [f"Person {i} was born in city {i % 7} and worked for company {i % 5}." for i in range(300)]


class CountingTokenizer:
    """The real tokenizer, counting how many texts it was asked to encode."""

    def __init__(self, tokenizer):
        self.tokenizer, self.texts = tokenizer, 0
        self.pad_token_id = tokenizer.pad_token_id

    def __call__(self, texts, **kwargs):
        self.texts += len(texts)
        return self.tokenizer(texts, **kwargs)


def test_repeated_pairs_are_tokenised_once_and_changed_pairs_again():
    tokenizer = train_tokenizer(TEXTS, vocab_size=60)
    questions = [(f"question: where was person {i} born?", f"city {i % 7}") for i in range(12)]
    fixed = CountingTokenizer(tokenizer)
    batches = ENCODER_DECODER.pair_batches(lambda epoch: tuple(map(list, zip(*questions))), fixed, batch_size=4, seed=3)
    steps = [batches(step) for step in range(3 * batches.per_epoch)]
    assert fixed.texts == 2 * len(questions)  # inputs and targets, once for all three epochs

    # The same batches as a fresh loader that meets each epoch for the first time.
    for step in (0, 4, 8):
        fresh = ENCODER_DECODER.pair_batches(lambda epoch: tuple(map(list, zip(*questions))), tokenizer,
                                             batch_size=4, seed=3)
        assert all(torch.equal(fresh(step)[k], steps[step][k]) for k in steps[step])

    def masked(epoch):  # like SSM: other targets every epoch
        return [q for q, _ in questions], [f"city {(i + epoch) % 7}" for i in range(len(questions))]
    redrawn = CountingTokenizer(tokenizer)
    loader = ENCODER_DECODER.pair_batches(masked, redrawn, batch_size=4, seed=3)
    first, second = loader(0), loader(loader.per_epoch)
    assert redrawn.texts == 2 * 2 * len(questions)
    targets = {tokenizer.decode(row[row != -100], skip_special_tokens=True) for row in second["labels"]}
    rows = np.random.default_rng([3, 1]).permutation(len(questions))[:4]
    assert targets == {masked(1)[1][r] for r in rows} and not torch.equal(first["labels"], second["labels"])


def test_grouped_by_length_keeps_the_examples_and_pads_less():
    from nkb_model.batches import grouped_by_length
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 60, size=1003).tolist()
    order = np.random.default_rng(1).permutation(len(lengths))
    grouped = grouped_by_length(order, lengths, batch_size=8, rng=np.random.default_rng(2), window=16)
    assert sorted(grouped.tolist()) == list(range(len(lengths)))  # a permutation: every example, once
    assert grouped[1000:].tolist() == order[1000:].tolist()       # the rows past the last full batch stay last

    def padded(o):  # tokens a batch of 8 pads to, over the full batches
        return sum(8 * max(lengths[r] for r in o[lo:lo + 8]) for lo in range(0, 1000, 8))
    useful = sum(lengths[r] for r in order[:1000])
    assert padded(grouped) < 1.1 * useful < 0.75 * padded(order)  # close to no padding at all
    # Batches in random order: their longest examples do not rise (or fall) from step to step.
    widths = [max(lengths[r] for r in grouped[lo:lo + 8]) for lo in range(0, 1000, 8)]
    assert widths != sorted(widths) and widths != sorted(widths, reverse=True)


def test_grouped_batches_hold_pairs_of_similar_length_and_stay_a_function_of_the_step():
    tokenizer = train_tokenizer(TEXTS, vocab_size=60)
    pairs = [(" ".join(["word"] * (1 + i % 23)), f"city {i % 7}") for i in range(200)]

    def loader():
        return ENCODER_DECODER.pair_batches(lambda epoch: tuple(map(list, zip(*pairs))), tokenizer, batch_size=8,
                                            seed=3, group_by_length=True)
    plain = ENCODER_DECODER.pair_batches(lambda epoch: tuple(map(list, zip(*pairs))), tokenizer, batch_size=8, seed=3)
    grouped = loader()
    steps = range(2 * grouped.per_epoch)
    width = sum(grouped(s)["input_ids"].numel() for s in steps)
    assert width < 0.7 * sum(plain(s)["input_ids"].numel() for s in steps)
    assert sorted(np.concatenate([grouped.rows(s) for s in range(grouped.per_epoch)]).tolist()) == \
        sorted(np.concatenate([plain.rows(s) for s in range(plain.per_epoch)]).tolist())
    assert torch.equal(loader()(7)["input_ids"], grouped(7)["input_ids"])  # the same step, the same batch
