"""Model stages on a small sample world, on CPU."""

import json

import pytest
from transformers import AutoTokenizer, T5ForConditionalGeneration

from flows import model_stages, stages
from flows.configs import BaseModelConfig, SampleWorldConfig
from warehouse import Warehouse, query

TINY = BaseModelConfig(size="tiny", vocab_size=800, steps=6, batch_size=8, warmup_steps=2, seq_len=64)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    wh = Warehouse(tmp_path_factory.mktemp("models") / "wh")
    stages.load_sample_world(wh, SampleWorldConfig(people=15, background_people=30))
    return wh


def test_base_model_is_a_loadable_hugging_face_directory(world):
    result = model_stages.pretrain_base_model(world, TINY)
    directory = result.run.checkpoint
    model = T5ForConditionalGeneration.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert model.config.vocab_size == len(tokenizer) and tokenizer.pad_token_id == 0 and tokenizer.eos_token_id == 1
    assert tokenizer.convert_tokens_to_ids("<extra_id_0>") != tokenizer.unk_token_id
    info = json.loads(open(f"{directory}/nkb-model.json").read())
    assert info["params"] == sum(p.numel() for p in model.parameters())
    curve = query(world, "SELECT step, value FROM metrics WHERE metric = 'pretrain_loss' ORDER BY step").to_pylist()
    assert [r["step"] for r in curve] == list(range(1, 7)) and curve[-1]["value"] < curve[0]["value"]
    assert result.run.device == "cpu (fp32)"


def test_base_model_rerun_is_skipped_and_a_changed_config_retrains(world):
    assert model_stages.pretrain_base_model(world, TINY).skipped
    other = model_stages.pretrain_base_model(world, TINY.model_copy(update={"steps": 3}))
    assert not other.skipped and other.run.checkpoint != model_stages.pretrain_base_model(world, TINY).run.checkpoint
