"""bench.levers's choice of what to train and ask: any route of an experiment file, the routed NKB row aside."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.levers import route

# The demo's template: routed: true, zero_shot: [base, base+nkb].
TEMPLATE = str(Path(__file__).resolve().parents[2] / "experiments" / "sample-world-smollm2.yaml")


@pytest.mark.parametrize("row", ["base+nkb", "base+lora", "base+lora-8", "base+ft"])
def test_every_route_of_a_routed_template_is_trained_and_asked_as_the_experiment_asks_it(tmp_path, row):
    experiment, inject, asked = route(SimpleNamespace(files_dir=tmp_path), TEMPLATE, row,
                                      ["stages.inject.knowledge_questions=true"])
    assert inject.model_name() == row and inject.knowledge_questions
    # asked as the NKB row is: K-shot, then with no examples
    assert [(c.model, c.shots) for c in asked] == [(row, experiment.shots), (row, 0)]
    assert experiment.routed == (row == "base+nkb")


def test_a_row_the_experiment_does_not_train_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="rows.1: Input should be .*'base\\+ft'"):
        route(SimpleNamespace(files_dir=tmp_path), TEMPLATE, "base+prompt", [])
