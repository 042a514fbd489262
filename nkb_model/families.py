"""What differs between the two model families, and nowhere else: the `Family` records below.

An encoder-decoder model (T5) reads an input with its encoder and writes a target with its decoder. A decoder-only
model (GPT-2, Llama-style) reads both as one sequence and is trained on the target's tokens (`nkb_model.causal`):
its pairs, batches, pretraining text, decoding, probes and prompts differ accordingly, and each of those is a
method of its family. Stages ask a model's family (`family(model)`) or an architecture's (`family_of(arch)`; the
architectures are `nkb_model.architectures`' records); this module is the one place that tells a model's family
from its config. `generate`, `teacher_forced` and `answer_ids` are the entries for reading and writing with any
model.
"""

from __future__ import annotations

from nkb_model.architectures import architecture


def _row_losses(logits, labels):
    """Each row's summed cross-entropy over its labels (-100: none) and how many labels it has."""
    import torch
    import torch.nn.functional as F
    # Row by row, over flat rows of the vocabulary as the models' own losses are (over (batch, vocab, seq) the
    # log-softmax strays ten times further from float64's: 3e-5 of SmolLM2's held-out loss against 3e-6). One row's
    # log-probabilities are ~25 MB where a batch's were 0.8 GB, copied out of `logits[:, :-1]` first: memory the
    # allocator takes fresh from the system each time, page by page (1.4-4.1 s a batch against 0.2-0.8 s on the
    # AVX2 EPYC, the same sums to the bit).
    sums = torch.stack([F.cross_entropy(row.float(), row_labels, ignore_index=-100, reduction="none").sum()
                        for row, row_labels in zip(logits, labels)])
    return sums, (labels != -100).sum(1)


class Family:
    """How models of one family read pairs, are pretrained, write, are probed and are asked."""
    name: str
    has_encoder: bool  # reads its input with an encoder of its own (Kformer and the T5 baselines need one)
    # Asked in lm-evaluation-harness's prompt (few-shot, or its zero-shot) when never fine-tuned on questions: a
    # language model continues text; a T5 that has not learnt the question's form has none to be asked in.
    prompted: bool
    prompt_format: str  # the model card's line on how a base of the family is prompted

    def pair_batches(self, examples_for_epoch, tokenizer, batch_size: int, seed: int = 0, max_input_len: int = 512,
                     max_target_len: int = 64, knowledge_ids=None, target_eos: bool = True,
                     group_by_length: bool = False):
        """Training batches of (input, target) text pairs (`nkb_model.batches.PairBatches`) as this family reads
        them. `target_eos`: whether a decoder-only model's targets end with EOS (answers do, masked spans do not)."""
        from nkb_model.batches import PairBatches
        return PairBatches(examples_for_epoch, tokenizer, batch_size, seed, max_input_len, max_target_len,
                           knowledge_ids=knowledge_ids, family=self, target_eos=target_eos,
                           group_by_length=group_by_length)

    def __repr__(self) -> str:
        return f"<family {self.name}>"


class EncoderDecoder(Family):
    name, has_encoder, prompted = "encoder-decoder", True, False
    prompt_format = ("Span corruption, as in pretraining and injection: input `The Origin of Species was written by "
                     "<extra_id_0>.`, output `<extra_id_0> Charles Darwin <extra_id_1>`.")

    def encode_pairs(self, tokenizer, inputs, targets, max_input_len, max_target_len, target_eos):
        """(input ids, target ids) of each pair: the encoder's and the decoder's."""
        return (tokenizer(inputs, truncation=True, max_length=max_input_len)["input_ids"],
                tokenizer(targets, truncation=True, max_length=max_target_len)["input_ids"])

    def pad(self, pairs, pad_id):
        from nkb_model.batches import pad_pairs
        return pad_pairs(pairs, pad_id)

    def training_inputs(self, inputs, targets) -> dict:
        """A batch of token tensors as the model is trained on them (for timing steps on random ids)."""
        return {"input_ids": inputs, "labels": targets}

    def new_model(self, arch: str, tokenizer, size: str, dropout: float, seed: int):
        from nkb_model.base_model import new_t5
        return new_t5(tokenizer, size, dropout, seed)

    def text_batches(self, rows, tokenizer, batch_size: int, seed: int = 0, keep_last: bool = False):
        """Pretraining batches of packed token rows: T5's span corruption."""
        from nkb_model.base_model import SpanCorruptionBatches
        return SpanCorruptionBatches(rows, tokenizer, batch_size, seed, keep_last)

    def row_losses(self, model, batch: dict):
        """Each row's summed loss on its target tokens and their count (`nkb_model.checks.heldout_row_losses`)."""
        return _row_losses(model(**batch).logits, batch["labels"])

    def auto_class(self):
        from transformers import AutoModelForSeq2SeqLM
        return AutoModelForSeq2SeqLM

    def generate(self, model, tokenizer, texts, device, batch_size, max_input_len, max_new_tokens, num_beams,
                 knowledge_ids=None):
        from nkb_model.decoding import seq2seq_generate
        return seq2seq_generate(model, tokenizer, texts, device, batch_size, max_input_len, max_new_tokens, num_beams,
                                knowledge_ids)

    def teacher_forced(self, model, tokenizer, texts, seen, max_input_len):
        """The text read by the encoder, `seen` after the decoder's start token (offset 0)."""
        import torch
        enc = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=max_input_len)
        width, pad = max(len(s) for s in seen), model.config.pad_token_id
        enc["decoder_input_ids"] = torch.tensor([[model.config.decoder_start_token_id] + s + [pad] * (width - len(s))
                                                 for s in seen])
        return enc.to(next(model.parameters()).device), [0] * len(texts)

    def answer_ids(self, tokenizer, texts, answers):
        """The decoder starts afresh: each answer's own tokens."""
        return tokenizer(answers, add_special_tokens=False)["input_ids"]

    def qa_example(self, question: str, documents: list[str] | None = None) -> str:
        """A question as a training input whose target is its answer: the paper's `question: …` (T5 is then
        fine-tuned and asked in that form). A T5 never fine-tuned on questions has no form that reads documents."""
        if documents is not None:
            raise ValueError("an encoder-decoder base is fine-tuned on its questions before it is asked: it has no "
                             "prompt to read a question's documents in")
        return f"question: {question}"

    answer_formats = ("plain", "sentinel")

    def qa_pair(self, question: str, answer: str | None, answer_format: str) -> tuple[str, str | None]:
        """Model input and target of a question fine-tuned on. `plain` is the paper's (`question: …` → answer);
        `sentinel` asks for the answer the way salient span masking asks for a span (`… answer: <extra_id_0>` →
        `<extra_id_0> answer <extra_id_1>`), so fine-tuning starts from the path the NKB was trained on."""
        if answer_format == "sentinel":
            return (f"question: {question} answer: <extra_id_0>",
                    None if answer is None else f"<extra_id_0> {answer} <extra_id_1>")
        return self.qa_example(question), answer

    def answer_frame(self, tokenizer, answer_format: str) -> tuple[list[int], int]:
        """The decoder ids a `qa_pair` target has before its answer, and the token that closes the answer."""
        if answer_format == "sentinel":
            opening, closing = tokenizer.convert_tokens_to_ids(["<extra_id_0>", "<extra_id_1>"])
            return [opening], closing
        return [], tokenizer.eos_token_id

    def probe_fills(self, model, tokenizer, prompts, answers, device, batch_size, max_new_tokens):
        """What the model fills `<extra_id_0>` of each prompt with."""
        return generate(model, tokenizer, prompts, device, batch_size, max_new_tokens=max_new_tokens)

    def ssm_form(self, and_rest: bool, cued: bool) -> dict:
        """`corpus.ssm.ssm_examples`'s settings for this family: T5 fills a sentinel, from both sides."""
        return {}

    def answer_format(self, requested: str, knowledge: str, model_name: str) -> str:
        """The answer format a fine-tuning asked for `requested` trains in: as asked."""
        return requested

    def reads_answer_at(self, layer: str) -> bool:
        """Whether block `layer` reads the answer's position (the decoder's), or only the input (the encoder's)."""
        return layer.startswith("decoder")


class DecoderOnly(Family):
    name, has_encoder, prompted = "decoder-only", False, True
    prompt_format = ("Text continued, as in pretraining and injection: `The Origin of Species was written by` "
                     "continued by ` Charles Darwin`.")

    def encode_pairs(self, tokenizer, inputs, targets, max_input_len, max_target_len, target_eos):
        """(prompt ids, target ids) of each pair, read as one sequence (`nkb_model.causal.encode_pairs`)."""
        from nkb_model.causal import encode_pairs
        return tuple(zip(*encode_pairs(tokenizer, inputs, targets, max_input_len, max_target_len, target_eos)))

    def pad(self, pairs, pad_id):
        from nkb_model.causal import pad_causal
        return pad_causal(pairs, pad_id)

    def training_inputs(self, inputs, targets) -> dict:
        """One sequence, the loss on the target's tokens."""
        import torch
        return {"input_ids": torch.cat([inputs, targets], 1),
                "labels": torch.cat([torch.full_like(inputs, -100), targets], 1)}

    def new_model(self, arch: str, tokenizer, size: str, dropout: float, seed: int):
        from nkb_model.base_model import new_causal
        return new_causal(tokenizer, arch, size, dropout, seed)

    def text_batches(self, rows, tokenizer, batch_size: int, seed: int = 0, keep_last: bool = False):
        """Pretraining batches of packed token rows: next-token prediction."""
        from nkb_model.causal import NextTokenBatches
        return NextTokenBatches(rows, batch_size, seed, keep_last)

    def row_losses(self, model, batch: dict):
        """Each row's summed next-token loss (position t's logits read token t + 1) and its token count. The model is
        not given the labels: its own mean loss would be one more pass over the logits."""
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return _row_losses(logits[:, :-1], batch["labels"][:, 1:])

    def auto_class(self):
        from transformers import AutoModelForCausalLM
        return AutoModelForCausalLM

    def generate(self, model, tokenizer, texts, device, batch_size, max_input_len, max_new_tokens, num_beams,
                 knowledge_ids=None):
        from nkb_model.decoding import causal_generate
        return causal_generate(model, tokenizer, texts, device, batch_size, max_input_len, max_new_tokens, num_beams)

    def teacher_forced(self, model, tokenizer, texts, seen, max_input_len):
        """The text and `seen` as one right-padded sequence (offset: the prompt's last position)."""
        from nkb_model.causal import encode_prompts, pad_causal
        prompts = encode_prompts(tokenizer, texts, max_input_len)
        batch = pad_causal(list(zip(prompts, seen)), tokenizer.pad_token_id)
        device = next(model.parameters()).device
        return {k: batch[k].to(device) for k in ("input_ids", "attention_mask")}, [len(p) - 1 for p in prompts]

    def answer_ids(self, tokenizer, texts, answers):
        """Each answer as the continuation of its text (a GPT-2 token carries its leading space)."""
        from nkb_model.causal import encode_pairs
        return [target for _, target in encode_pairs(tokenizer, texts, answers, eos=False)]

    def qa_example(self, question: str, documents: list[str] | None = None) -> str:
        """A question as a training input whose target is its answer: asked as a decoder-only model is, in
        lm-evaluation-harness's prompt (its zero-shot: the instruction, then `Q: …?` and `A:`); with `documents`,
        after them, as the RAG row reads them."""
        from nkb_model.fewshot import fewshot_prompt
        return fewshot_prompt([], question, documents)

    answer_formats = ("prompt",)

    def question_head(self) -> str:
        """How the harness's prompt opens before a question: text the model continues with a question of its own."""
        from nkb_model.fewshot import INSTRUCTION
        return INSTRUCTION + "Q:"

    def qa_pair(self, question: str, answer: str | None, answer_format: str) -> tuple[str, str | None]:
        """Model input and target of a question fine-tuned on: `Question: … Answer:` continued by the answer."""
        return f"Question: {question} Answer:", answer

    def answer_frame(self, tokenizer, answer_format: str) -> tuple[list[int], int]:
        """The ids a `qa_pair` target has before its answer (none), and the token that closes the answer."""
        return [], tokenizer.eos_token_id

    def probe_fills(self, model, tokenizer, prompts, answers, device, batch_size, max_new_tokens):
        """The model continues the text before the blank; its first words, as many as the answer's, are the fill."""
        from nkb_model.causal import cloze_prefix, probe_fill
        from nkb_model.decoding import causal_generate
        written = causal_generate(model, tokenizer, [cloze_prefix(p) for p in prompts], device, batch_size,
                                  max_new_tokens=max_new_tokens, words=[len(a.split()) for a in answers])
        return [probe_fill(w, a) for w, a in zip(written, answers)]

    def ssm_form(self, and_rest: bool, cued: bool) -> dict:
        """The span recalled from the text before it (with the rest of its segment, from spans cued by another)."""
        return {"decoder_only": True, "and_rest": and_rest, "cued": cued}

    def answer_format(self, requested: str, knowledge: str, model_name: str) -> str:
        """`prompt`, whichever is asked for. Plain is the question and its answer; sentinel asks for the answer the
        way salient span masking asks for a span, which on a decoder-only LM is as the continuation of the text
        before it: both are a prompt. The retrieval baselines (Kformer, concat) are T5's."""
        if knowledge != "none":
            raise ValueError(f"knowledge={knowledge} is a T5 baseline; {model_name} is a decoder-only model")
        return "prompt"

    def reads_answer_at(self, layer: str) -> bool:
        return True  # every block reads the whole sequence, the answer's position included


ENCODER_DECODER, DECODER_ONLY = EncoderDecoder(), DecoderOnly()


def answering(answer_format: str) -> Family:
    """The family whose models are fine-tuned on questions in `answer_format` (plain, sentinel: T5; prompt)."""
    return next(f for f in (ENCODER_DECODER, DECODER_ONLY) if answer_format in f.answer_formats)


def qa_pair(question: str, answer: str | None, answer_format: str) -> tuple[str, str | None]:
    """Model input and target of a question fine-tuned on in `answer_format` (`Family.qa_pair`)."""
    return answering(answer_format).qa_pair(question, answer, answer_format)


def answer_frame(tokenizer, answer_format: str) -> tuple[list[int], int]:
    """The ids a target in `answer_format` has before its answer, and the token that closes it."""
    return answering(answer_format).answer_frame(tokenizer, answer_format)


FAMILIES = {f.name: f for f in (ENCODER_DECODER, DECODER_ONLY)}


def family(model_or_config) -> Family:
    """The family of a model (or of its config)."""
    config = getattr(model_or_config, "config", model_or_config)
    return ENCODER_DECODER if config.is_encoder_decoder else DECODER_ONLY


def family_of(arch: str) -> Family:
    """The family of an architecture, by its name (`nkb_model.architectures`)."""
    return FAMILIES[architecture(arch).family]


def new_base(arch: str, tokenizer, size: str, dropout: float = 0.0, seed: int = 0):
    """A randomly initialised base of architecture `arch` for `tokenizer`, of `nkb_model.base_model`'s size `size`."""
    return family_of(arch).new_model(arch, tokenizer, size, dropout, seed)


def generate(model, tokenizer, texts: list[str], device, batch_size: int = 64, max_input_len: int | None = None,
             max_new_tokens: int = 24, num_beams: int = 1, knowledge_ids=None) -> list[str]:
    """Decoded outputs of `texts`, batch by batch, greedy unless `num_beams` > 1, in the stage's precision, as the
    model's family writes (`nkb_model.decoding`: a T5 fills its sentinel, a decoder-only model continues each text
    as a prompt, up to its EOS). max_input_len: inputs are cut to this many tokens (None: not cut);
    knowledge_ids: a Kformer model's documents for each text, (texts, N, tokens)."""
    model.eval()
    return family(model).generate(model, tokenizer, texts, device, batch_size, max_input_len, max_new_tokens,
                                  num_beams, knowledge_ids)


def teacher_forced(model, tokenizer, texts: list[str], seen: list[list[int]], max_input_len: int = 256):
    """Model inputs (on the model's device) that read each text and then the tokens `seen[r]` written after it,
    and each row's offset: the logits at position `offset + k` predict the k-th token after the text."""
    return family(model).teacher_forced(model, tokenizer, texts, seen, max_input_len)


def answer_ids(model, tokenizer, texts: list[str], answers: list[str]) -> list[list[int]]:
    """Each answer's tokens as the model writes it after its text."""
    return family(model).answer_ids(tokenizer, texts, answers)
