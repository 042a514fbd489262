"""Knowledge surgery on tiny random T5s (CPU): one edit, undo, relative strength, the sweep, answer and batch edits."""

import pytest
import torch

from nkb_model import surgery
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
    edit = surgery.edit_slot(model, "decoder.1", slot=3, target_token=7, original_token=9, lam=0.5)
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

    class Tok:  # the ids are the text: "3 4 5" -> [3, 4, 5]
        def __call__(self, texts, return_tensors="pt", **_):
            ids = torch.tensor([[int(x) for x in t.split()] for t in texts])
            return type("Enc", (dict,), {"to": lambda self, d: self})({"input_ids": ids,
                                                                       "attention_mask": torch.ones_like(ids)})
    tok = Tok()
    first = surgery.first_token(model, tok, ["3 4 5"])[0]
    target = (first + 5) % 64
    slot = surgery.top_slot(model, tok, "3 4 5", "decoder.1")
    surgery.edit_slot(model, "decoder.1", slot, target, first, lam=200.0)
    assert surgery.first_token(model, tok, ["3 4 5"]) == [target]


def test_the_sweep_edits_wrong_first_tokens_and_undoes_every_edit():
    model = tiny_t5("relu")
    mount_nkb(model, NKBConfig(layers=["decoder.-1"]))
    tok = IdTokenizer()
    texts = [f"{i} {i + 1} {i + 2}" for i in range(3, 23)]
    first = surgery.first_token(model, tok, texts)
    gold = [str((f + 5) % 64) for f in first]   # every first token is wrong
    gold[0] = str(first[0])                      # but the first one
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rows, wrong = surgery.sweep(model, tok, texts, gold, "decoder.1", [0.01, 200.0], questions=4, others=3, seed=1,
                                relative=False)
    assert wrong == 19 and len(rows) == 8 and 0 not in {r["question"] for r in rows}
    assert all(r["success"] == (r["new"] == r["target"]) and 0 <= r["change_rate"] <= 1 for r in rows)
    assert all(r["success"] for r in rows if r["lambda"] == 200.0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    again, _ = surgery.sweep(model, tok, texts, gold, "decoder.1", [0.01, 200.0], questions=4, others=3, seed=1,
                             relative=False)
    assert again == rows  # seeded: the same questions and others
    alone, wrong = surgery.sweep(model, tok, texts[1:2], gold[1:2], "decoder.1", [200.0], questions=4, others=3,
                                 relative=False)
    assert wrong == 1 and alone[0]["success"] and alone[0]["change_rate"] is None  # no other question to check


def trained_values(model, layer="decoder.1"):
    """Slots with values of a trained NKB's scale (a fresh NKB's values are zero: nothing to be relative to)."""
    torch.manual_seed(3)
    with torch.no_grad():
        mounted_layers(model)[layer].nkb_values.weight.normal_(0, 1.0)
    return model


def test_a_relative_strength_sets_the_edit_to_that_many_value_norms():
    model = tiny_t5("relu")
    mount_nkb(model, NKBConfig(layers=["decoder.-1"]))
    trained_values(model)
    values = mounted_layers(model)["decoder.1"].nkb_values.weight
    old = values[:, 3].clone()
    edit = surgery.strong_edit(model, "decoder.1", 3, target_token=7, original_token=9, strength=2.0)
    assert torch.linalg.vector_norm(values[:, 3] - old).item() == pytest.approx(2.0 * old.norm().item(), rel=1e-5)
    delta = model.get_output_embeddings().weight[7] - model.get_output_embeddings().weight[9]
    assert edit.lam == pytest.approx(2.0 * old.norm().item() / delta.norm().item(), rel=1e-5)
    edit.undo(model)
    assert torch.equal(values[:, 3], old)
    absolute = surgery.strong_edit(model, "decoder.1", 3, 7, 9, strength=0.5, relative=False)
    assert absolute.lam == 0.5


def test_a_strength_sweep_spans_no_effect_to_always_flipping_after_an_answer_prefix():
    model = tiny_t5("relu")
    mount_nkb(model, NKBConfig(layers=["decoder.-1"]))
    trained_values(model)
    tok, prefix = IdTokenizer(), [11]  # the answer follows a fixed first token, like `<extra_id_0>`
    texts = [f"{i} {i + 1} {i + 2}" for i in range(3, 23)]
    first = surgery.first_token(model, tok, texts, prefix)
    assert first != surgery.first_token(model, tok, texts)  # the prefix is seen
    gold = [str((f + 5) % 64) for f in first]
    rows, wrong = surgery.sweep(model, tok, texts, gold, "decoder.1", [1e-4, 1e3], questions=5, others=4,
                                prefix=prefix)
    assert wrong == 20 and {r["strength"] for r in rows} == {1e-4, 1e3}
    assert not any(r["success"] for r in rows if r["strength"] == 1e-4)
    assert all(r["change_rate"] == 0 for r in rows if r["strength"] == 1e-4)
    assert all(r["success"] for r in rows if r["strength"] == 1e3)


def test_an_answer_edit_edits_one_slot_per_wrong_token_and_none_for_right_ones():
    model = tiny_t5("relu")
    mount_nkb(model, NKBConfig(layers=["decoder.-1"]))
    tok, cpu = IdTokenizer(), choose_device("cpu")
    first = surgery.next_token(model, tok, "3 4 5", [])
    wanted = (first + 5) % 64
    done = surgery.edit_answer(model, tok, "3 4 5", str(wanted), "decoder.1", 300.0, cpu, relative=False)
    assert [(s["step"], s["original"], s["target"]) for s in done["steps"]] == [(0, str(first), str(wanted))]
    assert surgery.next_token(model, tok, "3 4 5", []) == wanted and done["new_answer"].split()[0] == str(wanted)
    assert done["old_answer"].split()[0] == str(first)
    again = surgery.edit_answer(model, tok, "3 4 5", str(wanted), "decoder.1", 300.0, cpu, relative=False)
    assert again["steps"] == []  # the model already gives it


def test_an_answer_edit_also_edits_the_step_after_it_toward_the_closing_token():
    model = tiny_t5("relu")
    mount_nkb(model, NKBConfig(layers=["decoder.-1"]))
    tok, cpu = IdTokenizer(), choose_device("cpu")
    wanted = (surgery.next_token(model, tok, "3 4 5", [11]) + 5) % 64
    closing = next(t for t in range(2, 64) if t not in (wanted, surgery.next_token(model, tok, "3 4 5", [11, wanted])))
    done = surgery.edit_answer(model, tok, "3 4 5", str(wanted), "decoder.1", 300.0, cpu, relative=False,
                               prefix=[11], end=closing)
    assert [s["step"] for s in done["steps"]] == [0, 1] and done["steps"][1]["target"] == str(closing)
    assert surgery.next_token(model, tok, "3 4 5", [11, wanted]) == closing  # (λ = 300 may undo step 0's edit)


def test_a_batch_of_edits_reports_success_generalisation_and_locality():
    model = tiny_t5("relu")
    mount_nkb(model, NKBConfig(layers=["decoder.-1"]))
    trained_values(model)
    tok, cpu = IdTokenizer(), choose_device("cpu")
    texts = [f"{i} {i + 1} {i + 2}" for i in range(3, 15)]
    wanted = [str((surgery.next_token(model, tok, t, []) + 5) % 64) for t in texts[:2]]
    asked = [surgery.Request(texts[0], wanted[0], [texts[2], texts[3]]), surgery.Request(texts[1], wanted[1], [])]
    unrelated = texts[4:]
    before = surgery.generate(model, tok, unrelated, cpu)
    done = surgery.edit_many(model, tok, asked, unrelated, "decoder.1", 1.0, cpu, end=1)
    assert [e["steps"] != [] for e in done["edits"]] == [True, True]
    now = surgery.generate(model, tok, [texts[0], texts[1], texts[2], texts[3]], cpu)
    assert [e["new_answer"] for e in done["edits"]] == now[:2]
    assert [e["success"] for e in done["edits"]] == [now[0] == wanted[0], now[1] == wanted[1]]
    assert done["success"] == sum(e["success"] for e in done["edits"]) / 2
    assert done["generalization"] == sum(answer == wanted[0] for answer in now[2:]) / 2
    assert done["locality"] == sum(a == b for a, b in zip(before, surgery.generate(model, tok, unrelated, cpu))) / 8
    # An edit too weak to change anything keeps every unrelated answer, and there is no paraphrase to score.
    weak = surgery.edit_many(model, tok, [surgery.Request(texts[5], "63", [])], texts[6:], "decoder.1", 1e-9, cpu)
    assert weak["locality"] == 1.0 and weak["generalization"] is None and weak["success"] == 0.0
