"""Sparse slot updates: each step changes only the slots most specific to its batch, on a tiny T5 and a tiny
Llama-style model with real modules on CPU."""

import pytest
import torch

from nkb_model.nkb import NKBConfig, mark_only_nkb_trainable, mount_nkb, mounted_layers
from nkb_model.sparse_slots import SlotUse, SparseSlotUpdates
from tests.nkb_model.test_adapters import MODELS, make
from tests.nkb_model.test_architectures import tokens


@pytest.mark.parametrize("family", ["t5", "llama-mlp-bias"])
def test_a_step_changes_only_the_chosen_slots_of_each_block(family):
    model = make(family)
    mount_nkb(model, NKBConfig(layers=MODELS[family][1]))
    mark_only_nkb_trainable(model)
    (name, layer), = mounted_layers(model).items()
    slots = layer.nkb_values.weight.shape[1]
    background = {name: torch.ones(slots)}
    sparse = SparseSlotUpdates(model, keep=3, background=background)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    extra = {"decoder_input_ids": tokens(2)} if model.config.is_encoder_decoder else {}
    model(input_ids=tokens(), **extra).logits.float().pow(2).mean().backward()
    optimizer.step()
    sparse.after_step()
    chosen = set(sparse.chosen[name].tolist())
    assert len(chosen) == 3
    changed_rows = {i for i in range(slots) if not torch.equal(layer.nkb_keys.weight[i], before[
        next(n for n in before if n.endswith("nkb_keys.weight"))][i])}
    changed_columns = {i for i in range(slots) if not torch.equal(layer.nkb_values.weight[:, i], before[
        next(n for n in before if n.endswith("nkb_values.weight"))][:, i])}
    assert changed_rows | changed_columns <= chosen and changed_rows  # keys and values of the chosen slots alone
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if ".nkb_" not in n)
    sparse.remove()


def test_the_chosen_slots_fire_most_on_the_batch_against_their_use_on_general_text():
    model = make("llama")
    mount_nkb(model, NKBConfig(layers=["decoder.-1"]))
    (name, layer), = mounted_layers(model).items()
    use = SlotUse(model)
    with torch.no_grad():
        model(input_ids=tokens())
    mean = use.mean()[name]
    use.remove()
    assert mean.shape == (layer.nkb_values.weight.shape[1],) and (mean > 0).all()
    # the same use everywhere: the slots that fire most are chosen; a slot as loud on general text is passed over
    loudest = int(mean.argmax())
    background = torch.ones_like(mean)
    sparse = SparseSlotUpdates(model, keep=1, background={name: background})
    with torch.no_grad():
        model(input_ids=tokens())
    assert sparse.specific()[name].tolist() == [loudest]
    background[loudest] = 1e6
    assert sparse.specific()[name].tolist() != [loudest]
    sparse.remove()


def test_background_use_is_read_through_the_cached_tail_training_calls():
    """On a decoder-only base injection trains `CachedTail`; general text goes through it whole, and the slots'
    use is read off the model's own blocks."""
    from nkb_model.prefix_cache import CachedTail
    from nkb_model.sparse_slots import background_use
    from nkb_model.train import choose_device
    model = make("llama")
    mount_nkb(model, NKBConfig(layers=["decoder.-1"]))
    mark_only_nkb_trainable(model)
    batch = {"input_ids": tokens(), "attention_mask": torch.ones_like(tokens()), "labels": tokens()}
    device = choose_device("cpu", "fp32")
    through_tail = background_use(model, [batch], device, CachedTail(model, 1))
    direct = background_use(model, [batch], device)
    assert through_tail.keys() == direct.keys() and all(torch.allclose(through_tail[k], direct[k]) for k in direct)
