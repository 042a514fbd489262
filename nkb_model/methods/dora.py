"""DoRA (Liu et al. 2024): LoRA whose update is split into a magnitude per output and a direction, through PEFT's
`use_dora`, on the FFN maps of the blocks the slots would be on, at the rank that gives it about as many parameters
as the slots (the magnitudes add one per output of each map). Saved in PEFT's own folder (`dora/`), merged into the
maps on loading, so that `nkb export` writes a stock model."""

from __future__ import annotations

from nkb_model.method import Method
from nkb_model.methods.lora import load_adapters, train_adapters

FOLDER = "dora"

METHODS = (
    Method("dora", "inject", "base+DoRA", "The base with DoRA adapters (PEFT's use_dora: LoRA with a magnitude per "
           "output) trained on the slot blocks' FFN maps as the slots are, at the rank that gives them as many "
           "parameters as the slots.", "DoRA adapters (PEFT) trained on the slot blocks' FFN maps", order=55,
           trains=lambda model, settings, start: train_adapters(model, settings, start, FOLDER, use_dora=True),
           folder=FOLDER, load=load_adapters, load_order=20, settings_key="dora", later=True, named_only=True),
)
