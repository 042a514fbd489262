"""The trained blocks held to the base's own FFN writes on the base's own text (`own_text_weight`): the drift is what
the trained FFNs add there, it is nothing before training, each step's rows are the step's alone, and the term keeps
trained slots quieter on that text than training without it."""

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from nkb_model.adapters import mount_lora, train_ffn_maps
from nkb_model.base_model import Named, metric_at
from nkb_model.causal import encode_pairs, pad_causal
from nkb_model.mounting import get_ffn
from nkb_model.nkb import NKBConfig, mark_only_nkb_trainable, mount_nkb, nkb_parameters
from nkb_model.own_text import (TEACHER_TOP, HeldToOwnText, WithOwnText, drift, ffn_traffic, sample_own_text,
                                 teacher_kl)
from nkb_model.train import TrainConfig, choose_device, train
from tests.nkb_model.test_causal import TEXTS, byte_level_bpe

CPU = choose_device("cpu")
LAYERS = ["decoder.1", "decoder.3"]


def tiny_llama(vocab: int):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                                        num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=128)).eval()


@pytest.fixture(scope="module")
def tokenizer():
    return byte_level_bpe()


@pytest.fixture(scope="module")
def own(tokenizer):
    model = tiny_llama(len(tokenizer))
    ids = sample_own_text(model, tokenizer, rows=6, length=10, seed=0, device=CPU, batch_size=4)
    return ids, ffn_traffic(model, ids, LAYERS, CPU, batch_size=4)


def test_the_base_writes_rows_of_the_asked_length_and_the_same_ones_again_for_a_seed(tokenizer, own):
    ids, traffic = own
    model = tiny_llama(len(tokenizer))
    assert ids.shape == (6, 10)
    assert torch.equal(ids, sample_own_text(model, tokenizer, rows=6, length=10, seed=0, device=CPU, batch_size=4))
    assert not torch.equal(ids, sample_own_text(model, tokenizer, rows=6, length=10, seed=1, device=CPU, batch_size=4))
    assert traffic.inputs.shape == traffic.writes.shape == (6, 2, 10, 32) and len(traffic) == 6
    assert torch.all(traffic.scale > 0)


def test_texts_after_a_head_start_with_it_and_keep_the_length(tokenizer):
    from nkb_model.families import DECODER_ONLY
    model = tiny_llama(len(tokenizer))
    head = DECODER_ONLY.question_head()
    given = tokenizer(head, add_special_tokens=False)["input_ids"]
    ids = sample_own_text(model, tokenizer, rows=3, length=len(given) + 5, seed=0, device=CPU, head=head)
    assert ids.shape == (3, len(given) + 5) and all(row[:len(given)].tolist() == given for row in ids)
    with pytest.raises(ValueError, match="as long as the"):
        sample_own_text(model, tokenizer, rows=1, length=len(given), seed=0, device=CPU, head=head)


@pytest.mark.parametrize("route", ["nkb", "lora", "ft"])
def test_the_drift_is_nothing_before_training_and_what_the_trained_ffns_add_after(tokenizer, own, route):
    _, traffic = own
    model = tiny_llama(len(tokenizer))
    if route == "nkb":
        mount_nkb(model, NKBConfig(layers=LAYERS, slots=8, zero_values=True))
    elif route == "lora":
        mount_lora(model, LAYERS, rank=2)  # PEFT starts B at zero: the base's own function
    else:
        train_ffn_maps(model, LAYERS)
    ffns = [get_ffn(model, name) for name in LAYERS]
    assert drift(ffns, traffic.inputs, traffic.writes, traffic.scale).item() == pytest.approx(0, abs=1e-10)
    params = [p for p in model.parameters() if p.requires_grad]
    with torch.no_grad():
        params[-1].add_(0.1)  # the last trained weight moves: the top block's FFN writes something else
    moved = drift(ffns, traffic.inputs, traffic.writes, traffic.scale).item()
    top = ffns[-1](traffic.inputs[:, 1]) - traffic.writes[:, 1]
    assert moved == pytest.approx((top.pow(2).sum(-1).mean() / traffic.scale[1]).item(), rel=1e-4)


def test_the_slots_drift_runs_none_of_the_base_ffn_it_is_their_addition(tokenizer, own):
    _, traffic = own
    model = tiny_llama(len(tokenizer))
    mount_nkb(model, NKBConfig(layers=LAYERS, slots=8))
    ffns = [get_ffn(model, name) for name in LAYERS]
    calls = []
    for ffn in ffns:
        ffn.base_layer.register_forward_hook(lambda *_: calls.append(1))
    full = sum(((ffn(traffic.inputs[:, b]) - traffic.writes[:, b]).pow(2).sum(-1).mean() / traffic.scale[b]).item()
               for b, ffn in enumerate(ffns))
    calls.clear()
    assert drift(ffns, traffic.inputs, traffic.writes, traffic.scale).item() == pytest.approx(full, rel=1e-5)
    assert not calls


def test_each_step_has_its_own_rows_beside_its_batch_and_keeps_its_source_metric(own):
    _, traffic = own
    rows = Named(lambda step: {"input_ids": torch.full((4, 3), step), "labels": torch.zeros(4, 3)}, "ssm_loss")
    mixed = WithOwnText(rows, traffic, seed=0)
    first, again, other = mixed(5), mixed(5), mixed(6)
    assert first["own_text_inputs"].shape == (4, 2, 10, 32) and torch.equal(first["input_ids"], rows(5)["input_ids"])
    assert torch.equal(first["own_text_writes"], again["own_text_writes"])
    assert not torch.equal(first["own_text_writes"], other["own_text_writes"])
    assert metric_at(mixed, 5) == "ssm_loss"


def trained_slots(tokenizer, traffic, weight: float, kl: float = 0.0) -> HeldToOwnText:
    """Slots trained 40 steps on a few sentences, held to the base's own text at `weight` (and `kl`)."""
    model = tiny_llama(len(tokenizer))
    mount_nkb(model, NKBConfig(layers=LAYERS, slots=16, zero_values=True))
    mark_only_nkb_trainable(model)
    pairs = encode_pairs(tokenizer, [t.rsplit(" company", 1)[0] for t in TEXTS[:16]],
                         [t.rsplit(" company", 1)[1] for t in TEXTS[:16]], eos=False)
    batch = pad_causal(pairs, tokenizer.pad_token_id)
    trained = HeldToOwnText(model, model, traffic, weight, kl)
    torch.manual_seed(0)
    train(trained, WithOwnText(lambda step: batch, traffic, seed=0), TrainConfig(steps=40, batch_size=16, lr=3e-2), CPU)
    return trained


def slot_drift_after_training(tokenizer, traffic, weight: float) -> float:
    trained = trained_slots(tokenizer, traffic, weight)
    with torch.no_grad():
        return drift(trained.ffns, traffic.inputs, traffic.writes, traffic.scale).item()


def test_the_term_keeps_trained_slots_quieter_on_the_base_own_text(tokenizer, own):
    _, traffic = own
    free, held = (slot_drift_after_training(tokenizer, traffic, w) for w in (0.0, 10.0))
    assert free > 0 and held < free / 4


@pytest.fixture(scope="module")
def taught(tokenizer):
    model = tiny_llama(len(tokenizer))
    ids = sample_own_text(model, tokenizer, rows=6, length=10, seed=0, device=CPU, batch_size=4)
    return ffn_traffic(model, ids, LAYERS, CPU, batch_size=4, teacher=True)


def test_the_teacher_is_the_bases_top_next_tokens_and_the_base_is_nothing_from_it(tokenizer, taught):
    model = tiny_llama(len(tokenizer))
    assert taught.top_ids.shape == taught.top_logp.shape == (6, 10, TEACHER_TOP)
    with torch.no_grad():
        best = model(input_ids=taught.ids).logits.argmax(-1)
        assert torch.equal(taught.top_ids[..., 0], best)
        assert teacher_kl(model, taught.ids, taught.top_ids, taught.top_logp).abs() < 1e-5
        mount_nkb(model, NKBConfig(layers=LAYERS, slots=16))
        assert teacher_kl(model, taught.ids, taught.top_ids, taught.top_logp) > 1e-4
    rows = WithOwnText(lambda step: {"input_ids": torch.zeros(5, 3)}, taught, seed=0)(7)
    assert rows["own_text_ids"].shape == (5, 10) and rows["own_text_top_ids"].shape == (5, 10, TEACHER_TOP)
    more = WithOwnText(lambda step: {"input_ids": torch.zeros(5, 3)}, taught, seed=0, rows=9)(7)
    assert more["own_text_ids"].shape == (9, 10) and more["input_ids"].shape == (5, 3)  # the batch's own rows kept


def test_the_kl_term_reads_as_many_own_texts_as_asked(tokenizer, taught):
    model = tiny_llama(len(tokenizer))
    mount_nkb(model, NKBConfig(layers=LAYERS, slots=16))
    read = []
    for kl_rows in (2, 6):
        held = HeldToOwnText(lambda **batch: SimpleNamespace(loss=torch.zeros(())), model, taught, 0.0, 1.0, kl_rows)
        batch = WithOwnText(lambda step: {"input_ids": torch.zeros(3, 3)}, taught, seed=0, rows=kl_rows)(0)
        with torch.no_grad():
            read.append(held(**batch).loss.item())
            expected = teacher_kl(model, *(batch[k][:kl_rows] for k in ("own_text_ids", "own_text_top_ids",
                                                                       "own_text_top_logp")))
        assert read[-1] == pytest.approx(expected.item())
    assert read[0] != read[1]


def kl_after_training(tokenizer, traffic, kl: float) -> float:
    trained = trained_slots(tokenizer, traffic, 0.0, kl)
    with torch.no_grad():
        return teacher_kl(trained.model, traffic.ids, traffic.top_ids, traffic.top_logp).item()


def test_the_kl_term_keeps_what_the_trained_model_says_on_the_base_own_text_near_the_base(tokenizer, taught):
    free, held = (kl_after_training(tokenizer, taught, kl) for kl in (0.0, 100.0))
    assert free > 0 and held < free / 4
