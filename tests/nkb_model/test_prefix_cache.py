"""Cached injection (issue 38): the frozen blocks below the slots computed once per segment, the tail trained on
them. It must give the uncached path's loss and gradients on the same batch, on each family it serves."""

import pyarrow as pa
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM
from transformers import Qwen2Config, Qwen2ForCausalLM

from corpus.ssm import ssm_examples
from nkb_model.families import DECODER_ONLY
from nkb_model.causal import encode_pairs, pad_causal
from nkb_model.nkb import NKBConfig, mark_only_nkb_trainable, mount_nkb, nkb_parameters
from nkb_model.prefix_cache import (CachedBatches, CachedTail, SegmentCache, first_trainable_block,
                                   fixed_pairs_cached, supports_cache)
from nkb_model.train import TrainConfig, choose_device, train
from tests.nkb_model.test_causal import TEXTS, byte_level_bpe

SHAPE = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=128)
FAMILIES = {"llama": lambda v: LlamaForCausalLM(LlamaConfig(vocab_size=v, **SHAPE)),
            "qwen2": lambda v: Qwen2ForCausalLM(Qwen2Config(vocab_size=v, **SHAPE)),
            "mistral": lambda v: MistralForCausalLM(MistralConfig(vocab_size=v, **SHAPE))}
CPU = choose_device("cpu")


def injected(family: str, vocab: int, layers: list[str]):
    torch.manual_seed(0)
    model = FAMILIES[family](vocab)
    mount_nkb(model, NKBConfig(layers=layers, slots=16))
    torch.manual_seed(1)
    for _, p in nkb_parameters(model):  # non-zero values, so that the slots shape the loss
        torch.nn.init.normal_(p, std=0.05)
    mark_only_nkb_trainable(model)
    return model.eval()


def segment_batch(tokenizer, texts: list[str]):
    """Salient-span pairs of `texts` (a span per segment), padded as injection pads them, and each row's segment."""
    segments = pa.table({"segment_id": [f"s{i}" for i in range(len(texts))], "text": texts})
    starts = [t.index(" born in ") + len(" born in ") for t in texts]
    spans = pa.table({"segment_id": segments.column("segment_id"), "start_char": starts,
                      "end_char": [s + len("city 3") for s in starts]})
    examples = ssm_examples(segments, spans, decoder_only=True)
    pairs = encode_pairs(tokenizer, examples.column("input").to_pylist(), examples.column("target").to_pylist(),
                         eos=False)
    order = {sid: i for i, sid in enumerate(segments.column("segment_id").to_pylist())}
    return pad_causal(pairs, tokenizer.pad_token_id), [order[s] for s in examples.column("segment_id").to_pylist()]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("layers", [["decoder.-1"], ["decoder.-2", "decoder.-1"], ["decoder.0"]])
def test_the_cached_tail_gives_the_uncached_loss_and_gradients(family, layers):
    tokenizer = byte_level_bpe()
    texts = TEXTS[:12]
    batch, segments = segment_batch(tokenizer, texts)
    model = injected(family, len(tokenizer), layers)
    k = first_trainable_block(model)
    assert supports_cache(model) and k == (0 if layers == ["decoder.0"] else 4 - len(layers))
    uncached = model(**batch).loss
    uncached.backward()
    expected = [p.grad.clone() for _, p in nkb_parameters(model)]
    model.zero_grad(set_to_none=True)

    cache = SegmentCache(model, tokenizer, texts, k, CPU, batch_size=5)
    cached_batch = cache.batch(model, batch, segments)
    assert all(cache.rows(s, batch["input_ids"][i, :int(n)].tolist()) is not None  # every row read off the cache
               for i, (s, n) in enumerate(zip(segments, batch["attention_mask"].sum(1))))
    cached = CachedTail(model, k)(**cached_batch).loss
    cached.backward()
    torch.testing.assert_close(cached, uncached, rtol=1e-4, atol=1e-4)
    for got, want in zip((p.grad for _, p in nkb_parameters(model)), expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_a_row_that_is_no_prefix_of_its_segment_is_computed_afresh():
    tokenizer = byte_level_bpe()
    batch, segments = segment_batch(tokenizer, TEXTS[:4])
    model = injected("llama", len(tokenizer), ["decoder.-1"])
    cache = SegmentCache(model, tokenizer, ["something else entirely"] * 4, 3, CPU)  # no row matches
    uncached = model(**batch).loss
    torch.testing.assert_close(CachedTail(model, 3)(**cache.batch(model, batch, segments)).loss, uncached,
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("eos", [False, True])  # the answers alone, or ended as fine-tuning ends them (qa_eos)
def test_the_questions_steps_are_read_off_a_cache_of_each_question_and_answer_with_the_uncached_loss(eos):
    from nkb_model.fewshot import fewshot_prompt
    tokenizer = byte_level_bpe()
    model = injected("llama", len(tokenizer), ["decoder.-2", "decoder.-1"])
    k = first_trainable_block(model)
    questions = [fewshot_prompt([], f"where was person {i} born") for i in range(6)]
    answers = [f"city {i % 7}" for i in range(6)]
    pairs = DECODER_ONLY.pair_batches(lambda epoch: (questions, answers), tokenizer, 2, target_eos=eos)
    assert all((row[row != -100][-1] == tokenizer.eos_token_id) == eos for row in pairs(0)["labels"])
    cached = fixed_pairs_cached(pairs, model, tokenizer, k, CPU)
    for step in range(2 * pairs.per_epoch):  # two epochs, each in its own order
        batch = pairs(step)
        lengths = batch["attention_mask"].sum(1).tolist()
        assert all(cached.cache.rows(r, batch["input_ids"][i, :n].tolist()) is not None  # none computed afresh
                   for i, (r, n) in enumerate(zip(pairs.rows(step), lengths)))
        torch.testing.assert_close(CachedTail(model, k)(**cached(step)).loss, model(**batch).loss,
                                   rtol=1e-4, atol=1e-4)


def test_families_whose_first_block_does_not_read_the_embeddings_as_they_are_are_not_served():
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64))
    assert not supports_cache(model)


def cached_injection(and_rest: bool):
    """The injection loop's parts as the stage sets them up: pair batches of the salient-span examples (the span
    alone, or with the rest of its segment), redrawn each epoch, uncached and read off the segment cache; and the
    model each is trained on."""
    from nkb_model.batches import PairBatches
    tokenizer = byte_level_bpe()
    texts = TEXTS[:24]
    segments = pa.table({"segment_id": [f"s{i}" for i in range(len(texts))], "text": texts})
    spans = pa.table({"segment_id": [f"s{i}" for i in range(len(texts)) for _ in range(2)],
                      "start_char": [p for t in texts for p in (t.index("city"), t.index("company"))],
                      "end_char": [p for t in texts for p in (t.index("city") + 6, t.index("company") + 9)]})
    examples = lambda epoch: ssm_examples(segments, spans, seed=0, epoch=epoch, decoder_only=True,  # noqa: E731
                                          and_rest=and_rest)
    pairs = lambda epoch: (examples(epoch).column("input").to_pylist(),  # noqa: E731
                           examples(epoch).column("target").to_pylist())
    plain = injected("llama", len(tokenizer), ["decoder.-1"])
    uncached = PairBatches(pairs, tokenizer, 8, family=DECODER_ONLY, target_eos=False)
    model = injected("llama", len(tokenizer), ["decoder.-1"])
    cache = SegmentCache(model, tokenizer, texts, 3, CPU)
    index = {s: i for i, s in enumerate(segments.column("segment_id").to_pylist())}
    cached = CachedBatches(PairBatches(pairs, tokenizer, 8, family=DECODER_ONLY, target_eos=False),
                           lambda epoch: [index[s] for s in examples(epoch).column("segment_id").to_pylist()],
                           cache, model)
    return (plain, uncached), (CachedTail(model, 3), cached)


STEPS = TrainConfig(steps=6, batch_size=8, lr=3e-2, optimizer="adamw")


@pytest.mark.parametrize("and_rest", [False, True])
def test_training_on_the_cache_follows_the_uncached_losses_step_by_step(and_rest):
    (plain, uncached), (tail, cached) = cached_injection(and_rest)
    expected = train(plain, uncached, STEPS, CPU)
    assert_same_steps(train(tail, cached, STEPS, CPU), expected)


@pytest.mark.slow  # torch.compile compiles each new batch length
def test_compiled_steps_on_the_cache_are_the_eager_ones():
    """`compile: true` traces the cached tail, which swaps the model's block list and hooks the top FFN inside its
    forward pass: the compiled steps must still be the eager ones."""
    _, (tail, cached) = cached_injection(False)
    eager = train(tail, cached, STEPS, CPU)
    _, (tail, cached) = cached_injection(False)
    assert_same_steps(train(tail, cached, TrainConfig(**{**STEPS.__dict__, "compile": True}), CPU), eager)


def assert_same_steps(got: list, expected: list) -> None:
    """The same steps with the same losses, within float32's rounding; and losses that moved, so that it says so."""
    assert [s for s, _ in got] == [s for s, _ in expected] and len({round(l, 3) for _, l in expected}) > 1
    for (_, a), (_, b) in zip(got, expected):
        assert abs(a - b) < 1e-4, (got, expected)
