"""Generating answers: the one decoding loop behind evaluation, the knowledge probe, the report and edits; and the
teacher-forced inputs with which analysis and surgery read a model at a chosen step of an answer."""

from __future__ import annotations

import contextlib
import re

import torch

from nkb_model.families import family
from nkb_model.train import Device


def filled_span(decoded: str) -> str:
    """The text a model wrote for `<extra_id_0>` (after that sentinel, up to the next one); a model asked
    without a sentinel wrote plain text, which is returned as it is, without special tokens."""
    text = decoded.replace("<pad>", "").split("</s>", 1)[0]
    if "<extra_id_0>" in text:
        text = text.split("<extra_id_0>", 1)[1]
    return " ".join(re.sub(r"<extra_id_\d+>", " ", text.split("<extra_id_1>", 1)[0]).split())


@torch.no_grad()
def generate(model, tokenizer, texts: list[str], device: Device, batch_size: int = 64,
             max_input_len: int | None = None, max_new_tokens: int = 24, num_beams: int = 1,
             knowledge_ids: torch.Tensor | None = None) -> list[str]:
    """Decoded outputs of `texts`, batch by batch, greedy unless `num_beams` > 1, in the stage's precision. A
    decoder-only model continues each text as a prompt, up to its EOS (`causal_generate`).

    max_input_len: inputs are cut to this many tokens (None: not cut). knowledge_ids: a Kformer model's
    documents for each text, (texts, N, tokens)."""
    model.eval()
    if family(model).decoder_only:
        return causal_generate(model, tokenizer, texts, device, batch_size, max_input_len, max_new_tokens, num_beams)
    outputs = []
    for lo in range(0, len(texts), batch_size):
        enc = tokenizer(texts[lo:lo + batch_size], return_tensors="pt", padding=True,
                        truncation=max_input_len is not None, max_length=max_input_len).to(device.device)
        with contextlib.ExitStack() as stack:
            stack.enter_context(device.autocast())
            if knowledge_ids is not None:
                from nkb_model.kformer import knowledge
                stack.enter_context(knowledge(model, knowledge_ids[lo:lo + batch_size].to(device.device),
                                              enc["input_ids"]))
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, num_beams=num_beams)
        outputs += [filled_span(t) for t in tokenizer.batch_decode(out, skip_special_tokens=False)]
    return outputs


@torch.no_grad()
def causal_generate(model, tokenizer, prompts: list[str], device: Device, batch_size: int = 64,
                    max_input_len: int | None = None, max_new_tokens: int = 24, num_beams: int = 1) -> list[str]:
    """What a decoder-only model writes after each prompt, up to EOS (or a line break), without the prompt."""
    from nkb_model.causal import encode_prompts, pad_left
    ids = encode_prompts(tokenizer, prompts, max_input_len)
    outputs = []
    for lo in range(0, len(ids), batch_size):
        enc = {k: v.to(device.device) for k, v in pad_left(ids[lo:lo + batch_size], tokenizer.pad_token_id).items()}
        with device.autocast():
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, num_beams=num_beams,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        written = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        outputs += [" ".join(w.split("\n", 1)[0].split()) for w in written]
    return outputs


def teacher_forced(model, tokenizer, texts: list[str], seen: list[list[int]], max_input_len: int = 256):
    """Model inputs (on the model's device) that read each text and then the tokens `seen[r]` written after it,
    and each row's offset: the logits at position `offset + k` predict the k-th token after the text. A T5 reads
    the text with its encoder and `seen` after its decoder's start token (offset 0); a decoder-only model reads
    them as one right-padded sequence (offset: the prompt's last position)."""
    device = next(model.parameters()).device
    if not family(model).decoder_only:
        enc = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=max_input_len)
        width, pad = max(len(s) for s in seen), model.config.pad_token_id
        enc["decoder_input_ids"] = torch.tensor([[model.config.decoder_start_token_id] + s + [pad] * (width - len(s))
                                                 for s in seen])
        return enc.to(device), [0] * len(texts)
    from nkb_model.causal import encode_prompts, pad_causal
    prompts = encode_prompts(tokenizer, texts, max_input_len)
    batch = pad_causal(list(zip(prompts, seen)), tokenizer.pad_token_id)
    return {k: batch[k].to(device) for k in ("input_ids", "attention_mask")}, [len(p) - 1 for p in prompts]


def answer_ids(model, tokenizer, texts: list[str], answers: list[str]) -> list[list[int]]:
    """Each answer's tokens as the model writes it after its text: a T5's decoder starts afresh; a decoder-only
    model continues the prompt (a GPT-2 token carries its leading space)."""
    if not family(model).decoder_only:
        return tokenizer(answers, add_special_tokens=False)["input_ids"]
    from nkb_model.causal import encode_pairs
    return [target for _, target in encode_pairs(tokenizer, texts, answers, eos=False)]
