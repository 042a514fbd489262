import pytest

from nkb_model.metrics import exact_match, normalize_answer


@pytest.mark.parametrize("prediction,gold,expected", [
    ("Velmora", ["Velmora"], True),
    ("velmora", ["Velmora"], True),                          # case
    ("The Silver Lantern", ["Silver Lantern"], True),        # articles
    ("an apple", ["Apple"], True),
    ("Velmora.", ["Velmora"], True),                         # punctuation
    ("Rock 'n' roll!", ["rock n roll"], True),
    ("  Orvel   Works ", ["Orvel Works"], True),             # whitespace
    ("Norvalia", ["Velmora", "Norvalia"], True),             # max over several gold answers
    ("Velmora City", ["Velmora"], False),
    ("", ["Velmora"], False),
    ("theatre", ["atre"], False),                            # "the" only as a whole word
])
def test_exact_match(prediction, gold, expected):
    assert exact_match(prediction, gold) is expected


def test_normalize_answer():
    assert normalize_answer("The  Quick, Brown-Fox!") == "quick brownfox"
