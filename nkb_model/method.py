"""What a way of putting knowledge into a model is: one record (`Method`), registered once by a module of
`nkb_model.methods`; every list of methods (inject's variants, the experiment's routes and rows, the report's rows,
loading a saved model, its card, the help texts) is read from those records.

Three kinds of method:
    inject      a route added to a frozen (or wholly trained) base by the inject stage: `trains` mounts what trains
                and says how the result is saved; `load` puts the saved part back on the base (`folder`)
    finetune    the base fine-tuned on the questions with their retrieved documents, read the method's way
    prompt      nothing trained: the base asked with each question's top `documents` retrieved documents
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Protocol


class InjectSettings(Protocol):
    """What a method's training reads of inject's settings."""
    layers: list[str]
    slots: int | None
    slot_bias: float | None
    seed: int
    lora_rank: int | None


@dataclass(frozen=True)
class Trained:
    """What a method made trainable on the model, and how the model is saved once trained: its changes apart from
    the base's folder, or all its weights."""
    count: int
    save: Callable[[Any, Any, Path, dict], Any]  # (model, tokenizer, directory, info)
    frozen_base: bool = True  # the blocks below the trained ones stay as they were (the prefix cache holds)


@dataclass(frozen=True)
class Method:
    name: str                 # its part of a model's name: BASE+NAME (inject), BASE.NAME (finetune); a row's key
    kind: Literal["inject", "finetune", "prompt"]
    label: str                # how the report shows its row
    description: str          # what the report's glossary says its row is
    summary: str              # what it trains, in a few words (help texts, the model card: "a MODEL with SUMMARY")
    order: int                # where its row stands among the report's rows (base at 10, large at 90)
    trains: Callable[[Any, InjectSettings, Path | None], Trained] | None = None  # inject: (model, settings, start)
    folder: str | None = None  # the folder of a saved model its changes are in, beside the base's weights
    load: Callable[[Any, Path], Any] | None = None  # (model, that folder) -> the model with them put on
    load_order: int = 50      # where its folder loads among a model's: changed maps first, merged adapters, then
                              # the slots (mounted over the maps they add to), Kformer last (it refuses slots it meets)
    variant: str = ""         # inject's variant that trains it; default its name (lora-8 is lora at rank 8)
    planned: tuple[tuple[str, Any], ...] = ()  # inject settings the method fixes over the experiment's
    settings_key: str | None = None  # a key of an experiment's `stages:` that sets its trainings over inject's
    slots: bool = False       # the model holds NKB slots the report unmounts for the base's held-out loss
    sparse_slots: bool = False  # inject's sparse_slots applies (slots beside a frozen base)
    documents: int = 0        # prompt: retrieved documents in each question's prompt
    needs_encoder: bool = False  # finetune: reads the documents with the base's encoder (a T5 baseline)
    generation: bool = False  # also fine-tuned on the generation tasks (the general-generation check)
    main: bool = False        # the row whose slots analyze, surgery and edit study
    later: bool = False       # added after warehouses had reports: off in a report config unless named
    named_only: bool = False  # a training of its own, for comparison: in the rows when named (or routes)

    @property
    def trained_by(self) -> str:
        """inject's variant that trains it."""
        return self.variant or self.name

    @property
    def inject_settings(self) -> dict[str, Any]:
        """What the method sets on inject's config: its variant, and the settings it fixes."""
        return {"variant": self.trained_by} | dict(self.planned)

    @property
    def settings_keys(self) -> tuple[str, ...]:
        """The keys of an experiment's `stages:` that set its trainings over inject's own."""
        return (self.settings_key,) if self.settings_key else ()

    @property
    def row_key(self) -> str:
        """Its row's name in an experiment's `rows`: base+NAME for a route, NAME otherwise."""
        return f"base+{self.name}" if self.kind == "inject" else self.name

    @property
    def field(self) -> str:
        """The report setting that names its row's model."""
        return self.name.replace("-", "_")
