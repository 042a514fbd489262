"""Model folders in the warehouse: finding a model by name, loading the one a stage reads, publishing the one
it writes. Models live under `files/models/<name>-<fingerprint>/` (see `nkb_model.checkpoint`)."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from nkb_model.checkpoint import INFO, read_info
from stages.registry import STAGES
from warehouse import RunRecord, StagedRun, Warehouse, get_run, list_runs


def model_dir(wh: Warehouse, name: str, fp: str) -> Path:
    """Where a model stage publishes model `name` built from inputs `fp` (its training checkpoint goes beside)."""
    directory = wh.files_dir / "models" / f"{name}-{fp[:12]}"
    directory.parent.mkdir(parents=True, exist_ok=True)
    return directory


def model_present(run: RunRecord) -> bool:
    """Whether the model a run published is still there (a skip is refused when it is not)."""
    return (Path(run.checkpoint or "") / INFO).exists()


def find_model(wh: Warehouse, name: str) -> Path:
    """The directory of the model called `name` that a stage run last built or chose (`select_model`), else of the
    newest one of that name, or `name` itself if it is a model directory."""
    if (Path(name) / "config.json").exists():
        return Path(name)
    selected = _selected(wh, name)
    if selected is not None:
        return selected
    for run in list_runs(wh):
        if STAGES.get(run.stage) and STAGES[run.stage].publishes_model and run.status == "success" \
                and model_present(run) and read_info(run.checkpoint)["name"] == name:
            return Path(run.checkpoint)
    raise ValueError(f"no model named {name!r}; train it first (nkb run base-model / inject / finetune)")


def select_model(wh: Warehouse, run: RunRecord) -> None:
    """Record that later stages reading the model `run` published by name read this one: the run built it now, or
    was skipped because it had built it before. The newest model of a name is not always the one a plan stands for:
    back at an earlier setting, a skipped fine-tuning stands for its earlier model while a later setting's is newer,
    and the evaluation after it read the later one."""
    if not (wh.leader and model_present(run)):
        return
    name = read_info(run.checkpoint)["name"]
    pointer = _pointer(wh, name)
    partial = pointer.with_name(f".{pointer.name}.{run.run_id}.partial")
    partial.write_text(json.dumps({"run_id": run.run_id, "folder": str(Path(run.checkpoint).relative_to(wh.home))
                                   if Path(run.checkpoint).is_relative_to(wh.home) else run.checkpoint}))
    partial.replace(pointer)


def _pointer(wh: Warehouse, name: str) -> Path:
    return wh.files_dir / "models" / f"{name}.selected.json"


def _selected(wh: Warehouse, name: str) -> Path | None:
    """The folder `select_model` last recorded for `name`, if it is still there and still that model."""
    try:
        folder = wh.home / json.loads(_pointer(wh, name).read_text())["folder"]
        return folder if (folder / INFO).exists() and read_info(folder)["name"] == name else None
    except (OSError, ValueError, KeyError):
        return None


@dataclass(frozen=True)
class SourceModel:
    """The model a stage reads: its folder and info, what stands for it in a fingerprint, and loading it."""
    directory: Path
    info: dict

    @property
    def name(self) -> str:
        return self.info["name"]

    @property
    def lineage(self) -> list[str]:
        """What stands for the model in a fingerprint: a warehouse model by its folder's name (name and inputs
        fingerprint) and the run that built it, so that a moved or copied warehouse skips what it has; a folder
        brought from outside by its path."""
        built_by = self.info.get("built_by")
        return [self.directory.name, built_by] if built_by else [str(self.directory), ""]

    def load(self, device=None):
        """(model, tokenizer, info); with a `Device`, on it, in eval mode and without gradients: for reading and
        editing, not training (autocast keeps a bf16 copy of each weight that needs gradients until its region
        ends, which would hide a slot edit made between two forward passes)."""
        from nkb_model.checkpoint import load_model
        model, tokenizer, info = load_model(self.directory)
        if device is not None:
            model.to(device.device).eval().requires_grad_(False)
        return model, tokenizer, info


def source_model(wh: Warehouse, name: str) -> SourceModel:
    return model_at(find_model(wh, name))


def model_at(directory: Path) -> SourceModel:
    return SourceModel(directory, read_info(directory))


def base_dir_of(directory: Path) -> Path:
    """The base model folder a model was built on (a base is its own)."""
    from nkb_model.checkpoint import base_folder
    info = read_info(directory)
    return directory if info["kind"] == "base" else base_folder(directory, info)


def publish_model(run: StagedRun, target: Path, write: Callable[[Path], None]) -> None:
    """Write a model that becomes `target` when the run commits; its training checkpoint (`work_dir`) goes then.
    Only the leader of a data-parallel run publishes."""
    if not run.is_leader:
        return

    def write_with_card(directory: Path) -> None:
        write(directory)
        from stages.model_card import model_card
        info = read_info(directory)
        (directory / "README.md").write_text(model_card(run.wh, info, model_lineage(run.wh, info, run.record)))

    run.publish_folder(target, write_with_card, drop=work_dir(target))
    run.record.checkpoint = str(target)


def model_lineage(wh: Warehouse, info: dict, building: RunRecord | None = None) -> list[RunRecord]:
    """The run that built a model and those that built the models it came from, newest first; `building` is
    the run writing it, before it is recorded."""
    runs, run_id = [], info.get("built_by")
    while run_id and run_id not in {r.run_id for r in runs} and \
            (run := building if building and building.run_id == run_id else get_run(wh, run_id)) is not None:
        runs.append(run)
        source = run.config.get("model") or run.config.get("base_model")
        try:
            run_id = read_info(find_model(wh, source)).get("built_by") if source else None
        except (ValueError, FileNotFoundError):  # a model brought from outside the warehouse
            run_id = None
    return runs


def work_dir(target: Path) -> Path:
    """The training checkpoint folder of the model that will be `target`: named by the inputs fingerprint, so
    an interrupted run resumes from it."""
    return target.parent / f".train-{target.name}"


def resumable_dir(run: StagedRun, target: Path) -> Path:
    """The folder in `work_dir(target)` where this run's code keeps its training checkpoint: one per code version,
    so that every process of the run resumes only steps its own code took (another code's steps under this run's
    code version would make the run row's version wrong for the model, and the resumed run no longer bit-identical
    to an uninterrupted one). The leader drops other code's checkpoints; the run's output `not_resumed` names them."""
    folder = work_dir(target)
    directory = folder / re.sub(r"[^\w.-]", "_", run.record.code_version)
    others = [p for p in folder.glob("*") if p != directory] if run.is_leader else []
    if others:  # a file here is a checkpoint from before this layout: its code is unknown
        run.output("not_resumed", "the training checkpoint written by code "
                   + ", ".join(sorted({p.name if p.is_dir() else "unknown" for p in others})))
    for other in others:
        if other.is_dir():
            shutil.rmtree(other)
        else:
            other.unlink()
    return directory
