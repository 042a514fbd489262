"""How a model's saved info says it reads questions: pure logic of `stages.inputs`."""

import pytest

from stages.inputs import asked_in_prompt, retrieval_mode


@pytest.mark.parametrize("info, mode", [
    ({"knowledge": "kformer", "knowledge_docs": 3}, "kformer"),  # fine-tuned with its retrieved documents
    ({"knowledge": "concat"}, "concat"),
    ({"knowledge": "none"}, "none"),
    ({"kind": "nkb", "knowledge_digest": "5fed0f7efd0e6f95fc84"}, "none"),  # injected, asked as it is
    ({"kind": "nkb", "knowledge": "5fed0f7efd0e6f95fc84"}, "none"),  # injected before the digest had its own key
    ({}, "none"),
])
def test_only_fine_tuning_s_ways_of_reading_documents_are_retrieval_modes(info, mode):
    assert retrieval_mode(info) == mode


@pytest.mark.parametrize("info, shots, prompted", [
    ({"arch": "llama", "kind": "nkb"}, 0, True),  # never fine-tuned: the harness's zero-shot prompt
    ({"arch": "llama", "kind": "base"}, 5, True),
    ({"arch": "llama", "kind": "finetuned", "answer_format": "plain"}, 0, False),  # as it was fine-tuned
    ({"arch": "llama", "kind": "finetuned", "answer_format": "plain"}, 2, True),
    ({"arch": "t5", "kind": "nkb"}, 0, False),  # an encoder-decoder model is fine-tuned, then asked
    ({"kind": "base"}, 0, False),  # nothing says it is decoder-only
])
def test_a_decoder_only_model_never_fine_tuned_is_asked_in_the_harness_prompt(info, shots, prompted):
    assert asked_in_prompt(info, shots) == prompted


def test_more_shots_than_a_train_split_holds_are_refused_before_a_model_stage(tmp_path):
    """Issue 53: shots=1000 on a tiny set was refused only at evaluate, after every model was trained."""
    from stages.configs import EvaluateConfig, SurgeryConfig
    from stages.inputs import require_shots
    from warehouse import Warehouse, run_stage
    wh = Warehouse(tmp_path / "wh")
    for split, n in (("train", 3), ("validation", 2)):
        run_stage(wh, "questions", {"split": split}, split, lambda run, split=split, n=n: run.write(
            "questions", f"nq.{split}", {"question_id": [f"{split}{i}" for i in range(n)], "dataset": ["nq"] * n,
                                         "split": [split] * n, "question": ["q?"] * n, "answers": [["a"]] * n}))
    require_shots(wh, [("evaluate", EvaluateConfig(model="m", shots=3)), ("surgery", SurgeryConfig(shots=0))])
    with pytest.raises(ValueError, match=r"surgery: shots=5 draws 5 solved examples for each question from dataset "
                                         r"nq's train split, which holds 3 questions: lower shots"):
        require_shots(wh, [("evaluate", EvaluateConfig(model="m", shots=2)), ("surgery", SurgeryConfig(shots=5))])


def test_every_stage_that_asks_questions_draws_its_examples_as_its_config_says(tmp_path, monkeypatch):
    """Issue 54: `evaluate --set shots_drawn=once` changed the run's fingerprint and was then never passed on: every
    question still got its own draw. Evaluate, analyze and surgery now all ask through one `Asking`."""
    from types import SimpleNamespace

    from stages.configs import AnalyzeConfig, EvaluateConfig, SurgeryConfig
    from stages.inputs import model_inputs
    from warehouse import Warehouse, run_stage
    wh = Warehouse(tmp_path / "wh")
    for split, n in (("train", 40), ("validation", 6)):
        run_stage(wh, "questions", {"split": split}, split, lambda run, split=split, n=n: run.write(
            "questions", f"nq.{split}", {"question_id": [f"{split}{i}" for i in range(n)], "dataset": ["nq"] * n,
                                         "split": [split] * n, "question": [f"{split} question {i}?" for i in range(n)],
                                         "answers": [[f"a{i}"] for i in range(n)]}))
    questions = wh.read("questions", partitions=["nq.validation"])
    llama = SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=False))
    info = {"arch": "llama", "kind": "nkb"}
    for config in (EvaluateConfig(model="m", shots=3, shots_drawn="once"), AnalyzeConfig(shots=3, shots_drawn="once"),
                   SurgeryConfig(shots=3, shots_drawn="once")):
        texts, _ = model_inputs(wh, questions, llama, None, info, config.asking)
        examples = {t.rsplit("Q:", 1)[0] for t in texts}
        assert len(examples) == 1, type(config).__name__  # one draw, shared by every question
    texts, _ = model_inputs(wh, questions, llama, None, info, EvaluateConfig(model="m", shots=3).asking)
    assert len({t.rsplit("Q:", 1)[0] for t in texts}) == len(texts)  # per question: each its own draw
    # evaluate's own path hands its config's way of asking on (the model's decoding stands aside here)
    import nkb_model.families
    from stages.evaluation import model_outputs
    asked = []
    monkeypatch.setattr(nkb_model.families, "generate", lambda model, tok, texts, *rest: asked.extend(texts) or
                        [""] * len(texts))
    model_outputs(wh, questions, llama, None, info, EvaluateConfig(model="m", shots=3, shots_drawn="once"), None, None)
    assert len(asked) == 6 and len({t.rsplit("Q:", 1)[0] for t in asked}) == 1
    t5 = SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=True))
    with pytest.raises(ValueError, match="shots is for decoder-only models"):
        model_inputs(wh, questions, t5, None, {"arch": "t5", "kind": "nkb"}, EvaluateConfig(model="m", shots=3).asking)
