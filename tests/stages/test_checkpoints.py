"""A training stage's checkpoint is resumed only by the code that wrote it (`stages.models.resumable_dir`)."""

import pytest

import warehouse.commit as commit
from stages.models import model_dir, resumable_dir, work_dir
from warehouse import Warehouse, run_stage


def training(wh, found: list, crash: bool):
    """A stand-in for a training stage's body: notes whether a checkpoint was there to resume, writes one, and is
    stopped by Ctrl-C when `crash`."""
    target = model_dir(wh, "m", "f" * 64)

    def body(run):
        checkpoint = resumable_dir(run, target) / "trainer.pt"
        found.append(checkpoint.exists())
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        checkpoint.write_text(run.record.code_version)
        if crash:
            raise KeyboardInterrupt("simulated crash")
    return run_stage(wh, "inject", {"name": "m"}, "fp", body)


@pytest.mark.parametrize("later, resumed", [("abc123", True), ("def456", False)])
def test_an_interrupted_training_resumes_its_checkpoint_only_under_the_code_that_wrote_it(tmp_path, monkeypatch,
                                                                                        later, resumed):
    wh, found = Warehouse(tmp_path / "wh"), []
    monkeypatch.setattr(commit, "code_version", lambda: "abc123")
    with pytest.raises(KeyboardInterrupt):
        training(wh, found, crash=True)
    monkeypatch.setattr(commit, "code_version", lambda: later)  # the code updated between the two, or not
    result = training(wh, found, crash=False)
    assert found == [False, resumed]
    assert ("not_resumed" in result.run.outputs) is not resumed
    if not resumed:
        assert "abc123" in result.run.outputs["not_resumed"]
    checkpoints = list(work_dir(model_dir(wh, "m", "f" * 64)).rglob("trainer.pt"))
    assert [c.read_text() for c in checkpoints] == [later]  # the other code's checkpoint is gone


def test_a_checkpoint_from_before_code_versions_were_kept_is_not_resumed(tmp_path):
    wh, found = Warehouse(tmp_path / "wh"), []
    old = work_dir(model_dir(wh, "m", "f" * 64)) / "trainer.pt"
    old.parent.mkdir(parents=True)
    old.write_text("steps of unknown code")
    result = training(wh, found, crash=False)
    assert found == [False] and not old.exists()
    assert result.run.outputs["not_resumed"] == "the training checkpoint written by code unknown"
