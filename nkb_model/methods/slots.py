"""NKB: slots mounted on the FFNs of some blocks and trained on the knowledge, the base frozen (nkb); or the same
with every weight trained (nkb-a, the paper's comparison). Saved as the slots apart (`nkb/`), and for nkb-a the
model's own weights too."""

from __future__ import annotations

from pathlib import Path

from nkb_model.method import InjectSettings, Method, Trained

FOLDER = "nkb"


def mount_slots(model, settings: InjectSettings, start: Path | None, train_everything: bool = False) -> Trained:
    """Mount the NKB on `model` (its slots from `start`'s when given) and set what trains: the slots alone, the
    frozen rest without dropout; or everything."""
    import torch
    from nkb_model.checkpoint import save_model
    from nkb_model.nkb import NKBConfig, load_nkb_weights, mark_only_nkb_trainable, mount_nkb, mounted_layers
    torch.manual_seed(settings.seed)
    mount_nkb(model, NKBConfig(layers=settings.layers, slots=settings.slots, key_bias=settings.slot_bias))
    if start:
        load_nkb_weights(model, start)
    if train_everything:
        for p in model.parameters():
            p.requires_grad = True
        model.train()
        return Trained(sum(p.numel() for p in model.parameters()),
                       lambda m, t, d, info: save_model(m, t, d, info, weights_changed=True), frozen_base=False)
    trainable = mark_only_nkb_trainable(model)
    model.eval()  # frozen parts run without dropout
    for layer in mounted_layers(model).values():
        layer.nkb_dropout.train()
    return Trained(trainable, lambda m, t, d, info: save_model(m, t, d, info, weights_changed=False))


def load_slots(model, folder: Path):
    from nkb_model.nkb import load_nkb
    load_nkb(model, folder)
    return model


METHODS = (
    Method("nkb", "inject", "base+NKB", "The base with NKB slots injected.",
           "Neural Knowledge Bank slots injected (the base frozen)", order=30, trains=mount_slots, folder=FOLDER,
           load=load_slots, load_order=70, slots=True, sparse_slots=True, generation=True, main=True),
    Method("nkb-a", "inject", "base+NKB-a", "The base with NKB injected while training everything.",
           "NKB slots injected while every weight trained (NKB-a)", order=40,
           trains=lambda model, settings, start: mount_slots(model, settings, start, train_everything=True),
           folder=FOLDER, load=load_slots, load_order=70, settings_key="nkb-a", slots=True, generation=True),
)
