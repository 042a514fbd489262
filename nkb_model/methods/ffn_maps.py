"""The FFN maps' own weights of the blocks the slots would be on, trained as the slots are (the continued
pretraining users do, on the same blocks); saved as those weights (`blocks/`), put over the base's on loading."""

from __future__ import annotations

from pathlib import Path

from nkb_model.method import InjectSettings, Method, Trained

FOLDER = "blocks"


def train_maps(model, settings: InjectSettings, start: Path | None) -> Trained:
    from nkb_model.adapters import save_trained_maps, train_ffn_maps
    from nkb_model.checkpoint import save_model
    count = train_ffn_maps(model, settings.layers)
    model.eval()

    def save(m, tokenizer, directory: Path, info: dict) -> None:
        save_trained_maps(m, directory / FOLDER)
        save_model(m, tokenizer, directory, info, weights_changed=False)
    return Trained(count, save)


def load_maps(model, folder: Path):
    from nkb_model.adapters import load_trained_maps
    load_trained_maps(model, folder)
    return model


METHODS = (
    Method("ft", "inject", "base+FT", "The base with the slot blocks' own FFN maps trained as the slots are "
           "(continued pretraining of those blocks).", "the slot blocks' own FFN maps trained", order=60,
           trains=train_maps, folder=FOLDER, load=load_maps, load_order=10, settings_key="ft", later=True, named_only=True),
)
