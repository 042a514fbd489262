"""Model sizes: the config's choices are exactly the sizes new_t5 builds, and each is larger than the last."""

from typing import get_args

from flows.configs import ModelSize
from nkb_model.base_model import SIZES, new_t5, train_tokenizer

TEXTS = [f"Person {i} was born in city {i % 7} and worked for company {i % 5}." for i in range(300)]


def test_config_sizes_are_the_model_sizes():
    assert set(get_args(ModelSize)) == set(SIZES)


def test_sizes_grow_in_order():
    tokenizer = train_tokenizer(TEXTS, vocab_size=60)
    params = {size: sum(p.numel() for p in new_t5(tokenizer, size).parameters()) for size in ("tiny", "mini", "small")}
    assert params["tiny"] < params["mini"] < params["small"]
    assert 1.5 < params["mini"] / params["tiny"] < 2.5  # "about twice tiny's parameters", as the pipeline says


def test_interleaved_spreads_the_share_and_numbers_each_source_consecutively():
    from nkb_model.base_model import Interleaved
    for share in (0.5, 0.25, 0.6):
        mix = Interleaved(lambda step: ("first", step), lambda step: ("second", step), share)
        drawn = [mix(step) for step in range(100)]
        firsts = [s for name, s in drawn if name == "first"]
        seconds = [s for name, s in drawn if name == "second"]
        assert firsts == list(range(len(firsts))) and seconds == list(range(len(seconds)))
        assert len(seconds) == int(100 * share)
        # evenly spread: every window of 20 steps has its share of the second source, give or take one
        for lo in range(0, 80):
            assert abs(sum(name == "second" for name, _ in drawn[lo:lo + 20]) - 20 * share) <= 1
