"""LoRA adapters (PEFT) on the FFN maps of the blocks the slots would be on: at the rank that gives them as many
parameters as the slots (lora), or at PEFT's default rank (lora-8). Saved in PEFT's own folder (`lora/`), merged
into the maps they adapt on loading."""

from __future__ import annotations

from pathlib import Path

from nkb_model.method import InjectSettings, Method, Trained

FOLDER = "lora"
PEFT_DEFAULT_RANK = 8  # the size a user who takes the library's defaults trains


def train_adapters(model, settings: InjectSettings, start: Path | None, folder: str = FOLDER,
                   **peft_options) -> Trained:
    """PEFT adapters on the FFN maps of the blocks slots would be on; rank `lora_rank`, or the one at which they
    have as many parameters as those slots. `peft_options` go to PEFT's LoraConfig (use_dora=True: DoRA)."""
    import torch
    from nkb_model.adapters import matched_rank, mount_lora, save_lora, slot_parameters, trainable_count
    from nkb_model.checkpoint import save_model
    torch.manual_seed(settings.seed)
    rank = settings.lora_rank or matched_rank(model, settings.layers,
                                              slot_parameters(model, settings.layers, settings.slots))
    wrapped = mount_lora(model, settings.layers, rank, **peft_options)
    model.eval()

    def save(m, tokenizer, directory: Path, info: dict) -> None:
        save_lora(wrapped, directory / folder)
        save_model(m, tokenizer, directory, {**info, "lora_rank": rank}, weights_changed=False)
    return Trained(trainable_count(model), save)


def load_adapters(model, folder: Path):
    from nkb_model.adapters import load_lora
    return load_lora(model, folder)


METHODS = (
    Method("lora", "inject", "base+LoRA", "The base with LoRA adapters (PEFT) trained on the slot blocks' FFN maps "
           "as the slots are, at the rank that gives them as many parameters as the slots.",
           "LoRA adapters (PEFT) trained on the slot blocks' FFN maps", order=50, trains=train_adapters,
           folder=FOLDER, load=load_adapters, load_order=20, settings_key="lora", later=True, named_only=True),
    Method(f"lora-{PEFT_DEFAULT_RANK}", "inject", f"base+LoRA (r={PEFT_DEFAULT_RANK})",
           f"The same LoRA training at PEFT's default rank ({PEFT_DEFAULT_RANK}).",
           f"LoRA adapters (PEFT) of rank {PEFT_DEFAULT_RANK} on the slot blocks' FFN maps", order=51,
           variant="lora", planned=(("lora_rank", PEFT_DEFAULT_RANK),), settings_key="lora", later=True,
           named_only=True),
)
