"""PairBatches: batches are a pure function of the step; pairs that repeat every epoch are tokenised once."""

import numpy as np
import torch

from nkb_model.base_model import train_tokenizer
from nkb_model.batches import PairBatches

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
    batches = PairBatches(lambda epoch: tuple(map(list, zip(*questions))), fixed, batch_size=4, seed=3)
    steps = [batches(step) for step in range(3 * batches.per_epoch)]
    assert fixed.texts == 2 * len(questions)  # inputs and targets, once for all three epochs

    # The same batches as a fresh loader that meets each epoch for the first time.
    for step in (0, 4, 8):
        fresh = PairBatches(lambda epoch: tuple(map(list, zip(*questions))), tokenizer, batch_size=4, seed=3)
        assert all(torch.equal(fresh(step)[k], steps[step][k]) for k in steps[step])

    def masked(epoch):  # like SSM: other targets every epoch
        return [q for q, _ in questions], [f"city {(i + epoch) % 7}" for i in range(len(questions))]
    redrawn = CountingTokenizer(tokenizer)
    loader = PairBatches(masked, redrawn, batch_size=4, seed=3)
    first, second = loader(0), loader(loader.per_epoch)
    assert redrawn.texts == 2 * 2 * len(questions)
    targets = {tokenizer.decode(row[row != -100], skip_special_tokens=True) for row in second["labels"]}
    rows = np.random.default_rng([3, 1]).permutation(len(questions))[:4]
    assert targets == {masked(1)[1][r] for r in rows} and not torch.equal(first["labels"], second["labels"])
