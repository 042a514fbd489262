"""Model sizes: the config's choices are exactly the sizes new_t5 builds, and each is larger than the last; the
activation new_t5 builds is T5 v1.1's and survives a save and reload."""

from typing import get_args

import pytest
import torch
from transformers import T5ForConditionalGeneration
from transformers.activations import ACT2FN

from stages.configs import ModelSize
from nkb_model.base_model import SIZES, new_t5, train_tokenizer

TEXTS = [f"Person {i} was born in city {i % 7} and worked for company {i % 5}." for i in range(300)]


def test_config_sizes_are_the_model_sizes():
    assert set(get_args(ModelSize)) == set(SIZES)


def test_sizes_grow_in_order():
    tokenizer = train_tokenizer(TEXTS, vocab_size=60)
    params = {size: sum(p.numel() for p in new_t5(tokenizer, size).parameters()) for size in ("tiny", "mini", "small")}
    assert params["tiny"] < params["mini"] < params["small"]
    assert 1.5 < params["mini"] / params["tiny"] < 2.5  # "about twice tiny's parameters", as the pipeline says


def test_new_t5_has_t5_v11_gelu_and_reloads_with_it(tmp_path):
    model = new_t5(train_tokenizer(TEXTS, vocab_size=60), "tiny")
    model.save_pretrained(tmp_path)
    reloaded = T5ForConditionalGeneration.from_pretrained(tmp_path)
    built, loaded = (m.decoder.block[-1].layer[-1].DenseReluDense.act for m in (model, reloaded))
    assert type(loaded) is type(built)
    x = torch.linspace(-8, 8, 10_001)
    # gelu_new to float rounding; exact (erf) GELU differs by up to ~5e-4 and would fail here
    torch.testing.assert_close(built(x), ACT2FN["gelu_new"](x), atol=1e-6, rtol=0)


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


def test_sequenced_draws_all_of_the_first_source_then_the_second_and_each_step_names_its_source():
    from nkb_model.base_model import Interleaved, Named, Sequenced, metric_at
    qa, ssm, general = (Named(lambda step, n=n: (n, step), f"{n}_loss") for n in ("qa", "ssm", "general"))
    before = Sequenced(qa, Interleaved(ssm, general, 0.5), 4)
    assert [before(step) for step in range(8)] == [("qa", 0), ("qa", 1), ("qa", 2), ("qa", 3), ("ssm", 0),
                                                    ("general", 0), ("ssm", 1), ("general", 1)]
    assert [metric_at(before, step) for step in range(6)] == ["qa_loss"] * 4 + ["ssm_loss", "general_loss"]
    mixed = Interleaved(Interleaved(ssm, general, 0.5), qa, 0.25)
    assert all(metric_at(mixed, step) == f"{mixed(step)[0]}_loss" for step in range(40))


def test_a_tiny_corpus_still_holds_out_one_row_for_the_no_forgetting_check():
    """Issue 53: 4 packed sequences at the default 5 % held out none, and the report divided by zero."""
    from nkb_model.base_model import held_out_count
    assert [held_out_count(n, 0.05) for n in (0, 1, 2, 4, 19, 20, 100)] == [0, 0, 1, 1, 1, 1, 5]
    assert held_out_count(4, 0.0) == 0  # asked for none


def test_the_held_out_loss_of_no_rows_is_refused_in_words():
    import numpy as np

    from nkb_model.checks import heldout_loss
    with pytest.raises(ValueError, match="no held-out rows"):
        heldout_loss(None, None, np.zeros((0, 8), dtype=np.int64), None)
