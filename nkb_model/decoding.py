"""Generating answers: the decoding loops behind evaluation, the knowledge probe, the report and edits, one per model
family (`nkb_model.families.generate` picks a model's)."""

from __future__ import annotations

import contextlib
import re

import torch

from nkb_model.train import Device


def filled_span(decoded: str) -> str:
    """The text a model wrote for `<extra_id_0>` (after that sentinel, up to the next one); a model asked
    without a sentinel wrote plain text, which is returned as it is, without special tokens."""
    text = decoded.replace("<pad>", "").split("</s>", 1)[0]
    if "<extra_id_0>" in text:
        text = text.split("<extra_id_0>", 1)[1]
    return " ".join(re.sub(r"<extra_id_\d+>", " ", text.split("<extra_id_1>", 1)[0]).split())


@torch.no_grad()
def seq2seq_generate(model, tokenizer, texts: list[str], device: Device, batch_size: int = 64,
                     max_input_len: int | None = None, max_new_tokens: int = 24, num_beams: int = 1,
                     knowledge_ids: torch.Tensor | None = None) -> list[str]:
    """What an encoder-decoder model writes for each text: the span it fills (`filled_span`)."""
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
