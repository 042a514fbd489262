"""A benchmark's run kept in its machine kind's record, and each page written from what was kept."""

import json
from types import SimpleNamespace

import pytest

from bench import fewshot_vs_harness, gpu, ingest, integrity, recorded
from bench.recorded import Records

CPU = {"slug": "x-1-2", "name": "CPU", "family": 1, "model": 2, "bf16_units": []}


@pytest.fixture
def records(tmp_path, monkeypatch):
    monkeypatch.setattr(Records, "folder", property(lambda self: tmp_path / self.name))
    return Records("bench-test")


def test_a_run_of_the_same_label_replaces_the_earlier_one_and_other_labels_stay(records):
    recorded.keep(records, CPU, "a", {"x": 1}, "python -m bench.x a", "1111111", "2026-01-01")
    recorded.keep(records, CPU, "b", {"x": 2}, "python -m bench.x b", "2222222", "2026-01-02")
    recorded.keep(records, CPU, "a", {"x": 3}, "python -m bench.x a", "3333333", "2026-01-03")
    runs = json.loads(records.path(CPU).read_text())["runs"]
    assert {label: (run["result"]["x"], run["commit"]) for label, run in runs.items()} == \
        {"a": (3, "3333333"), "b": (2, "2222222")}


def test_a_transcribed_run_says_where_its_figures_came_from(records):
    recorded.keep(records, CPU, "a", {}, "cmd", "1111111", "2026-01-01", transcribed="the journal, entry X")
    run = records.of(CPU)["runs"]["a"]
    assert recorded.dagger(run) == " †"
    assert "transcribed from the journal, entry X" in recorded.transcribed_lines([run])[0]
    assert recorded.transcribed_lines([{"commit": "1"}]) == []


def fewshot_result(questions=300, same=300):
    return {"model": "base", "shots": 5, "questions": questions, "dataset": "nq", "em_ours": 2.0, "em_harness": 2.0,
            "same_answer": 294, "same_em": same, "same_prompt": questions, "same_tokens": questions,
            "seconds_ours": 103.0, "questions_ours": 1000, "seconds_harness": 203.0, "em_difference": 0.0,
            "disagreements": [{"question": "a dataset's question"}], "other_answers": [],
            "harness_prompt": "Q: a dataset's question?"}


def test_the_few_shot_record_leaves_the_datasets_text_out_and_its_page_shows_the_agreement(records, monkeypatch):
    monkeypatch.setattr(fewshot_vs_harness, "RECORDS", records)
    monkeypatch.setattr(fewshot_vs_harness, "kind_of", lambda result: CPU)
    recorded.keep_run(fewshot_vs_harness, fewshot_result(), "python -m bench.fewshot_vs_harness --home H")
    recorded.keep_run(fewshot_vs_harness, fewshot_result(150, 149), "python -m bench.fewshot_vs_harness --limit 150")
    text = records.path(CPU).read_text()
    assert "a dataset's question" not in text
    record = records.of(CPU)
    assert fewshot_vs_harness.headline(record).startswith("the same verdict on 449 of 450 questions, the same prompt tokens on 450 (base, nq, 300 questions")
    assert "| base, nq, 300 questions, 5 shots | 2.00 / 2.00 | **300 of 300** | 300 / 300 | 294 | 10.3 / 67.7 |" \
        in fewshot_vs_harness.page([record])


def test_record_keeps_the_run_under_the_benchmarks_own_command_and_writes_the_pages(records, monkeypatch, capsys):
    monkeypatch.setattr(fewshot_vs_harness, "RECORDS", records)
    monkeypatch.setattr(fewshot_vs_harness, "kind_of", lambda result: CPU)
    monkeypatch.setattr(recorded, "write_pages", lambda: "wrote the pages")
    recorded.record_if_asked(SimpleNamespace(record=False), "bench.fewshot_vs_harness", fewshot_result(), ["--limit", "9"])
    assert records.of(CPU) is None
    recorded.record_if_asked(SimpleNamespace(record=True), "bench.fewshot_vs_harness", fewshot_result(), ["--limit", "9"])
    run = records.of(CPU)["runs"]["base, nq, 300 questions, 5 shots"]
    assert run["command"] == "python -m bench.fewshot_vs_harness --limit 9"
    assert capsys.readouterr().out.strip().endswith("; wrote the pages")


def test_the_ingest_page_sets_each_dump_beside_wikiextractor():
    row = {"dump": "dump-20x.xml.bz2", "uncompressed_mb": 121.8, "pages": 1960, "seconds": 7.6, "pages_per_s": 257.6,
           "peak_rss_with_workers_mb": 384.4, "ours": {"pages": 1960, "characters": 100, "pages_with_markup": 0,
                                                      "articles_with_markup": 0},
           "wikiextractor": {"seconds": 8.8, "pages_per_s": 239.9, "pages": 2120, "characters": 90,
                             "pages_with_markup": 20, "articles_with_markup": 1},
           "ours_over_wikiextractor_pages_per_s": 1.07}
    result = {"source": "/data/enwiki-x.bz2", "cpus": 2, "results": [row]}
    record = {"machine": CPU, "runs": {ingest.label(result): {"command": "c", "commit": "1", "date": "d",
                                                              "result": result}}}
    assert ingest.label(result) == "enwiki-x.bz2"
    assert "| dump-20x.xml.bz2, 121.8 MB | 1,960 / 2,120 | 7.6 / 8.8 | 258 / 240 | 1.07 | 100 / 90 | 0 (0) / 20 (1) " \
           "| 384 MB |" in ingest.page([record])
    assert ingest.headline(record).startswith("258 pages/s, 1.07x WikiExtractor's")


def test_the_integrity_page_has_a_column_per_size():
    def result(gb, check):
        return {"bytes": gb * 1e9, "rows": 9 * gb, "write_with_checksums_s": 1.0, "write_without_checksums_s": 1.0,
                "check_before_read_s": check, "whole_digest_s": 2.0, "scan_verified_s": 3.0, "scan_unverified_s": 2.0,
                "nkb_sql_scan_s": 3.1, "nkb_sql_count_s": 0.1, "scan_overhead_pct": 50.0, "write_overhead_pct": 0.0}
    runs = {integrity.label(result(g, c)): {"command": "c", "commit": "1", "date": "d", "result": result(g, c)}
            for g, c in ((2, 0.025), (6, 0.041))}
    text = integrity.page([{"machine": CPU, "runs": runs}])
    assert "| the check before each read" in text and "| 0.025 | 0.041 |" in text
    assert "| 2,000 MB, 18 rows | 6,000 MB, 54 rows |" in text


def test_a_gpu_run_is_kept_under_its_card_and_its_page_gives_each_step_timed():
    result = {"device": "NVIDIA H200", "torch": "2.11", "tests": {"passed": 7, "failed": 0, "skipped": 0},
              "t5_base": {"batch": "256 x (512 in + 16 out)", "compiled": True, "frozen_base": "bf16",
                          "inject": {"step_s": 0.0762, "mfu": 0.396, "peak_memory_gib": 7.7},
                          "paper_injection_hours": 0.64, "greedy": {"questions_per_s": 900.0}}}
    assert gpu.kind_of(result)["slug"] == "nvidia-h200"
    assert gpu.label(result) == "t5-base inject at batch 256, compiled, frozen base bf16"
    record = {"machine": gpu.kind_of(result), "runs": {gpu.label(result): {"command": "c", "commit": "1", "date": "d",
                                                                           "result": result}}}
    text = gpu.page([record])
    assert "| t5-base, inject | 256 | bf16 | yes | 0.0762 | 39.6 % | 7.7 | 0.64 | 1, d |" in text
    assert "CUDA tests 7 passed, 0 failed, 0 skipped; greedy decoding, questions/s: t5-base 900" in text
    assert gpu.headline(record) == "t5-base injection at 39.6 % MFU (1); the paper's 30K-step injection 0.64 h"
