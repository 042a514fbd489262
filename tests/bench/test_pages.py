"""Every generated page and README block is what its records give: a figure changes with its record, not by hand."""

import json

from bench import pages, routes
from bench.recorded import Records


def test_every_generated_page_is_what_its_records_give():
    assert not pages.stale(), "run `python -m bench.pages`"


def test_a_page_edited_by_hand_is_found(tmp_path, monkeypatch):
    page = tmp_path / "routes.md"
    monkeypatch.setattr(routes, "PAGE", page)
    page.write_text(routes.page(routes.RECORDS.all()))
    assert page not in pages.stale()
    page.write_text(page.read_text() + "| base+lora | 99.9 |\n")
    assert page in pages.stale()


def levers_output(row: str, em: float) -> dict:
    return {"row": row, "name": row, "questions": 67, "em": em, "em_interval": [em - 10, em + 10], "em_0shot": 12.0,
            "em_0shot_interval": [5.0, 20.0], "train_seconds": 812.4, "probe_unseen": 10.0, "probe_seen": 50.0,
            "heldout_loss": 4.4, "heldout_loss_base": 4.0, "capitals_known": 47, "capitals_kept": 3}


def test_a_route_is_recorded_with_its_change_against_the_base_and_shown_on_the_page(tmp_path, monkeypatch):
    records = Records("routes-test")
    monkeypatch.setattr(records.__class__, "folder", property(lambda self: tmp_path / self.name))
    kind = {"slug": "x-1-2", "name": "CPU", "family": 1, "model": 2, "bf16_units": []}
    record = {"machine": kind, "rows": {"base+dora": routes.row_of(levers_output("base+dora", 40.0), 1234567)}}
    records.write(kind, record)
    row = json.loads(records.path(kind).read_text())["rows"]["base+dora"]
    assert row["heldout_loss_change"] == 10.0 and row["params_trained"] == 1234567
    text = routes.page(records.all())
    assert "| base+dora | 1,234,567 | 40.0 (30.0-50.0) | 12.0 (5.0-20.0) | 10.0 / 50.0 | +10.00 % | 3 of 47 | 812 |" \
        in text
