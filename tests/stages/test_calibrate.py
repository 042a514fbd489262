"""A plan's runs that were never run here are timed by a short calibration on made-up text: the stage's own recipe,
a few of its steps, on this machine; nothing is read from or written to the warehouse."""

import pytest

from stages import calibrate
from stages.configs import BaseModelConfig, InjectConfig, SalientSpansConfig
from stages.plan import plan_steps
from warehouse import Warehouse

TEXTS = [f"Person {i} was born in city {i % 7} and worked for company {i % 5}." for i in range(100)]


@pytest.fixture(scope="module")
def brought(tmp_path_factory):
    """A random tiny Llama folder, as a user's own base would be brought in."""
    from nkb_model.base_model import new_causal, train_tokenizer
    folder = tmp_path_factory.mktemp("llama")
    tokenizer = train_tokenizer(TEXTS + [" ".join(calibrate.WORDS)], vocab_size=120)
    new_causal(tokenizer, "llama", "tiny").save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _plan(folder, **inject):
    return [("base-model", BaseModelConfig(name="base", source=str(folder))),
            ("salient-spans", SalientSpansConfig(corpus="k", max_words=12)),
            ("inject", InjectConfig(corpus="k", batch_size=4, **inject))]


def _files(home):
    return sorted(str(p) for p in home.rglob("*") if p.is_file() and not p.name.startswith("warehouse.duckdb"))


def test_a_fresh_warehouses_plan_times_the_base_and_the_injection_here_and_writes_nothing(brought, tmp_path):
    wh = Warehouse(tmp_path / "wh")
    before = _files(wh.home)
    plan = _plan(brought, steps=300, qa_share=0.5, knowledge_questions=True, own_text_weight=0.01, own_text_rows=4)
    untimed = plan_steps(wh, plan)
    assert [s.seconds for s in untimed if s.stage != "salient-spans"] == [None, None]  # no run here to go by
    steps = {s.stage: s for s in plan_steps(wh, plan, calibrate=True)}
    assert steps["base-model"].seconds > 0 and steps["base-model"].basis.startswith("loaded here in ")
    inject = steps["inject"]
    assert inject.action == "run" and inject.seconds > 0
    assert inject.basis.startswith(f"{calibrate.TIMED_STEPS} steps timed here on made-up text: ")
    assert steps["salient-spans"].seconds is None  # a stage with no calibration stays untimed
    assert _files(wh.home) == before  # nothing written
    model = calibrate.loaded_base(plan[0][1])[0]
    assert not any("nkb" in name for name, _ in model.named_parameters())  # the loaded base stays the base


def test_an_injections_time_is_its_preparation_and_its_step_time_for_every_step(brought, monkeypatch):
    monkeypatch.setattr(calibrate, "inject_timing", lambda config, plan: (12.0, 0.25))
    seconds, basis = calibrate.inject_seconds(InjectConfig(corpus="k", steps=1000), _plan(brought))
    assert seconds == 12.0 + 250.0 and basis.endswith("0.25 s a step")


def test_a_base_pretrained_here_is_not_calibrated(brought):
    plan = [("base-model", BaseModelConfig(name="base")), ("inject", InjectConfig(corpus="k"))]
    assert calibrate.calibrated("inject", plan[1][1], plan) == (None, "")
    assert calibrate.calibrated("base-model", plan[0][1], plan) == (None, "")
    assert calibrate.calibrated("evaluate", plan[1][1], plan) == (None, "")  # no calibration for that stage


def test_made_up_segments_have_the_planned_words_and_a_cued_span_each(brought):
    from transformers import AutoTokenizer

    from nkb_model.families import family_of
    tokenizer = AutoTokenizer.from_pretrained(brought)
    data = calibrate.made_up_data(InjectConfig(corpus="k", cued_spans=True, span_target="span_and_rest",
                                               qa_share=0.5, general_share=0.25, general_corpus="g"),
                                  20, family_of("llama"), tokenizer)
    assert {len(t.split()) for t in data.texts} == {20}
    assert len(data.drawn(0)) == calibrate.MADE_UP_SEGMENTS  # every segment has a span to recall
    assert len(data.questions[0]) == calibrate.MADE_UP_SEGMENTS and data.general.shape[1] > 0
