import numpy as np
import pytest

from nkb_model.span_corruption import corrupt, noise_mask

SENTINELS = [1000 + i for i in range(100)]


@pytest.mark.parametrize("length", [2, 5, 20, 128, 513])
def test_noise_mask_density_and_start(length):
    rng = np.random.default_rng(0)
    for _ in range(20):
        mask = noise_mask(length, rng)
        assert not mask[0] and 1 <= mask.sum() <= length - 1
        assert mask.sum() == min(max(round(length * 0.15), 1), length - 1)


def test_mean_span_length_is_about_three():
    rng = np.random.default_rng(1)
    spans = []
    for _ in range(200):
        mask = noise_mask(200, rng)
        starts = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))
        spans.append(mask.sum() / len(starts))
    assert np.mean(spans) == pytest.approx(3.0, rel=0.05)


def test_corrupt_round_trip():
    """Putting each sentinel's target tokens back into the input gives the original sequence."""
    rng = np.random.default_rng(2)
    ids = list(range(1, 60))
    inputs, targets = corrupt(ids, SENTINELS, rng)
    spans, current = {}, None
    for t in targets:
        if t in SENTINELS:
            current = t
            spans[current] = []
        else:
            spans[current].append(t)
    rebuilt = [tok for t in inputs for tok in (spans[t] if t in SENTINELS else [t])]
    assert rebuilt == ids and len(spans) >= 1 and targets[0] == SENTINELS[0]
