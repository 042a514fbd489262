"""The injection recipe, in one object: given inject's settings and the data the stage read, `Injection` mounts what
the variant's method trains, composes every step's batches (salient span masking drawn anew each epoch, on cached
states where the blocks below the trained ones are frozen; general text at `general_share`; the QA steps at
`qa_share`, mixed or first, taught in part by the base reading each question's passage at `qa_teacher`; each step
held to the base's own text at `own_text_weight`) and what runs after each step (the updates of all but the slots
most specific to the batch put back, `sparse_slots`; the slots kept within the FFN's scale, `slot_scale`). The
inject stage reads the warehouse, calls it, trains and writes; nothing here reads a table."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from nkb_model.families import family
from nkb_model.method import Trained
from nkb_model.methods import variants

OWN_TEXT_TOKENS = 48  # a few sentences each: one such text beside each batch row keeps the term's FFNs' work small
SPARSE_BACKGROUND_BATCHES = 8  # general-text batches each slot's background use is measured on (sparse_slots)


@dataclass(frozen=True)
class InjectionData:
    """What an injection trains on, as the stage read it."""
    segment_ids: list[str]  # the knowledge's segments, in the order of `texts`
    texts: list[str]
    drawn: Callable[[int], Any]  # epoch -> its SSM examples: a table with segment_id, input, target
    questions: tuple[list[str], list[str]] | None = None  # the QA steps' questions and first answers
    general: np.ndarray | None = None  # general text packed as the base's pretraining packed it, its held-out rows out
    passages: list[list[str]] | None = None  # each QA question's passage for its teacher (qa_teacher)


@dataclass(frozen=True)
class Prepared:
    """An injection ready to train: what the method mounted (and how it is saved), the module the loop trains (the
    model, or its tail over cached states), the SSM batches alone, every step's batches, and what runs after each
    step."""
    mounted: Trained
    module: Any
    ssm: Any
    batches: Any
    after_step: Callable[[], Any] | None


class _Unshown:
    """A progress bar that shows nothing."""

    def update(self, n: int = 1) -> None:
        pass


def _quiet(**_) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext(_Unshown())


class Injection:
    """inject's recipe. `settings` has inject's settings (`stages.configs.InjectConfig`); `progress` makes a
    progress bar (tqdm's keyword arguments) for the slow preparations."""

    def __init__(self, settings, data: InjectionData, device, progress: Callable[..., Any] = _quiet):
        self.settings, self.data, self.device, self.progress = settings, data, device, progress

    def prepare(self, model, tokenizer, start: Path | None = None) -> Prepared:
        """Mount the method on `model` (its slots from `start`'s when given) and compose the steps."""
        own = self.own_text(model, tokenizer)  # before anything is mounted: the base's own writes
        taught = self.taught_answers(model, tokenizer)  # and the base reading each question's passage
        made = variants()[self.settings.variant].trains(model, self.settings, start)
        self.device.hold(model)  # only what trains is saved: a frozen base may be held in bf16
        trained, ssm, batches = self.batches(model, tokenizer, made.frozen_base, own, taught)
        return Prepared(made, trained, ssm, batches, self.after_step(model, trained, tokenizer))

    def batches(self, model, tokenizer, frozen_base: bool = True, own=None, taught=None):
        """(what trains, the SSM batches, every step's batches)."""
        from nkb_model.base_model import Interleaved, Named, Sequenced
        s, kind = self.settings, family(model)

        def examples(epoch: int) -> tuple[list[str], list[str]]:
            drawn = self.data.drawn(epoch)
            return drawn.column("input").to_pylist(), drawn.column("target").to_pylist()

        trained, ssm = model, kind.pair_batches(examples, tokenizer, s.batch_size, s.seed, s.max_input_len,
                                                target_eos=False, group_by_length=s.group_by_length)
        if s.cache and frozen_base:  # where the architecture allows it
            trained, ssm = self.cached(model, tokenizer, ssm)
        batches = Named(ssm, "ssm_loss")
        if s.general_share:
            batches = Interleaved(batches, Named(self.general_batches(kind, tokenizer), "general_loss"),
                                  s.general_share)
        if s.qa_share:
            qa = self.qa_batches(kind, tokenizer)
            if taught is not None:
                from nkb_model.answer_teacher import TaughtAnswers, WithTaughtAnswers
                qa = WithTaughtAnswers(qa, taught)
            if trained is not model:  # the slots train on cached states: the questions' too
                from nkb_model.prefix_cache import fixed_pairs_cached
                qa = fixed_pairs_cached(qa, model, tokenizer, trained.k, self.device)
            qa = Named(qa, "qa_loss")
            batches = (Interleaved(batches, qa, s.qa_share) if s.qa_order == "mixed"
                       else Sequenced(qa, batches, round(s.qa_share * s.steps)))
            if taught is not None:
                trained = TaughtAnswers(trained, s.qa_teacher)
        if own is not None:
            from nkb_model.own_text import HeldToOwnText, WithOwnText
            kl_rows = s.own_text_kl_rows if s.own_text_kl else 0
            trained, batches = (HeldToOwnText(trained, model, own, s.own_text_weight, s.own_text_kl, kl_rows),
                                WithOwnText(batches, own, s.seed, kl_rows))
        return trained, ssm, batches

    def cached(self, model, tokenizer, pairs):
        """(what to train, its SSM batches) on the segment cache (`nkb_model.prefix_cache`), or the model and the
        plain pair batches where the model's family cannot be served that way."""
        from nkb_model.prefix_cache import (CachedBatches, CachedTail, SegmentCache, first_trainable_block,
                                            supports_cache)
        if not supports_cache(model):
            return model, pairs
        k = first_trainable_block(model)
        index = {s: i for i, s in enumerate(self.data.segment_ids)}
        with self.progress(desc=f"cache blocks 0-{k - 1}", unit=" seg", total=len(self.data.texts)) as bar:
            cache = SegmentCache(model, tokenizer, self.data.texts, k, self.device, progress=bar.update)
        return CachedTail(model, k), CachedBatches(
            pairs, lambda epoch: [index[s] for s in self.data.drawn(epoch).column("segment_id").to_pylist()], cache,
            model)

    def qa_batches(self, kind, tokenizer):
        """The QA steps' questions and first answers, each asked as the family `kind`'s models are
        (`Family.qa_example`)."""
        s = self.settings
        asked, answers = self.data.questions
        inputs = [kind.qa_example(q) for q in asked]
        return kind.pair_batches(lambda epoch: (inputs, answers), tokenizer, min(s.batch_size, len(inputs)), s.seed,
                                 s.max_input_len, target_eos=s.qa_eos, group_by_length=s.group_by_length)

    def general_batches(self, kind, tokenizer):
        """The general text's batches, as the family `kind`'s base was pretrained on it (span corruption, or
        next-token)."""
        rows = self.data.general
        return kind.text_batches(rows, tokenizer, min(self.settings.general_batch_size, len(rows)), self.settings.seed)

    def taught_answers(self, model, tokenizer):
        """The base's next tokens at each QA answer's tokens, read after the question's passage (`qa_teacher`), or
        None."""
        s = self.settings
        if not (s.qa_share and s.qa_teacher):
            return None
        from nkb_model.answer_teacher import teach_answers
        kind = family(model)
        asked, _ = self.data.questions
        prompts = [kind.qa_example(q, passage) for q, passage in zip(asked, self.data.passages)]
        _, targets = self.qa_batches(kind, tokenizer).encoded()  # the answers' tokens as the QA steps read them
        model.to(self.device.device)
        with self.progress(desc="the base reading each question's passage", unit=" question",
                           total=len(prompts)) as bar:
            return teach_answers(model, tokenizer, prompts, targets, self.device, progress=bar.update)

    def own_text(self, model, tokenizer):
        """Text the base writes, its FFNs' traffic on it at the trained blocks (`own_text_weight`) and its own next
        tokens' distribution (`own_text_kl`), or None."""
        s = self.settings
        if not (s.own_text_weight or s.own_text_kl):
            return None
        import torch

        from nkb_model.mounting import resolve_layers
        from nkb_model.own_text import ffn_traffic, sample_own_text
        model.to(self.device.device)
        asked = round(s.own_text_rows * s.own_text_asked)  # rows the base writes after the questions' head
        parts = [(s.own_text_rows - asked, "")] + ([(asked, family(model).question_head())] if asked else [])
        with self.progress(desc="the base's own text", unit=" text", total=s.own_text_rows) as bar:
            ids = [sample_own_text(model, tokenizer, rows, OWN_TEXT_TOKENS, s.seed, self.device, progress=bar.update,
                                   head=head) for rows, head in parts if rows]
        return ffn_traffic(model, torch.cat(ids), resolve_layers(model, s.layers), self.device,
                           teacher=bool(s.own_text_kl))

    def after_step(self, model, trained, tokenizer) -> Callable[[], Any] | None:
        """What runs after each optimizer step, or None: the slots kept within the FFN's scale (`slot_scale`),
        after the updates of all but the slots most specific to the batch were put back (`sparse_slots`)."""
        from nkb_model.nkb import mounted_layers
        s, hooks = self.settings, []
        if s.sparse_slots:
            from nkb_model.sparse_slots import SparseSlotUpdates, background_use
            general = self.general_batches(family(model), tokenizer)
            background = background_use(model, (general(i) for i in range(min(SPARSE_BACKGROUND_BATCHES,
                                                                                general.per_epoch))),
                                        self.device, trained)
            hooks.append(SparseSlotUpdates(model, s.sparse_slots, background).after_step)
        if s.slot_scale:
            hooks += [functools.partial(layer.bound_to_ffn_scale, s.slot_scale)
                      for layer in mounted_layers(model).values()]
        return (lambda: [hook() for hook in hooks]) if hooks else None
