"""Generating answers: the decoding loops behind evaluation, the knowledge probe, the report and edits, one per model
family (`nkb_model.families.generate` picks a model's)."""

from __future__ import annotations

import contextlib
import inspect
import re
from typing import Callable, Iterator

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
                    max_input_len: int | None = None, max_new_tokens: int = 24, num_beams: int = 1,
                    words: list[int] | None = None) -> list[str]:
    """What a decoder-only model writes after each prompt, up to EOS (or a line break), without the prompt. Batches
    hold prompts of like length (a batch reads every row at its longest prompt's length: batched in the order asked,
    the demo's RAG evaluation took 1.5x as long), at most `batch_size` of them and at most the device's
`batch_tokens` (`Device.batch_tokens`); the outputs come in the prompts' order. `words`: each row is
    wanted only for the first `words[i]` words of its first line (a probe's fill), so it may stop once they are
    final. Greedy decoding leaves each row out of the batch once it is done (`greedy_rows`); beams, or a model
    whose generation config changes what greedy picks, go through `generate`, which writes every row to the end."""
    from nkb_model.causal import encode_prompts, line_end_ids, pad_left
    ids = encode_prompts(tokenizer, prompts, max_input_len)
    stops = list(line_end_ids(tokenizer))
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    outputs = [""] * len(ids)
    greedy = num_beams == 1 and plain_greedy(model)
    for rows in length_batches(order, [len(i) for i in ids], batch_size, device.batch_tokens):
        enc = {k: v.to(device.device) for k, v in pad_left([ids[i] for i in rows], tokenizer.pad_token_id).items()}
        with device.autocast():
            if greedy:
                done = _words_final(tokenizer, [words[i] for i in rows]) if words is not None else None
                written = greedy_rows(model, enc, set(stops), max_new_tokens, done)
            else:
                out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, num_beams=num_beams,
                                     eos_token_id=stops, pad_token_id=tokenizer.pad_token_id)
                written = out[:, enc["input_ids"].shape[1]:]
        for i, text in zip(rows, first_lines(tokenizer, written)):
            outputs[i] = text
    return outputs


def length_batches(order: list[int], lengths: list[int], batch_size: int,
                   max_tokens: int | None = None) -> Iterator[list[int]]:
    """`order` (rows by ascending length) cut into consecutive batches of at most `batch_size` rows and, with
    `max_tokens`, at most that many tokens at their longest row's length; a row longer than that alone."""
    batch: list[int] = []
    for row in order:
        if batch and (len(batch) == batch_size or max_tokens and (len(batch) + 1) * lengths[row] > max_tokens):
            yield batch
            batch = []
        batch.append(row)
    if batch:
        yield batch


# What a model's generation config may say and greedy decoding still pick the most likely token at every step.
_GREEDY_NEUTRAL = {"bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "use_cache",
                   "transformers_version", "_from_model_config", "output_attentions", "output_hidden_states",
                   "do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p", "max_length",
                   "max_new_tokens"}


def plain_greedy(model) -> bool:
    """Whether the model's generation config leaves greedy decoding the plain argmax (no repetition penalty, no
    banned or forced tokens): then `greedy_rows` writes what `generate` would."""
    config = getattr(model, "generation_config", None)
    return config is None or set(config.to_diff_dict()) <= _GREEDY_NEUTRAL


def greedy_rows(model, enc: dict[str, torch.Tensor], stops: set[int], max_new_tokens: int,
                done: Callable[[int, list[int]], bool] | None = None, cache=None) -> list[list[int]]:
    """Greedy continuations of left-padded prompts, each row's tokens up to and with its first stop token. `generate`
    writes every row until the last one stops (a probe's batch of 256 ran all 16 steps for the 5 rows that needed
    them); here a row is done once it writes a stop or `done(row, tokens)` says the rest is not wanted, and the rows
    still writing are taken out, with their keys and values, once they are half the batch or fewer (copying the
    cache of a long prompt at every row's end cost more than it saved). With `cache` (the keys and values of the
    mask's first columns, one row per prompt), `input_ids` holds only the columns after them."""
    mask = enc["attention_mask"]
    step_ids = enc["input_ids"]
    # each row's text counted from position 0 past its padding, as `generate` counts it
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -step_ids.shape[1]:]
    rows = list(range(len(mask)))  # the prompt each row of the batch continues
    writing = [True] * len(rows)
    written: list[list[int]] = [[] for _ in rows]
    last_only = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    for _ in range(max_new_tokens):
        out = model(input_ids=step_ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                    use_cache=True, **last_only)
        chosen = out.logits[:, -1].argmax(-1).tolist()
        for j, token in enumerate(chosen):
            if writing[j]:
                written[rows[j]].append(token)
                writing[j] = token not in stops and not (done and done(rows[j], written[rows[j]]))
        if not any(writing):
            break
        cache = out.past_key_values
        if 2 * sum(writing) <= len(writing):
            kept = [j for j, w in enumerate(writing) if w]
            index = torch.tensor(kept, device=mask.device)
            cache.batch_select_indices(index)
            mask, positions = mask[index], positions[index]
            rows, chosen, writing = [rows[j] for j in kept], [chosen[j] for j in kept], [True] * len(kept)
        step_ids = torch.tensor([[token] for token in chosen], device=mask.device)  # a done row's: read, not kept
        mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
        positions = positions[:, -1:] + 1
    return written


def _words_final(tokenizer, words: list[int]) -> Callable[[int, list[int]], bool]:
    """A row's first `words[row]` words are final once its text holds one word more (the last wanted one has
    ended); the first line is all that is read, and a line break stops the row anyway."""
    return lambda row, tokens: len(tokenizer.decode(tokens, skip_special_tokens=True).split()) > words[row]


def first_lines(tokenizer, written: torch.Tensor | list[list[int]]) -> list[str]:
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
        stops = list(line_end_ids(self.tokenizer))
        with self.device.autocast():
            if plain_greedy(self.model):
                written = greedy_rows(self.model, {"input_ids": ids[:, len(self.head):], "attention_mask": mask},
                                      set(stops), max_new_tokens, cache=cache)
            else:
                out = self.model.generate(input_ids=ids, attention_mask=mask, past_key_values=cache, do_sample=False,
                                          max_new_tokens=max_new_tokens, eos_token_id=stops,
                                          pad_token_id=self.tokenizer.pad_token_id)
                written = out[:, ids.shape[1]:]
        return first_lines(self.tokenizer, written)
