"""What `nkb runs` says a run was for, read from the run's config alone."""

import pytest

from stages.configs import EvaluateConfig, FinetuneConfig, InjectConfig
from stages.registry import run_subject


@pytest.mark.parametrize("stage, config, expected", [
    ("finetune", FinetuneConfig(model="base+nkb", epochs=30).model_dump(), "base+nkb.qa from base+nkb, 30 epochs"),
    ("finetune", FinetuneConfig(model="base", task="summaries", epochs=20).model_dump(),
     "base.summaries from base, 20 epochs"),
    ("inject", InjectConfig(corpus="enwiki", steps=300).model_dump(), "base+nkb from base, 300 steps"),
    ("evaluate", {**EvaluateConfig(model="base.qa").model_dump(), "model_name": "base.qa"}, "base.qa, on validation"),
    ("questions", {"path": "x.jsonl", "format": "nq_open", "dataset": "nq", "split": "train"}, "nq.train"),
    ("salient-spans", {"corpus": "general", "source": "pretraining"}, "corpus general (pretraining)"),
    ("finetune", {"model": "base", "a_setting_since_removed": 1}, "base.qa from base"),
    ("no-such-stage", {}, ""),
])
def test_a_run_is_described_by_its_model_data_and_length(stage, config, expected):
    assert run_subject(stage, config) == expected
