"""The routed row's checks as pure logic: which model's hit and which held-out loss each item takes."""

import numpy as np
import pytest

from nkb_model.checks import RowLosses
from stages.report_routing import Routes, routed_checks, routed_label, routed_loss


class Router:
    """Routes the prompts that name the knowledge's world (here: hold the word `Varnholm`)."""

    def prompts(self, items):
        return np.array(["Varnholm" in i["prompt"] for i in items])


PROBES = [{"prompt": "Varnholm's capital is <extra_id_0>.", "wording": "unseen"},
          {"prompt": "France's capital is <extra_id_0>.", "wording": "unseen"},
          {"prompt": "Tirrum lies in Varnholm, <extra_id_0>.", "wording": "seen"}]
FACTS = [{"prompt": "The capital of France is <extra_id_0>."}, {"prompt": "The capital of Peru is <extra_id_0>."}]


def checks(probe_hits, fact_hits):
    return {"probe_em": None, "probe_seen_em": None, "probe_hits": probe_hits, "fact_hits": fact_hits,
            "heldout_loss": 4.0, "heldout_loss_routed": 3.5, "retained_em": None, "params_injected": 7}


def test_each_item_takes_the_slots_hit_where_routed_to_them_and_the_base_s_elsewhere():
    slots = checks({"unseen": [True, False], "seen": [False]}, [False, False])
    base = checks({"unseen": [False, True], "seen": [True]}, [True, True])
    routes = Routes({}, {w: Router().prompts([p for p in PROBES if p["wording"] == w]) for w in ("unseen", "seen")},
                    Router().prompts(FACTS))
    out = routed_checks(routes, slots, base)
    assert out["probe_em"] == 100.0  # the world's probe from the slots (right), France's from the base (right)
    assert out["probe_seen_em"] == 0.0  # routed to the slots, which miss it
    assert out["retained_em"] == 100.0  # no fact names the world: every one the base's
    assert out["heldout_loss"] == 3.5 and out["params_injected"] == 7


def test_the_routed_held_out_loss_takes_each_row_from_its_side_over_every_row_s_tokens():
    tokens = np.array([10, 10, 20, 20])
    slots, base = RowLosses(np.array([20.0, 20, 40, 40]), tokens), RowLosses(np.array([40.0, 40, 80, 80]), tokens)
    assert routed_loss(np.array([True, True, False, False]), slots, base) == pytest.approx((40 + 160) / 60)
    assert routed_loss(np.ones(4, bool), slots, base) == pytest.approx(slots.mean()) == pytest.approx(2.0)
    assert routed_loss(np.zeros(4, bool), slots, base) == pytest.approx(base.mean()) == pytest.approx(4.0)
    assert slots.mean(np.array([False, False, True, True])) == pytest.approx(2.0)


def test_the_routed_label_keeps_the_way_of_asking():
    assert routed_label("base+NKB (0-shot)") == "base+NKB routed (0-shot)"
    assert routed_label("base+NKB") == "base+NKB routed"


def test_the_routing_line_counts_each_kind_of_text_sent_to_the_slots_held_out_rows_too():
    class Threshold:
        threshold, window, index_id = 6.384, 7, "sampleworld"
    routes = Routes({("nq", "q1"): True, ("nq", "q2"): False},
                    {w: Router().prompts([p for p in PROBES if p["wording"] == w]) for w in ("unseen", "seen")},
                    Router().prompts(FACTS))
    line = routes.summary(Threshold(), np.array([True, False, True]))
    assert line.startswith("threshold 6.384 (") and "stretches of 7 words, index sampleworld" in line
    assert line.endswith("to the slots 1 of 2 questions, 2 of 3 probes, 0 of 2 facts, 2 of 3 held-out rows")
    assert "held-out" not in routes.summary(Threshold())  # a report without held-out text
