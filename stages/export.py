"""`nkb export`: a warehouse model as a folder that needs no project code, and the model card that goes with it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from stages.model_card import model_card
from stages.models import model_lineage, source_model
from warehouse import Warehouse, file_digest


def export_model(wh: Warehouse, name: str, target: Path, adapter: bool = False) -> Path:
    """Write model `name` to `target` (which must not exist or be empty), whole or not at all.

    Default: a stock folder of the model's family (`AutoModelForSeq2SeqLM` or `AutoModelForCausalLM`), the NKB
    merged into the FFNs. `adapter`: the base's folder plus the slots apart (`nkb/`), with the base's name and
    content hash."""
    from nkb_model.checkpoint import INFO
    from nkb_model.merge import merge_nkb
    from nkb_model.nkb import mounted_layers, save_nkb, unmount_nkb
    target = Path(target)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ValueError(f"{target} exists and is not empty; give a new folder")
    source = source_model(wh, name)
    model, tokenizer, info = source.load()
    if hasattr(model, "kformer"):
        raise ValueError(f"model {name!r} is a Kformer model: it reads retrieved documents at run time, which stock "
                         "transformers cannot do; it has no export")
    staging = target.with_name(f".{target.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        if adapter:
            if not mounted_layers(model):
                raise ValueError(f"model {name!r} has no NKB slots: export it without --adapter")
            save_nkb(model, staging / "nkb")
            unmount_nkb(model)
            model.save_pretrained(staging)
            base = {"name": info.get("base_model") or info.get("source") or name,
                    "sha256": weights_digest(staging)}
            (staging / "nkb" / "base.json").write_text(json.dumps(base, indent=1))
            (staging / INFO).write_text(json.dumps({**info, "base_folder": "."}, indent=1))  # the base is here
        else:
            exported = merge_nkb(model) if mounted_layers(model) else model
            exported.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        card = model_card(wh, info, model_lineage(wh, info), exported=not adapter, adapter=adapter)
        (staging / "README.md").write_text(card)
        if target.exists():
            target.rmdir()
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def weights_digest(directory: Path) -> str:
    """SHA-256 of a Hugging Face folder's weights: of its one safetensors file, or of its shards' digests."""
    files = sorted(Path(directory).glob("*.safetensors"))
    if len(files) == 1:
        return file_digest(files[0])
    return hashlib.sha256("".join(f"{f.name}:{file_digest(f)}\n" for f in files).encode()).hexdigest()
