"""The paper experiment's reproduction check: the CPU kind a record belongs to, the verdict on a moved mean, and the
docs page held to the records it is written from."""

import pytest

from bench import paper_t5
from bench.recorded import README, with_block
from stages.machine import cpu_kind

XEON_WITH_AMX = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile
processor\t: 1
"""
EPYC_ZEN4 = """vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9B14
flags\t\t: fpu avx512f avx512_bf16
"""


def test_a_cpu_kind_is_its_vendor_family_model_and_bf16_units():
    assert cpu_kind(XEON_WITH_AMX)["slug"] == "intel-6-143-amx-avx512bf16"
    assert cpu_kind(EPYC_ZEN4)["slug"] == "amd-25-17-avx512bf16"
    assert cpu_kind(EPYC_ZEN4)["name"] == "AMD EPYC 9B14"


def seeds(*ems: float, base: float = 3.0) -> dict:
    return {str(i): {"em_base+NKB": em, "em_base": base, "lead": em - base} for i, em in enumerate(ems)}


def test_a_halved_mean_is_a_move_beyond_the_seeds_spread_and_a_draw_within_it_is_not():
    recorded = paper_t5.summary(seeds(21.0, 12.3, 25.3, 16.7, 17.0))
    halved = paper_t5.compare(recorded, paper_t5.summary(seeds(11.0, 9.3, 12.0, 10.3, 11.7)))
    assert [v["moved"] for v in halved] == [True, True]
    redrawn = paper_t5.compare(recorded, paper_t5.summary(seeds(18.0, 14.0, 15.3, 13.0, 22.7)))
    assert [v["moved"] for v in redrawn] == [False, False]


def test_identical_seeds_still_need_a_shift_of_min_shift_points():
    recorded = paper_t5.summary(seeds(20.0, 20.0, 20.0))
    assert not paper_t5.compare(recorded, paper_t5.summary(seeds(21.0, 21.0, 21.0)))[0]["moved"]
    assert paper_t5.compare(recorded, paper_t5.summary(seeds(17.0, 17.0, 17.0)))[0]["moved"]


def test_the_summary_gives_each_figures_mean_spread_and_range():
    s = paper_t5.summary(seeds(20.0, 24.0))["em_base+NKB"]
    assert s == {"mean": 22.0, "sd": 2.8284, "low": 20.0, "high": 24.0, "n": 2}


def test_the_docs_page_and_the_readme_say_what_the_records_give():
    records = paper_t5.records()
    if not records:
        pytest.fail("no record of the paper's experiment: `python -m bench.paper_t5 --record` makes one")
    assert paper_t5.PAGE.read_text() == paper_t5.page(records), "run `python -m bench.pages`"
    readme = README.read_text()
    assert with_block(readme, paper_t5.README_MARKS, paper_t5.readme_block(records)) == readme, \
        "run `python -m bench.pages`"
    for record in records:
        assert set(record["summary"]) >= set(paper_t5.CHECKED) and len(record["seeds"]) >= 2
