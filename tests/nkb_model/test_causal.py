"""Decoder-only models through the pipeline's code paths (tiny random Llama and GPT-2, CPU): pairs as one sequence
with the loss on the target, answers that stop, probes, the held-out loss, and reading and editing slots."""

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from corpus.ssm import ssm_examples
from nkb_model import slot_edits
from nkb_model.analysis import first_step_weights
from nkb_model.base_model import new_causal, train_tokenizer
from nkb_model.batches import PairBatches
from nkb_model.causal import (NextTokenBatches, cloze_prefix, encode_pairs, encode_prompts, line_end_ids, pad_causal,
                              pad_left, probe_fill, start_ids)
from nkb_model.checks import heldout_loss, heldout_row_losses, probe
from nkb_model.decoding import SharedPrefix, first_lines, greedy_rows, length_batches, plain_greedy
from nkb_model.families import DECODER_ONLY, generate, teacher_forced
from nkb_model.nkb import NKBConfig, mount_nkb, mounted_layers
from nkb_model.train import TrainConfig, choose_device, train

TEXTS = [f"Person {i} was born in city {i % 7} and worked for company {i % 5}." for i in range(200)]
QUESTIONS = ["Question: Where was Alice born? Answer:", "Question: Where was Bob born? Answer:",
             "Question: Where does Carol live? Answer:", "Question: Where does Dan live? Answer:"]
ANSWERS = ["city 3", "city 5", "company 1", "company 4"]
CPU = choose_device("cpu")


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS + QUESTIONS, vocab_size=80)


def byte_level_bpe():
    """A GPT-2-style tokenizer (byte-level BPE: a word's token carries its leading space as Ġ)."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")


def test_a_pair_is_one_sequence_with_the_loss_on_the_target_and_eos_only(tokenizer):
    (prompt, target), = encode_pairs(tokenizer, ["Person 3 was born in"], ["city 3"])
    assert prompt[0] == tokenizer.eos_token_id and target[-1] == tokenizer.eos_token_id  # no BOS: EOS starts
    assert tokenizer.decode(target[:-1]) == "city 3"
    (_, span), = encode_pairs(tokenizer, ["Person 3 was born in"], ["city 3"], eos=False)
    assert span == target[:-1]  # a masked span: the text goes on after it
    model = new_causal(tokenizer, "llama", "tiny").eval()
    batch = pad_causal([(prompt, target), (prompt[:3], span)], tokenizer.pad_token_id)
    assert batch["labels"][0].tolist() == [-100] * len(prompt) + target
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = model(**batch).loss
    # the model's loss is the cross-entropy of exactly the target tokens, each predicted from what precedes it
    rows, cols = (batch["labels"][:, 1:] != -100).nonzero(as_tuple=True)
    manual = torch.nn.functional.cross_entropy(logits[rows, cols], batch["labels"][rows, cols + 1])
    torch.testing.assert_close(loss, manual)


def test_a_target_is_tokenized_as_it_is_in_running_text():
    bpe = byte_level_bpe()
    (prompt, target), = encode_pairs(bpe, ["Person 3 was born in"], ["city 3"], eos=False)
    alone = bpe("city 3", add_special_tokens=False)["input_ids"]
    in_text = bpe("Person 3 was born in city 3", add_special_tokens=False)["input_ids"]
    assert target != alone and prompt + target == in_text  # "Ġcity", as the model reads it after "in"
    assert bpe.convert_ids_to_tokens(target)[0].startswith("Ġ")


def with_bos_added(bpe):
    """A Llama-style tokenizer: the same vocabulary, with a BOS of its own that it puts before every text."""
    inner = bpe.backend_tokenizer
    inner.add_special_tokens(["<s>"])
    bos = inner.token_to_id("<s>")
    inner.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    return PreTrainedTokenizerFast(tokenizer_object=inner, bos_token="<s>", eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")


def test_a_text_starts_as_its_own_tokenizer_starts_it(tokenizer):
    """What the harness and transformers' pipelines feed a model: the BOS a Llama tokenizer adds; nothing where a BOS
    exists but is not added (GPT-2, SmolLM2); EOS for the bases built here (no BOS: documents follow an EOS)."""
    gpt2_like, llama_like = byte_level_bpe(), with_bos_added(byte_level_bpe())
    assert start_ids(tokenizer) == [tokenizer.eos_token_id]
    assert start_ids(gpt2_like) == []
    assert start_ids(llama_like) == [llama_like.bos_token_id]
    for bpe in (gpt2_like, llama_like):
        text = "Q: where was Person 3 born?\nA:"
        assert encode_prompts(bpe, [text]) == [bpe(text)["input_ids"]]  # the tokenizer's own encoding
    assert encode_prompts(gpt2_like, [""]) == [[gpt2_like.eos_token_id]]  # something to continue
    assert encode_prompts(llama_like, [""]) == [[llama_like.bos_token_id]]
    # a span that opens its segment, with no start: its first token is the prompt, the pair a prefix of the text
    (prompt, target), = encode_pairs(gpt2_like, [""], ["Person 3 was born"], eos=False)
    assert prompt + target == gpt2_like("Person 3 was born")["input_ids"] and len(prompt) == 1
    (prompt, target), = encode_pairs(llama_like, [""], ["Person 3 was born"], eos=False)
    assert prompt == [llama_like.bos_token_id] and prompt + target == llama_like("Person 3 was born")["input_ids"]


def test_causal_ssm_examples_recall_the_span_from_the_text_before_it():
    import pyarrow as pa
    segments = pa.table({"segment_id": ["a"], "text": ["Ada Lovelace was born in London in 1815."]})
    spans = pa.table({"segment_id": ["a"], "start_char": [25], "end_char": [31]})
    causal = ssm_examples(segments, spans, decoder_only=True).to_pylist()[0]
    t5 = ssm_examples(segments, spans).to_pylist()[0]
    assert (causal["input"], causal["target"]) == ("Ada Lovelace was born in ", "London")
    assert t5["input"] == "Ada Lovelace was born in <extra_id_0> in 1815."


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_tiny_decoder_only_model_learns_answers_and_stops_after_them(tokenizer, arch):
    model = new_causal(tokenizer, arch, "tiny").train()
    batches = PairBatches(lambda epoch: (QUESTIONS, ANSWERS), tokenizer, 4, family=DECODER_ONLY)
    train(model, batches, TrainConfig(steps=60, batch_size=4, lr=3e-3, optimizer="adamw"), CPU)
    assert generate(model, tokenizer, QUESTIONS, CPU, batch_size=3) == ANSWERS  # left-padded batches of 3 and 1
    # the probe asks the text before the blank and reads as many words as the answer has
    fills, hits = probe(model, tokenizer, [q + " <extra_id_0>." for q in QUESTIONS], ANSWERS, CPU)
    assert fills == ANSWERS and all(hits)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_batches_of_like_length_answer_each_prompt_as_if_asked_alone_in_its_own_order(tokenizer, arch):
    model = new_causal(tokenizer, arch, "tiny").eval()
    prompts = [QUESTIONS[0] + " " + TEXTS[1], QUESTIONS[1], TEXTS[2] + " " + TEXTS[3], QUESTIONS[2] + " city",
               TEXTS[4]]  # lengths out of order: the batches are formed by length, the answers kept in this order
    alone = [generate(model, tokenizer, [p], CPU, batch_size=1, max_new_tokens=6)[0] for p in prompts]
    assert len(set(alone)) > 1  # else a wrong order could not show
    assert generate(model, tokenizer, prompts, CPU, batch_size=2, max_new_tokens=6) == alone


def test_a_cpu_s_batches_bounded_in_tokens_answer_as_if_each_prompt_were_asked_alone(tokenizer, monkeypatch):
    import nkb_model.train
    model = new_causal(tokenizer, "llama", "tiny").eval()
    prompts = [QUESTIONS[0] + " " + TEXTS[1], QUESTIONS[1], TEXTS[2] + " " + TEXTS[3], QUESTIONS[2], TEXTS[4]]
    alone = [generate(model, tokenizer, [p], CPU, batch_size=1, max_new_tokens=6)[0] for p in prompts]
    monkeypatch.setattr(nkb_model.train, "CPU_BATCH_TOKENS", 80)  # prompts of 30 to 75 tokens: two rows, then one
    assert CPU.batch_tokens == 80
    assert generate(model, tokenizer, prompts, CPU, batch_size=5, max_new_tokens=6) == alone


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_rows_that_leave_the_batch_early_write_what_generate_writes(tokenizer, arch):
    model = new_causal(tokenizer, arch, "tiny").eval()
    prompts = [QUESTIONS[0] + " " + TEXTS[1], QUESTIONS[1], TEXTS[2], QUESTIONS[2] + " city", TEXTS[4]]
    enc = pad_left(encode_prompts(tokenizer, prompts), tokenizer.pad_token_id)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    full = out[:, enc["input_ids"].shape[1]:].tolist()
    stops = {full[0][1], full[3][4]}  # rows stop at different steps, at the latest when the last one does

    def until_stop(tokens):
        ends = [i for i, t in enumerate(tokens) if t in stops]
        return tokens[:ends[0] + 1] if ends else tokens
    expected = [until_stop(row) for row in full]
    assert len({len(row) for row in expected}) > 1  # else no row left early
    with torch.no_grad():
        assert greedy_rows(model, enc, stops, 8) == expected
        # a row no longer wanted (`done`) leaves too: row r after r + 1 tokens
        assert greedy_rows(model, enc, set(), 8, lambda row, tokens: len(tokens) > row) == [
            row[:r + 1] for r, row in enumerate(full)]
    assert plain_greedy(model)
    model.generation_config.repetition_penalty = 1.3  # greedy would pick other tokens: `generate` decodes
    assert not plain_greedy(model)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_probes_stop_each_row_once_its_fill_is_final_and_fill_as_before(tokenizer, arch):
    model = new_causal(tokenizer, arch, "tiny").eval()
    prefixes, answers = [cloze_prefix(q + " <extra_id_0>.") for q in QUESTIONS], ["a b c", "a", "a b", "a b c d"]
    whole = generate(model, tokenizer, prefixes, CPU, batch_size=4, max_new_tokens=16)
    assert [probe_fill(w, a) for w, a in zip(whole, answers)] == probe(
        model, tokenizer, [q + " <extra_id_0>." for q in QUESTIONS], answers, CPU)[0]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_shared_prefix_read_once_continues_each_text_as_if_it_were_asked_whole_and_alone(tokenizer, arch):
    model = new_causal(tokenizer, arch, "tiny").eval()
    prefix, texts = TEXTS[0] + "\n" + TEXTS[1] + "\n", [TEXTS[2], QUESTIONS[0], TEXTS[3] + " " + TEXTS[4]]
    shared = SharedPrefix(model, tokenizer, prefix, CPU)
    stops = list(line_end_ids(tokenizer))
    alone = []
    for text in texts:
        ids = torch.tensor([shared.head + tokenizer(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            out = model.generate(input_ids=ids, max_new_tokens=7, do_sample=False, eos_token_id=stops,
                                 pad_token_id=tokenizer.pad_token_id)
        alone.append(first_lines(tokenizer, out[:, ids.shape[1]:])[0])
    assert len(set(alone)) > 1
    assert shared.generate(texts, 7) == alone


def test_cloze_prompts_become_prefixes_and_fills_take_the_answers_length():
    assert cloze_prefix("Ada Lovelace was born in <extra_id_0> in 1815.") == "Ada Lovelace was born in"
    assert probe_fill("New York City in 1815", "New York") == "New York"
    assert probe_fill("London", "New York") == "London"


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_teacher_forced_positions_read_each_row_as_if_it_ran_alone(tokenizer, arch):
    model = new_causal(tokenizer, arch, "tiny").eval()
    seen = [[5, 6], [], [7]]
    texts = QUESTIONS[:3]
    inputs, offsets = teacher_forced(model, tokenizer, texts, seen)
    with torch.no_grad():
        batched = model(**inputs).logits
        for row, (text, ids) in enumerate(zip(texts, seen)):
            one, (offset,) = teacher_forced(model, tokenizer, [text], [ids])
            alone = model(**one).logits[0]
            for k in range(len(ids) + 1):
                torch.testing.assert_close(batched[row, offsets[row] + k], alone[offset + k], atol=1e-5, rtol=1e-5)


def test_the_held_out_loss_of_a_decoder_only_model_is_its_next_token_loss(tokenizer):
    model = new_causal(tokenizer, "llama", "tiny").eval()
    rows = np.random.default_rng(0).integers(3, len(tokenizer), size=(4, 16))
    with torch.no_grad():
        expected = model(input_ids=torch.as_tensor(rows), labels=torch.as_tensor(rows)).loss.item()
    assert heldout_loss(model, tokenizer, rows, CPU, batch_size=4) == pytest.approx(expected, rel=1e-5)


def test_the_held_out_loss_reads_every_row_also_those_a_full_batch_leaves_out(tokenizer):
    """7 rows in batches of 4: one full batch and the 3 left over, each row's loss counted once, and each given back
    as that row's alone: a routed loss reads subsets of them (`stages.report_routing.routed_loss`)."""
    model = new_causal(tokenizer, "llama", "tiny").eval()
    rows = np.random.default_rng(1).integers(3, len(tokenizer), size=(7, 16))
    with torch.no_grad():
        each = [model(input_ids=torch.as_tensor(r[None]), labels=torch.as_tensor(r[None])).loss.item() for r in rows]
    assert heldout_loss(model, tokenizer, rows, CPU, batch_size=4) == pytest.approx(np.mean(each), rel=1e-5)
    per_row = heldout_row_losses(model, tokenizer, rows, CPU, batch_size=4)
    assert per_row.tokens.tolist() == [15] * 7  # each row's next tokens
    np.testing.assert_allclose(per_row.sums / per_row.tokens, each, rtol=1e-5)  # in its own row, not shuffled
    some = np.array([True, False, False, True, True, False, False])
    assert per_row.mean(some) == pytest.approx(heldout_loss(model, tokenizer, rows[some], CPU, batch_size=2),
                                               rel=1e-5)


def test_batches_that_keep_the_last_visit_every_row_once_an_epoch():
    rows = np.arange(7 * 3).reshape(7, 3)
    kept = NextTokenBatches(rows, 4, seed=3, keep_last=True)
    assert kept.per_epoch == 2 and NextTokenBatches(rows, 4, seed=3).per_epoch == 1
    seen = np.concatenate([kept(step)["input_ids"][:, 0].numpy() for step in range(kept.per_epoch)])
    assert sorted(seen) == list(rows[:, 0])
    assert torch.equal(kept(0)["input_ids"], NextTokenBatches(rows, 4, seed=3)(0)["input_ids"])  # full ones as before


def test_every_layer_s_slots_are_read_in_one_pass_as_if_read_alone(tokenizer):
    model = new_causal(tokenizer, "llama", "tiny").eval()
    mount_nkb(model, NKBConfig(layers=["decoder.1", "decoder.-1"]))
    both = first_step_weights(model, tokenizer, QUESTIONS, ["decoder.1", "decoder.-1"], batch_size=3)
    for layer, weights in both.items():
        torch.testing.assert_close(weights, first_step_weights(model, tokenizer, QUESTIONS, [layer])[layer])
    assert both["decoder.1"].shape[0] == len(QUESTIONS) and not torch.equal(both["decoder.1"], both["decoder.-1"])


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_slots_of_a_decoder_only_model_are_read_and_edited_at_the_answers_first_step(tokenizer, arch):
    model = new_causal(tokenizer, arch, "tiny").eval()
    mount_nkb(model, NKBConfig(layers=["decoder.-1"]))
    layer = slot_edits.default_layer(model)
    assert layer == ("layers.3" if arch == "llama" else "h.3")
    weights = first_step_weights(model, tokenizer, QUESTIONS, [layer])[layer]
    _, step_weights, _ = slot_edits.read_step(model, tokenizer, QUESTIONS, (), layer)
    torch.testing.assert_close(weights, step_weights)  # both at the step that writes the first answer token
    profile = slot_edits.slot_profile(model, tokenizer, QUESTIONS, ANSWERS, layer)
    assert profile.shape == (mounted_layers(model)[layer].nkb_values.in_features,) and (profile > 0).all()
    first = slot_edits.first_token(model, tokenizer, QUESTIONS[:1])[0]
    target = (first + 5) % len(tokenizer)
    firing = slot_edits.fired(model, tokenizer, QUESTIONS[0], slot_edits.Site(layer))
    slot_edits.strong_edit(model, firing, layer, target, first, strength=4.0)
    assert slot_edits.first_token(model, tokenizer, QUESTIONS[:1]) == [target]


def test_length_batches_keep_the_order_and_bound_rows_and_tokens():
    lengths = [5, 1, 3, 3, 9, 2]
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])  # 1, 5, 2, 3, 0, 4
    assert list(length_batches(order, lengths, 4)) == [[1, 5, 2, 3], [0, 4]]
    # 8 tokens: rows x their batch's longest row; the 9-token row exceeds it and goes alone
    assert list(length_batches(order, lengths, 4, max_tokens=8)) == [[1, 5], [2, 3], [0], [4]]
    assert [r for batch in length_batches(order, lengths, 2, max_tokens=100) for r in batch] == order
