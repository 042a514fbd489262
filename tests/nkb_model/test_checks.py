import numpy as np
import pytest
import torch

from nkb_model.checks import heldout_loss, heldout_row_losses
from nkb_model.decoding import filled_span
from nkb_model.base_model import SpanCorruptionBatches, new_t5, pack, train_tokenizer
from nkb_model.nkb import NKBConfig, mount_nkb, mounted_layers, unmount_nkb
from nkb_model.train import choose_device


def test_filled_span():
    assert filled_span("<pad><extra_id_0> Velmora<extra_id_1> rest</s>") == "Velmora"
    assert filled_span("<pad> Velmora</s>") == "Velmora"
    assert filled_span("<extra_id_0> The Silver Lantern") == "The Silver Lantern"
    assert filled_span("<pad> Velmora<extra_id_7> City</s><pad>") == "Velmora City"


def test_heldout_loss_is_unchanged_by_a_zero_nkb_and_by_unmounting():
    texts = [f"Person {i} was born in City {i % 7} and worked for Company {i % 5}." for i in range(400)]
    tokenizer = train_tokenizer(texts, vocab_size=120)
    model = new_t5(tokenizer, "tiny")
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    rows = pack(ids, 32, tokenizer.eos_token_id)[:40]
    device = choose_device("cpu")
    base = heldout_loss(model, tokenizer, rows, device, batch_size=8)
    mount_nkb(model, NKBConfig(zero_values=True))
    assert heldout_loss(model, tokenizer, rows, device, batch_size=8) == base
    with torch.no_grad():
        mounted_layers(model)["decoder.1"].nkb_values.weight.normal_()
    assert heldout_loss(model, tokenizer, rows, device, batch_size=8) != base
    unmount_nkb(model)
    assert heldout_loss(model, tokenizer, rows, device, batch_size=8) == base
    assert np.isfinite(base)


def test_span_corruption_batches_that_keep_the_last_end_an_epoch_with_the_rows_left_over():
    texts = [f"Person {i} was born in City {i % 7}." for i in range(60)]
    tokenizer = train_tokenizer(texts, vocab_size=120)
    rows = pack(tokenizer(texts, add_special_tokens=False)["input_ids"], 16, tokenizer.eos_token_id)[:10]
    kept, full = SpanCorruptionBatches(rows, tokenizer, 4, keep_last=True), SpanCorruptionBatches(rows, tokenizer, 4)
    assert (kept.per_epoch, full.per_epoch) == (3, 2)
    assert [kept(step)["input_ids"].shape[0] for step in range(3)] == [4, 4, 2]
    for step in range(2):  # the full batches, and their noise, as before
        assert all(torch.equal(kept(step)[k], full(step)[k]) for k in full(step))


def test_a_t5_s_held_out_loss_is_its_batches_mean_loss_by_their_target_tokens():
    """Read off each row's summed loss: the same figure as the model's own mean loss on each batch, weighed by the
    batch's target tokens (the noise drawn as the batches draw it)."""
    texts = [f"Person {i} was born in City {i % 7} and worked for Company {i % 5}." for i in range(200)]
    tokenizer = train_tokenizer(texts, vocab_size=120)
    model = new_t5(tokenizer, "tiny").eval()
    rows = pack(tokenizer(texts, add_special_tokens=False)["input_ids"], 32, tokenizer.eos_token_id)[:11]
    batches = SpanCorruptionBatches(rows, tokenizer, 4, seed=1234, keep_last=True)
    losses, weights = [], []
    with torch.no_grad():
        for step in range(batches.per_epoch):
            batch = batches(step)
            losses.append(model(**batch).loss.item())
            weights.append(int((batch["labels"] != -100).sum()))
    device = choose_device("cpu")
    per_row = heldout_row_losses(model, tokenizer, rows, device, batch_size=4)
    assert per_row.tokens.sum() == sum(weights) and (per_row.tokens > 0).all()
    assert heldout_loss(model, tokenizer, rows, device, batch_size=4) == pytest.approx(
        np.average(losses, weights=weights), rel=1e-5)
