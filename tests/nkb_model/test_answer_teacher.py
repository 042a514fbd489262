"""Context distillation from retrieval (`qa_teacher`): the teacher is the base's next tokens at each answer token,
read after the question's passage; a QA step's loss is the gold answers' at share 0 and nothing where the model
is the teacher already; the cached tail gives the whole model's loss and gradients; and training toward a teacher
that read the answer in its passage teaches the answer without the passage."""

import pytest
import torch

from nkb_model.answer_teacher import TAUGHT_IDS, TAUGHT_LOGP, TaughtAnswers, WithTaughtAnswers, teach_answers
from nkb_model.families import DECODER_ONLY
from nkb_model.nkb import NKBConfig, mark_only_nkb_trainable, mount_nkb, nkb_parameters
from nkb_model.own_text import TEACHER_TOP
from nkb_model.prefix_cache import CachedTail, first_trainable_block, fixed_pairs_cached
from nkb_model.train import TrainConfig, choose_device, train
from tests.nkb_model.test_causal import byte_level_bpe
from tests.nkb_model.test_own_text import tiny_llama

CPU = choose_device("cpu")
QUESTIONS = [f"where was person {i} born" for i in range(8)]
ANSWERS = [f"city {i % 5}" for i in range(8)]
PASSAGES = [[f"Person {i} was born in city {i % 5}."] for i in range(8)]


@pytest.fixture(scope="module")
def tokenizer():
    return byte_level_bpe()


def qa_pairs(tokenizer, batch_size: int = 4):
    return DECODER_ONLY.pair_batches(lambda epoch: ([DECODER_ONLY.qa_example(q) for q in QUESTIONS], ANSWERS),
                                     tokenizer, batch_size, target_eos=False)


def taught_by(model, tokenizer, passages):
    pairs = qa_pairs(tokenizer)
    prompts = [DECODER_ONLY.qa_example(q, p) for q, p in zip(QUESTIONS, passages)]
    return pairs, teach_answers(model, tokenizer, prompts, pairs.encoded()[1], CPU, batch_size=3)


def test_the_teacher_gives_its_top_tokens_at_each_answer_token(tokenizer):
    model = tiny_llama(len(tokenizer))
    pairs, taught = taught_by(model, tokenizer, PASSAGES)
    targets = pairs.encoded()[1]
    assert [ids.shape for ids, _ in taught] == [(len(t), TEACHER_TOP) for t in targets]
    assert all(torch.all(logp[:, :-1] >= logp[:, 1:]) and torch.all(logp <= 0) for _, logp in taught)
    batch = WithTaughtAnswers(pairs, taught)(1)
    answers = (batch["labels"][:, 1:] != -100).sum(1)
    assert batch[TAUGHT_IDS].shape == batch[TAUGHT_LOGP].shape == (4, answers.max(), TEACHER_TOP)
    for row, r in enumerate(pairs.rows(1)):  # each batch row its own example's, padded after its answer's tokens
        assert torch.equal(batch[TAUGHT_IDS][row, :answers[row]], taught[r][0])


def test_a_teacher_that_read_no_passage_is_the_model_itself_and_share_zero_is_the_gold_answers(tokenizer):
    model = tiny_llama(len(tokenizer))
    pairs, alone = taught_by(model, tokenizer, [None] * len(QUESTIONS))
    _, read = taught_by(model, tokenizer, PASSAGES)
    with torch.no_grad():
        for step in range(2):
            plain = pairs(step)
            # a tiny random model reads its context but little: the passage moves it by ~1e-5
            assert TaughtAnswers(model, 1.0)(**WithTaughtAnswers(pairs, alone)(step)).loss.abs() < 1e-7
            assert TaughtAnswers(model, 1.0)(**WithTaughtAnswers(pairs, read)(step)).loss > 1e-6
            torch.testing.assert_close(TaughtAnswers(model, 0.0)(**WithTaughtAnswers(pairs, read)(step)).loss,
                                       model(**plain).loss)
            assert TaughtAnswers(model, 0.5)(**plain).loss == model(**plain).loss  # a batch the teacher never saw


def slots_on(tokenizer):
    model = tiny_llama(len(tokenizer))
    mount_nkb(model, NKBConfig(layers=["decoder.-2", "decoder.-1"], slots=16))
    torch.manual_seed(1)
    for _, p in nkb_parameters(model):
        torch.nn.init.normal_(p, std=0.05)
    mark_only_nkb_trainable(model)
    return model


def test_the_cached_tail_gives_the_whole_models_loss_and_gradients(tokenizer):
    base = tiny_llama(len(tokenizer))
    pairs, taught = taught_by(base, tokenizer, PASSAGES)
    model = slots_on(tokenizer)
    whole = TaughtAnswers(model, 0.7)(**WithTaughtAnswers(pairs, taught)(0)).loss
    whole.backward()
    expected = [p.grad.clone() for _, p in nkb_parameters(model)]
    model.zero_grad(set_to_none=True)
    k = first_trainable_block(model)
    cached = fixed_pairs_cached(WithTaughtAnswers(pairs, taught), model, tokenizer, k, CPU)
    tail = TaughtAnswers(CachedTail(model, k), 0.7)(**cached(0)).loss
    tail.backward()
    torch.testing.assert_close(tail, whole, rtol=1e-4, atol=1e-4)
    for got, want in zip((p.grad for _, p in nkb_parameters(model)), expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # 60 training steps
def test_slots_trained_toward_the_teacher_alone_move_the_model_toward_what_it_says_with_the_passage(tokenizer):
    base = tiny_llama(len(tokenizer))
    pairs, taught = taught_by(base, tokenizer, PASSAGES)
    model = slots_on(tokenizer)
    batches = WithTaughtAnswers(pairs, taught)
    scored = TaughtAnswers(model, 1.0)

    def kl() -> float:
        with torch.no_grad():
            return sum(scored(**batches(step)).loss.item() for step in range(pairs.per_epoch))
    before = kl()
    torch.manual_seed(0)
    train(scored, batches, TrainConfig(steps=60, batch_size=4, lr=3e-2), CPU)
    assert kl() < before / 4
