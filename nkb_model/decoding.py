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
    """What a decoder-only model writes after each prompt, up to EOS (or a line break), without the prompt. Batches
    hold prompts of like length (a batch reads every row at its longest prompt's length: batched in the order asked,
    the demo's RAG evaluation took 1.5x as long); the outputs come in the prompts' order."""
    from nkb_model.causal import encode_prompts, line_end_ids, pad_left
    ids = encode_prompts(tokenizer, prompts, max_input_len)
    stops = list(line_end_ids(tokenizer))
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    outputs = [""] * len(ids)
    for lo in range(0, len(ids), batch_size):
        rows = order[lo:lo + batch_size]
        enc = {k: v.to(device.device) for k, v in pad_left([ids[i] for i in rows], tokenizer.pad_token_id).items()}
        with device.autocast():
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, num_beams=num_beams,
                                 eos_token_id=stops, pad_token_id=tokenizer.pad_token_id)
        for i, text in zip(rows, first_lines(tokenizer, out[:, enc["input_ids"].shape[1]:])):
            outputs[i] = text
    return outputs


def first_lines(tokenizer, written: torch.Tensor) -> list[str]:
    """Each row's written tokens as text, up to its first line break, whitespace collapsed."""
    return [" ".join(w.split("\n", 1)[0].split()) for w in tokenizer.batch_decode(written, skip_special_tokens=True)]


class SharedPrefix:
    """A decoder-only model's continuations of `prefix + text` for many texts (a few-shot prompt's demonstrations,
    then each request), the prefix read once: its keys and values are computed here and copied into every batch,
    whose rows are left-padded between the prefix and their text (the attention mask skips the padding, and the
    positions follow it). Greedy, up to the first line break, as `causal_generate`; to rounding the same
    continuations, with each prompt's prefix read once instead of once a row (~2.3x faster on SmolLM2 at
    three demonstrations)."""

    @torch.no_grad()
    def __init__(self, model, tokenizer, prefix: str, device: Device):
        from nkb_model.causal import start_ids
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.head = start_ids(tokenizer) + tokenizer(prefix, add_special_tokens=False)["input_ids"]
        with device.autocast():
            self.cache = model(torch.tensor([self.head], device=device.device), use_cache=True).past_key_values

    @torch.no_grad()
    def generate(self, texts: list[str], max_new_tokens: int) -> list[str]:
        import copy

        from nkb_model.causal import line_end_ids, pad_left
        tails = pad_left(self.tokenizer(texts, add_special_tokens=False)["input_ids"], self.tokenizer.pad_token_id)
        rows, head = len(texts), torch.tensor([self.head])
        ids = torch.cat([head.expand(rows, -1), tails["input_ids"]], dim=1).to(self.device.device)
        mask = torch.cat([torch.ones_like(head).expand(rows, -1), tails["attention_mask"]], dim=1)
        mask = mask.to(self.device.device)
        cache = copy.deepcopy(self.cache)  # generation extends it
        cache.batch_repeat_interleave(rows)
        with self.device.autocast():
            out = self.model.generate(input_ids=ids, attention_mask=mask, past_key_values=cache, do_sample=False,
                                      max_new_tokens=max_new_tokens, eos_token_id=list(line_end_ids(self.tokenizer)),
                                      pad_token_id=self.tokenizer.pad_token_id)
        return first_lines(self.tokenizer, out[:, ids.shape[1]:])
