"""`nkb export`: a warehouse model as a folder that needs no project code, and the model card that goes with it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterator

from stages.model_card import model_card
from stages.models import model_lineage, source_model
from stages.names import answers_name
from warehouse import Warehouse, file_digest


def export_model(wh: Warehouse, name: str, target: Path, adapter: bool = False) -> Path:
    """Write model `name` to `target` (which must not exist or be empty), whole or not at all.

    Default: a stock folder of the model's family (`AutoModelForSeq2SeqLM` or `AutoModelForCausalLM`), the NKB
    merged into the FFNs. `adapter`: the base's folder plus the slots apart (`nkb/`), with the base's name and
    content hash."""
    from nkb_model.merge import merge_nkb
    from nkb_model.nkb import mounted_layers
    target = Path(target)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ValueError(f"{target} exists and is not empty; give a new folder")
    source = source_model(wh, name)
    model, tokenizer, info = source.load()
    if hasattr(model, "kformer"):
        raise ValueError(f"model {name!r} is a Kformer model: it reads retrieved documents at run time, which stock "
                         "transformers cannot do; it has no export")
    with staged_folder(target) as staging:
        if adapter:
            _write_adapter(model, info, name, staging)
        else:
            (merge_nkb(model) if mounted_layers(model) else model).save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        card = model_card(wh, info, model_lineage(wh, info), exported=not adapter, adapter=adapter)
        (staging / "README.md").write_text(card)
    return target


@contextlib.contextmanager
def staged_folder(target: Path) -> Iterator[Path]:
    """A new folder beside `target` to write an export into, which becomes `target` (absent, or an empty folder)
    when the block ends, or is removed if it fails: the export is there whole or not at all. Its folders and files
    get the modes the user's umask gives a new folder and file (the staging folder is made 0700 and safetensors
    writes 0600), and a user's empty `target` keeps its own mode."""
    target.parent.mkdir(parents=True, exist_ok=True)
    # A staging folder of a name no one else has: one that happens to be there (the user's) is never touched.
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.nkb-export-", dir=target.parent))
    try:
        yield staging
        _give_new_modes(staging, stat.S_IMODE(target.stat().st_mode) if target.exists() else None)
        if target.exists():
            target.rmdir()
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _give_new_modes(folder: Path, own_mode: int | None) -> None:
    """Give `folder`, and the folders and files in it, the modes a new folder and file get here; `folder` itself
    `own_mode` where given."""
    folder_mode, file_mode = _new_modes()
    for path in folder.rglob("*"):
        if not path.is_symlink():
            path.chmod(folder_mode if path.is_dir() else file_mode)
    folder.chmod(folder_mode if own_mode is None else own_mode)


def _new_modes() -> tuple[int, int]:
    """(folder mode, file mode) that this process's umask gives a new folder and file. The umask is read by setting
    it, once: to the strictest for that instant, so that a file another thread makes meanwhile is never more open
    than its umask allows."""
    umask = os.umask(0o077)
    os.umask(umask)
    return 0o777 & ~umask, 0o666 & ~umask


def _write_adapter(model, info: dict, name: str, folder: Path) -> None:
    """The base's folder with the slots apart (`nkb/`), which record the base's name and content hash."""
    from nkb_model.checkpoint import INFO
    from nkb_model.nkb import mounted_layers, save_nkb, unmount_nkb
    if not mounted_layers(model):
        raise ValueError(f"model {name!r} has no NKB slots: export it without --adapter")
    save_nkb(model, folder / "nkb")
    unmount_nkb(model)
    model.save_pretrained(folder)
    base = {"name": info.get("base_model") or info.get("source") or name, "sha256": weights_digest(folder)}
    (folder / "nkb" / "base.json").write_text(json.dumps(base, indent=1))
    (folder / INFO).write_text(json.dumps({**info, "base_folder": "."}, indent=1))  # the base is here


def check_export(wh: Warehouse, name: str, folder: Path, questions: int | None = None) -> dict:
    """Ask the exported `folder`, loaded by stock transformers alone, and model `name` in the warehouse the
    questions of the latest QA evaluation of `name`, or its first `questions` (its inputs, batches and decoding; in
    fp32, where a merged feed-forward layer rounds as the unmerged one does), and compare the answers: {evaluation:
    that run, loaded_with: the Auto class, questions, same: how many agree, differ: [(question_id, warehouse's, stock's)]}."""
    from transformers import AutoConfig, AutoTokenizer

    from nkb_model.families import family
    from nkb_model.train import choose_device
    from stages.configs import EvaluateConfig
    from stages.evaluation import model_outputs
    from stages.inputs import read_questions
    from warehouse import list_runs
    source = source_model(wh, name)
    asked = next((r for r in list_runs(wh, "evaluate") if r.status == "success" and not r.config.get("task")
                  and r.config["model_name"] == answers_name(source.name, r.config.get("shots") or 0)), None)
    if asked is None:
        raise ValueError(f"model {name!r} has no QA evaluation to compare its export with; run evaluate first")
    config = EvaluateConfig(**{k: v for k, v in asked.config.items() if k in EvaluateConfig.model_fields})
    device = choose_device(config.device, "fp32")
    examples = read_questions(wh, config.datasets, config.split)
    examples = examples.slice(0, questions) if questions is not None else examples
    auto = family(AutoConfig.from_pretrained(folder)).auto_class()
    stock = auto.from_pretrained(folder).to(device.device), AutoTokenizer.from_pretrained(folder)
    answers = [model_outputs(wh, examples, model, tokenizer, source.info, config, None, device)
               for model, tokenizer in (source.load(device)[:2], stock)]
    qids = examples.column("question_id").to_pylist()
    differ = [(q, ours, theirs) for q, ours, theirs in zip(qids, *answers) if ours != theirs]
    return {"evaluation": asked.run_id, "loaded_with": auto.__name__, "questions": len(qids),
            "same": len(qids) - len(differ), "differ": differ}


def weights_digest(directory: Path) -> str:
    """SHA-256 of a Hugging Face folder's weights: of its one safetensors file, or of its shards' digests."""
    files = sorted(Path(directory).glob("*.safetensors"))
    if len(files) == 1:
        return file_digest(files[0])
    return hashlib.sha256("".join(f"{f.name}:{file_digest(f)}\n" for f in files).encode()).hexdigest()
