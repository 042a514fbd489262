import pytest

from nkb_model.metrics import bootstrap_interval, exact_match, normalize_answer, seeds_intervals, sign_test


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


def test_rouge_l_on_known_cases():
    from nkb_model.metrics import rouge_l
    assert rouge_l(["the cat sat on the mat"], ["the cat sat on the mat"]) == pytest.approx(100)
    # LCS 2 of a 2-token prediction and a 6-token reference: P = 1, R = 1/3, F = 0.5
    assert rouge_l(["the cat"], ["the cat sat on the mat"]) == pytest.approx(50)
    assert rouge_l(["cats running"], ["cat runs"]) == pytest.approx(100)  # Porter stemming
    assert rouge_l(["x y", "the cat"], ["a b", "the cat"]) == pytest.approx(50)  # mean over examples
    with pytest.raises(ValueError):
        rouge_l(["a"], [])


def test_bleu_on_known_cases():
    from nkb_model.metrics import bleu
    assert bleu(["the cat sat on the mat ."], ["the cat sat on the mat ."]) == pytest.approx(100)
    assert bleu(["dog"], ["the cat sat on the mat"]) == pytest.approx(0)
    # equal lengths (no brevity penalty); n-gram precisions 6/7, 4/6, 3/5, 2/4
    score = bleu(["the cat sat on the red mat"], ["the cat sat on the mat today"])
    assert score == pytest.approx(100 * (6 / 7 * 4 / 6 * 3 / 5 * 2 / 4) ** 0.25, rel=1e-6)


def test_bootstrap_interval_brackets_the_rate_and_narrows_with_more_questions():
    low, high = bootstrap_interval([[True] * 30 + [False] * 70])
    assert low < 30 < high and 18 < low and high < 40          # about 30 ± 1.96 * sqrt(.3 * .7 / 100) * 100
    wide, narrow = (bootstrap_interval([[True, False] * n]) for n in (10, 500))
    assert wide[1] - wide[0] > 3 * (narrow[1] - narrow[0])
    assert bootstrap_interval([[True] * 5]) == (100.0, 100.0)  # no variation, no width
    average = bootstrap_interval([[True] * 10, [False] * 10])  # two datasets, weighed equally
    assert average == (50.0, 50.0)
    assert bootstrap_interval([[True, False] * 20], seed=1) == bootstrap_interval([[True, False] * 20], seed=1)


def test_the_sign_test_matches_the_binomial_tails():
    assert sign_test(9, 3) == pytest.approx(0.1460, abs=1e-4)  # 2 * P(X <= 3), X ~ Bin(12, 1/2)
    assert sign_test(3, 9) == sign_test(9, 3)
    assert sign_test(11, 3) == pytest.approx(0.0574, abs=1e-4)
    assert sign_test(5, 5) == 1.0 and sign_test(0, 0) == 1.0
    assert sign_test(10, 0) == pytest.approx(2 / 1024)


def test_seeds_intervals_bracket_the_mean_and_clear_zero_only_for_a_lead_the_questions_carry():
    reference = [True] * 6 + [False] * 194
    # three trainings that each add the same 10 questions: the lead is 5 points on every draw of them
    lead = [[True] * 16 + [False] * 184] * 3
    found = seeds_intervals(lead, reference)
    assert found["mean"][0] < 8.0 < found["mean"][1]
    assert 0 < found["lead"][0] < 5.0 < found["lead"][1]
    # trainings that gain some questions and lose as many: no lead
    even = [[False] * 3 + [True] * 3 + [True] * 3 + [False] * 191] * 3
    assert seeds_intervals(even, reference)["lead"][0] < 0 < seeds_intervals(even, reference)["lead"][1]
    with pytest.raises(ValueError, match="trainings of \\[199\\] questions against 200"):
        seeds_intervals([[True] * 199], reference)


def test_the_share_of_retrievals_gain_is_paired_and_none_where_retrieval_gains_nothing():
    from nkb_model.metrics import retrieval_share
    base = [[False] * 80 + [True] * 20]
    rag = [[False] * 40 + [True] * 60]
    row = [[False] * 60 + [True] * 40]  # half of retrieval's 40 points
    r, low, high = retrieval_share(row, base, rag)
    assert r == pytest.approx(0.5) and low < 0.5 < high and high - low < 0.6
    assert retrieval_share(row, base, base) == (None, None, None)
    with pytest.raises(ValueError, match="same questions"):
        retrieval_share([[True]], base, rag)
    # two datasets, averaged as the report averages them: each weighs the same whatever its size
    r2, _, _ = retrieval_share([row[0], [True] * 10], [base[0], [False] * 10], [rag[0], [True] * 10])
    assert r2 == pytest.approx((0.4 + 1.0 - 0.2 - 0.0) / (0.6 + 1.0 - 0.2 - 0.0))
