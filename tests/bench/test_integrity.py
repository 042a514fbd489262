"""The integrity benchmark end to end on a tiny table: it builds a committed partition and measures every way."""

import json

import pytest

from bench import integrity


@pytest.mark.slow
def test_the_benchmark_builds_its_table_through_a_stage_and_measures_each_read(tmp_path, capsys):
    assert integrity.main(["--mb", "1", "--people", "20", "--home", str(tmp_path / "bench")]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["bytes"] >= 1_000_000 and figures["rows"] > 0
    for key in ("write_with_checksums_s", "check_before_read_s", "whole_digest_s", "scan_verified_s",
                "scan_unverified_s", "nkb_sql_scan_s", "cli_view_scan_s", "cli_bare_scan_s", "cli_view_count_s"):
        assert figures[key] >= 0, key
