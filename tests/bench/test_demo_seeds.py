"""The README's headline table is the demo's recorded runs, each cell the first seed's figure with the range over the
record's seeds."""

from bench import demo_seeds
from bench.recorded import README


def record(*ems: float) -> dict:
    row = {"probe_em": 25.0, "probe_seen_em": 74.0, "heldout_loss": 4.2, "heldout_loss_change": -1.0,
           "facts_retained": 4.3}
    return {"machine": {"name": "Xeon", "family": 6, "model": 167, "bf16_units": ["amx"]}, "commit": "abc1234",
            "date": "2026-12-07", "seeds": {str(i): {"seconds": 600.0 + 60 * i, "rows": {
                "base+NKB (5-shot)": row | {"em": em, "em_low": em - 10, "em_high": em + 10}}}
                for i, em in enumerate(ems)}}


def test_a_cell_is_the_first_seeds_figure_with_the_range_over_the_seeds():
    assert demo_seeds.cell(record(49.3, 44.8, 52.2), "base+NKB (5-shot)", "em") == "49.3 [44.8 to 52.2]"
    assert demo_seeds.cell(record(49.3), "base+NKB (5-shot)", "em") == "49.3"
    assert demo_seeds.cell(record(49.3, 44.8), "base (5-shot)", "em") == "–"  # a row the record lacks
    block = demo_seeds.readme_block([record(49.3, 44.8, 52.2)])
    assert "| base+NKB (5-shot) | 49.3 [44.8 to 52.2] (39.3-59.3) | 25.0 / 74.0 | -1.0 % | 4 |" in block
    assert "commit abc1234, 2026-12-07: injection seed 0, [the range over seeds 0, 1, 2]" in block
    assert "took up to 12 min" in block


def test_the_readmes_headline_is_written_from_the_records():
    recorded = demo_seeds.records()
    assert recorded, "no record of the demo: python -m bench.demo_seeds --record"
    text = README.read_text()
    start = text.index(demo_seeds.README_MARKS[0])
    end = text.index(demo_seeds.README_MARKS[1]) + len(demo_seeds.README_MARKS[1])
    assert text[start:end] == demo_seeds.readme_block(recorded), "run `python -m bench.pages`"


def test_the_page_shows_every_seeds_rows():
    text = demo_seeds.page([record(49.3, 44.8, 52.2)])
    assert "## Xeon (family 6, model 167, amx)" in text
    assert [line.split(" | ")[2] for line in text.splitlines() if "| base+NKB (5-shot) |" in line] == \
        ["49.3 (39.3-59.3)", "44.8 (34.8-54.8)", "52.2 (42.2-62.2)"]
