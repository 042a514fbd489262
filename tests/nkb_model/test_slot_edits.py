"""Knowledge surgery on tiny random T5s (CPU): one edit, undo, relative strength, the sweep, answer and batch edits."""

import pytest
import torch

from nkb_model import slot_edits
from nkb_model.nkb import NKBConfig, mount_nkb, mounted_layers
from nkb_model.train import choose_device
from tests.nkb_model.test_nkb import VARIANTS, batch, tiny_t5


class IdTokenizer:
    """The ids are the text: "3 4 5" -> [3, 4, 5]; enough of a tokenizer for the surgery functions."""

    def __call__(self, texts, return_tensors=None, add_special_tokens=True, **_):
        single = isinstance(texts, str)
        ids = [[int(x) for x in t.split()] for t in ([texts] if single else texts)]
        if return_tensors is None:
            return {"input_ids": ids[0] if single else ids}
        width = max(len(i) for i in ids)
        tensor = torch.tensor([i + [0] * (width - len(i)) for i in ids])
        return type("Enc", (dict,), {"to": lambda self, d: self})({"input_ids": tensor,
                                                                   "attention_mask": (tensor != 0).long()})

    def convert_ids_to_tokens(self, ids):
        return [str(i) for i in ids] if isinstance(ids, list) else str(ids)

    def batch_decode(self, rows, skip_special_tokens=False):
        return [" ".join(str(int(i)) for i in row[1:] if i not in (0, 1)) for row in rows]


@pytest.mark.parametrize("ffn", VARIANTS)
def test_an_edit_changes_the_slot_and_undo_restores_every_bit(ffn):
    model = tiny_t5(ffn)
    mount_nkb(model, NKBConfig(layers=["decoder.-1"]))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    logits = model(**batch()).logits
    edit = slot_edits.edit_slot(model, "decoder.1", slot=3, target_token=7, original_token=9, lam=0.5)
    values = mounted_layers(model)["decoder.1"].nkb_values.weight
    delta = model.get_output_embeddings().weight[7] - model.get_output_embeddings().weight[9]
    torch.testing.assert_close(values[:, 3], before["decoder.block.1.layer.2.DenseReluDense.nkb_values.weight"][:, 3]
                               + 0.5 * delta)
    assert not torch.equal(model(**batch()).logits, logits)
    edit.undo(model)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(model(**batch()).logits, logits)


def test_a_strong_edit_of_the_top_slot_makes_the_target_the_first_token():
    model = tiny_t5("relu")
    mount_nkb(model, NKBConfig(layers=["decoder.-1"]))
    tok = IdTokenizer()
    first = slot_edits.first_token(model, tok, ["3 4 5"])[0]
    target = (first + 5) % 64
    firing = slot_edits.fired(model, tok, "3 4 5", slot_edits.Site("decoder.1"))
    slot_edits.edit_slot(model, "decoder.1", firing.slot, target, first, lam=200.0)
    assert slot_edits.first_token(model, tok, ["3 4 5"]) == [target]


def trained_values(model, layer="decoder.1"):
    """Slots with values of a trained NKB's scale (a fresh NKB's are small: every edit would look strong)."""
    torch.manual_seed(3)
    with torch.no_grad():
        mounted_layers(model)[layer].nkb_values.weight.normal_(0, 1.0)
    return model


def test_the_top_slot_fires_most_and_the_specific_one_most_above_its_usual_or_none_does():
    model = trained_values(mount(tiny_t5("relu")))
    tok, site = IdTokenizer(), slot_edits.Site("decoder.1")
    _, weights, out = slot_edits.read_step(model, tok, ["3 4 5"], (), "decoder.1")
    weights = weights[0]
    top = slot_edits.fired(model, tok, "3 4 5", site)
    assert top.slot == int(weights.argmax()) and top.weight == pytest.approx(float(weights.max()))
    assert top.residual == pytest.approx(float(out[0].norm()))
    # A profile in which the top slot usually fires even more makes the slot most above its usual the one.
    typical = weights.abs().clamp_min(1e-3)
    typical[top.slot] *= 10
    second = int(torch.where(torch.arange(len(weights)) == top.slot, -torch.inf, weights).argmax())
    typical[second] = weights[second] / 2
    assert slot_edits.fired(model, tok, "3 4 5", slot_edits.Site("decoder.1", typical=typical)).slot == second
    # No slot above its usual: the NKB does not hold this step, and nothing is chosen.
    assert slot_edits.fired(model, tok, "3 4 5", slot_edits.Site("decoder.1", typical=weights.abs() * 2 + 1)) is None


def test_a_slot_profile_is_the_rms_activation_over_every_step_of_the_reference_answers():
    model = trained_values(mount(tiny_t5("relu")))
    tok = IdTokenizer()
    texts, answers = ["3 4 5", "6 7 8", "9 10 11"], ["12 13", "14", "15 16 17"]
    profile = slot_edits.slot_profile(model, tok, texts, answers, "decoder.1", prefix=(11,), end=1, batch_size=2)
    steps = []
    for text, answer in zip(texts, answers):
        wanted = [int(x) for x in answer.split()] + [1]
        for t in range(len(wanted)):  # the step predicting each answer token and the closing one
            steps.append(slot_edits.read_step(model, tok, [text], [11] + wanted[:t], "decoder.1")[1][0])
    assert len(steps) == 9
    torch.testing.assert_close(profile, torch.stack(steps).pow(2).mean(0).sqrt(), rtol=1e-4, atol=1e-5)


def test_a_relative_strength_adds_that_many_residual_norms_to_the_step():
    model = trained_values(mount(tiny_t5("relu")))
    tok, site = IdTokenizer(), slot_edits.Site("decoder.1")
    firing = slot_edits.fired(model, tok, "3 4 5", site)
    _, _, before = slot_edits.read_step(model, tok, ["3 4 5"], (), "decoder.1")
    edit = slot_edits.strong_edit(model, firing, "decoder.1", target_token=7, original_token=9, strength=0.5)
    _, _, after = slot_edits.read_step(model, tok, ["3 4 5"], (), "decoder.1")
    delta = model.get_output_embeddings().weight[7] - model.get_output_embeddings().weight[9]
    added = (after - before)[0]
    assert added.norm().item() == pytest.approx(0.5 * firing.residual, rel=1e-3)  # the step's own block output
    assert torch.nn.functional.cosine_similarity(added, delta.detach(), dim=0).item() > 0.999
    edit.undo(model)
    absolute = slot_edits.strong_edit(model, firing, "decoder.1", 7, 9, strength=0.5, absolute=True)
    assert absolute.lam == 0.5
    with pytest.raises(ValueError, match="does not fire"):
        slot_edits.edit_lambda(model, slot_edits.Firing(2, 0.0, 1.0), 7, 9, 1.0)


def mount(model, layers=("decoder.-1",)):
    mount_nkb(model, NKBConfig(layers=list(layers)))
    return model


def test_the_sweep_edits_wrong_first_tokens_and_undoes_every_edit():
    model = mount(tiny_t5("relu"))
    tok, site = IdTokenizer(), slot_edits.Site("decoder.1")
    texts = [f"{i} {i + 1} {i + 2}" for i in range(3, 23)]
    first = slot_edits.first_token(model, tok, texts)
    gold = [str((f + 5) % 64) for f in first]   # every first token is wrong
    gold[0] = str(first[0])                      # but the first one
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rows, wrong = slot_edits.sweep(model, tok, texts, gold, site, [0.01, 200.0], questions=4, others=3, seed=1,
                                absolute=True)
    assert wrong == 19 and len(rows) == 8 and 0 not in {r["question"] for r in rows}
    assert all(r["success"] == (r["new"] == r["target"]) and 0 <= r["change_rate"] <= 1 for r in rows)
    assert all(r["success"] for r in rows if r["lambda"] == 200.0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    again, _ = slot_edits.sweep(model, tok, texts, gold, site, [0.01, 200.0], questions=4, others=3, seed=1,
                             absolute=True)
    assert again == rows  # seeded: the same questions and others
    alone, wrong = slot_edits.sweep(model, tok, texts[1:2], gold[1:2], site, [200.0], questions=4, others=3,
                                 absolute=True)
    assert wrong == 1 and alone[0]["success"] and alone[0]["change_rate"] is None  # no other question to check


def test_a_strength_sweep_spans_no_effect_to_always_flipping_after_an_answer_prefix():
    model = trained_values(mount(tiny_t5("relu")))
    tok = IdTokenizer()
    texts = [f"{i} {i + 1} {i + 2}" for i in range(3, 23)]
    site = slot_edits.Site("decoder.1", prefix=(11,))  # the answer follows a fixed first token, like `<extra_id_0>`
    first = slot_edits.first_token(model, tok, texts, site.prefix)
    assert first != slot_edits.first_token(model, tok, texts)  # the prefix is seen
    gold = [str((f + 5) % 64) for f in first]
    rows, wrong = slot_edits.sweep(model, tok, texts, gold, site, [1e-3, 20.0], questions=5, others=4)
    assert wrong == 20 and {r["strength"] for r in rows} == {1e-3, 20.0}
    assert not any(r["success"] for r in rows if r["strength"] == 1e-3)
    assert all(r["change_rate"] == 0 for r in rows if r["strength"] == 1e-3)
    assert all(r["success"] for r in rows if r["strength"] == 20.0)
    # With a profile in which no slot ever fires above its usual, no question is edited: every row a failure.
    held = slot_edits.Site("decoder.1", (11,), torch.full((48,), 1e9))
    rows, _ = slot_edits.sweep(model, tok, texts, gold, held, [20.0], questions=5, others=4)
    assert all(r["slot"] is None and r["lambda"] is None and not r["success"] and r["change_rate"] == 0 for r in rows)


def test_an_answer_edit_edits_one_slot_per_wrong_token_and_none_for_right_ones():
    model = mount(tiny_t5("relu"))
    tok, cpu, site = IdTokenizer(), choose_device("cpu"), slot_edits.Site("decoder.1")
    first = slot_edits.next_token(model, tok, "3 4 5", [])
    wanted = (first + 5) % 64
    done = slot_edits.edit_answer(model, tok, "3 4 5", str(wanted), site, 300.0, cpu, absolute=True)
    assert [(s["step"], s["original"], s["target"]) for s in done["steps"]] == [(0, str(first), str(wanted))]
    assert slot_edits.next_token(model, tok, "3 4 5", []) == wanted and done["new_answer"].split()[0] == str(wanted)
    assert done["old_answer"].split()[0] == str(first)
    again = slot_edits.edit_answer(model, tok, "3 4 5", str(wanted), site, 300.0, cpu, absolute=True)
    assert again["steps"] == []  # the model already gives it


def test_an_answer_edit_also_edits_the_step_after_it_toward_the_closing_token():
    model = mount(tiny_t5("relu"))
    tok, cpu, site = IdTokenizer(), choose_device("cpu"), slot_edits.Site("decoder.1", prefix=(11,))
    wanted = (slot_edits.next_token(model, tok, "3 4 5", [11]) + 5) % 64
    closing = next(t for t in range(2, 64) if t not in (wanted, slot_edits.next_token(model, tok, "3 4 5", [11, wanted])))
    done = slot_edits.edit_answer(model, tok, "3 4 5", str(wanted), site, 300.0, cpu, absolute=True, end=closing)
    assert [s["step"] for s in done["steps"]] == [0, 1] and done["steps"][1]["target"] == str(closing)
    assert slot_edits.next_token(model, tok, "3 4 5", [11, wanted]) == closing  # (λ = 300 may undo step 0's edit)


@pytest.mark.slow
def test_a_batch_of_edits_reports_success_generalisation_and_locality():
    model = trained_values(mount(tiny_t5("relu")))
    tok, cpu, site = IdTokenizer(), choose_device("cpu"), slot_edits.Site("decoder.1")
    texts = [f"{i} {i + 1} {i + 2}" for i in range(3, 15)]
    wanted = [str((slot_edits.next_token(model, tok, t, []) + 5) % 64) for t in texts[:2]]
    asked = [slot_edits.Request(texts[0], wanted[0], [texts[2], texts[3]]), slot_edits.Request(texts[1], wanted[1], [])]
    unrelated = texts[4:]
    before = slot_edits.generate(model, tok, unrelated, cpu)
    done = slot_edits.edit_many(model, tok, asked, unrelated, site, 1.0, cpu, end=1)
    assert [e["steps"] != [] for e in done["edits"]] == [True, True]
    now = slot_edits.generate(model, tok, [texts[0], texts[1], texts[2], texts[3]], cpu)
    assert [e["new_answer"] for e in done["edits"]] == now[:2]
    assert [e["success"] for e in done["edits"]] == [now[0] == wanted[0], now[1] == wanted[1]]
    assert done["success"] == sum(e["success"] for e in done["edits"]) / 2
    assert done["generalization"] == sum(answer == wanted[0] for answer in now[2:]) / 2
    assert done["locality"] == sum(a == b for a, b in zip(before, slot_edits.generate(model, tok, unrelated, cpu))) / 8
    # An edit too weak to change anything keeps every unrelated answer, and there is no paraphrase to score.
    weak = slot_edits.edit_many(model, tok, [slot_edits.Request(texts[5], "63", [])], texts[6:], site, 1e-9, cpu)
    assert weak["locality"] == 1.0 and weak["generalization"] is None and weak["success"] == 0.0


def test_the_default_layer_is_the_last_decoder_block_with_an_nkb():
    model = tiny_t5("relu")
    with pytest.raises(ValueError, match="no NKB mounted"):
        slot_edits.default_layer(model)
    mount_nkb(model, NKBConfig(layers=["encoder.-1", "decoder.0"]))
    assert slot_edits.default_layer(model) == "decoder.0"
