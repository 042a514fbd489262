"""`nkb export`'s folder: written whole or not at all, with the modes the user's umask gives a new folder and file
(the export of a real model is in test_models.py's slow tier)."""

import os
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from stages.export import staged_folder


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def write_model(folder: Path) -> None:
    save_file({"w": torch.zeros(2)}, folder / "model.safetensors")  # safetensors writes its file 0600
    (folder / "nkb").mkdir()
    (folder / "nkb" / "base.json").write_text("{}")


def test_an_export_has_the_modes_the_umask_gives_a_new_folder_and_file(tmp_path, umask_027):
    """Issue 100: the folder was 0700 and model.safetensors 0600 whatever the umask."""
    with staged_folder(tmp_path / "export") as staging:
        write_model(staging)
    target = tmp_path / "export"
    assert (mode(target), mode(target / "nkb")) == (0o750, 0o750)
    assert (mode(target / "model.safetensors"), mode(target / "nkb" / "base.json")) == (0o640, 0o640)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_a_users_empty_target_folder_keeps_its_own_mode(tmp_path, umask_027):
    """Issue 100: a user's empty 755 folder was replaced by a 0700 one."""
    target = tmp_path / "mine"
    target.mkdir()
    target.chmod(0o755)
    with staged_folder(target) as staging:
        write_model(staging)
    assert mode(target) == 0o755 and mode(target / "model.safetensors") == 0o640


def test_a_failed_export_leaves_nothing_and_a_users_folder_as_it_was(tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    target.chmod(0o711)
    with pytest.raises(RuntimeError), staged_folder(target) as staging:
        write_model(staging)
        raise RuntimeError("the disk is full")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"] and mode(target) == 0o711
    assert list(target.iterdir()) == []
