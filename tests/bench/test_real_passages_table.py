"""bench.real_passages_table: the real-passage table read from a real warehouse's evaluations and bench.levers'
figures, and kept as a run of docs/real-passages.md's record."""

import json

import pytest

from bench import real_passages_table
from bench.real_passages_table import RAG_ROW, main
from tests.bench.test_seeds import answered
from warehouse import Warehouse, run_stage

CPU = {"slug": "x-1-2", "name": "CPU", "family": 1, "model": 2, "bf16_units": []}


def measured(levers, name: str, **figures) -> None:
    """A bench.levers run that measured the training `name`, as bench.levers records one."""
    def body(run):
        for key, value in figures.items():
            run.metric(f"bench.levers.{key}", value)
    run_stage(levers, "bench-levers", {"name": name}, name, body, force=True)


@pytest.fixture
def homes(tmp_path):
    wh, levers = Warehouse(tmp_path / ".nkb"), Warehouse(tmp_path / "levers")
    answered(wh, "base.5shot", [True] * 6 + [False] * 194)
    answered(wh, "base", [True] * 2 + [False] * 198)
    answered(wh, "base.3docs.5shot", [True] * 10 + [False] * 190)
    answered(wh, "nkb-seed0.5shot", [True] * 14 + [False] * 186)
    answered(wh, "nkb-seed1.5shot", [True] * 12 + [False] * 188)
    answered(wh, "nkb-seed0", [True] * 10 + [False] * 190)
    answered(wh, "nkb-seed1", [True] * 12 + [False] * 188)
    answered(wh, "lora-seed0.5shot", [True] * 4 + [False] * 196)  # never asked 0-shot
    common = {"heldout_loss_base": 3.5, "capitals_known": 49.0}
    measured(levers, "nkb-seed0", heldout_loss=3.535, capitals_kept=10, capitals_kept_routed=40, train_seconds=1500.4,
             params_trained=7962624, **common)
    measured(levers, "nkb-seed1", heldout_loss=3.57, capitals_kept=12, capitals_kept_routed=41, train_seconds=1499.6,
             params_trained=7962624, **common)
    measured(levers, "lora-seed0", heldout_loss=3.465, capitals_kept=0, params_trained=7964352, **common)
    return tmp_path / ".nkb", tmp_path / "levers"


def _table(homes, capsys, *more):
    home, levers = homes
    assert main(["--home", str(home), "--levers", str(levers), "--label", "200 questions (seed 0)",
                 "--setting", "a draw", "--row", "base+NKB=nkb-seed0,nkb-seed1", "--row", "base+LoRA=lora-seed0",
                 *more]) == 0
    return json.loads(capsys.readouterr().out.split("\nrecorded ")[0])  # --record says where it kept the run


def test_each_row_reads_its_seeds_answers_and_their_figures_against_the_base(homes, capsys):
    found = _table(homes, capsys)
    assert (found["heldout_loss_base"], found["capitals_known"]) == (3.5, 49)
    rows = found["rows"]
    assert list(rows) == ["base", RAG_ROW, "base+NKB", "base+LoRA"]
    assert rows["base"]["em_5shot"] == [3.0] and rows["base"]["em_0shot"] == [1.0]
    assert rows["base"]["capitals_kept"] == [49] and "lead" not in rows["base"]
    assert rows[RAG_ROW]["em_5shot"] == [5.0] and rows[RAG_ROW]["lead"] is None
    nkb = rows["base+NKB"]
    assert nkb["em_5shot"] == [7.0, 6.0] and nkb["em_5shot_mean"][0] == 6.5
    assert nkb["em_5shot_mean"][1] < 6.5 < nkb["em_5shot_mean"][2]
    assert nkb["lead"][0] == 3.5 and nkb["lead"][1] < 3.5 < nkb["lead"][2]
    assert nkb["em_0shot"] == [5.0, 6.0] and nkb["em_0shot_mean"][0] == 5.5
    assert nkb["heldout_change"] == [1.0, 2.0] and nkb["capitals_kept"] == [10, 12]
    assert nkb["capitals_routed"] == [40, 41] and nkb["train_seconds"] == [1500, 1500]
    assert nkb["params_trained"] == 7962624
    lora = rows["base+LoRA"]
    assert "em_0shot" not in lora and "capitals_routed" not in lora and lora["train_seconds"] == []
    assert lora["heldout_change"] == [-1.0] and lora["lead"][0] == -1.0


def test_a_training_bench_levers_never_measured_is_named(homes, capsys):
    home, levers = homes
    answered(Warehouse(home), "ft-seed0.5shot", [False] * 200)
    with pytest.raises(SystemExit):
        main(["--home", str(home), "--levers", str(levers), "--label", "x", "--setting", "y", "--row", "ft=ft-seed0"])
    assert "ft-seed0: no bench.levers figures of it in" in capsys.readouterr().err


def test_a_row_without_models_is_refused(homes, capsys):
    home, levers = homes
    with pytest.raises(SystemExit):
        main(["--home", str(home), "--levers", str(levers), "--label", "x", "--setting", "y", "--row", "base+NKB="])
    assert "give LABEL=MODEL[,MODEL...]" in capsys.readouterr().err


def test_recorded_the_table_is_a_run_of_the_real_passage_page(homes, capsys, tmp_path, monkeypatch):
    from bench import real_passages, recorded
    from bench.recorded import Records
    monkeypatch.setattr(Records, "folder", property(lambda self: tmp_path / "records" / self.name))
    monkeypatch.setattr(real_passages_table, "RECORDS", Records("test-real-passages"))
    monkeypatch.setattr(real_passages_table, "kind_of", lambda result: CPU)
    monkeypatch.setattr(recorded, "write_pages", lambda: "wrote the pages")
    found = _table(homes, capsys, "--record")
    record = Records("test-real-passages").of(CPU)
    run = record["runs"]["200 questions (seed 0)"]
    assert run["result"]["rows"] == found["rows"] and run["command"].startswith("python -m bench.real_passages_table")
    page = real_passages.page([record])  # the page's table is written from it
    assert "| base+NKB | 7.0, 6.0: **6.5** (" in page and "| 10, 12 (40, 41) | 7,962,624 | 1,500, 1,500 |" in page
