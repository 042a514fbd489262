"""The runner's summary of a stage run."""

import datetime as dt

from stages.runner import summarize
from warehouse import RunRecord, StageResult


def result(outputs: dict, value=None, skipped=False) -> StageResult:
    run = RunRecord(run_id="r1", stage="s", status="success", inputs_fingerprint="fp", config={},
                    code_version="c", started_at=dt.datetime(2026, 1, 1), outputs=outputs)
    return StageResult(run=run, skipped=skipped, value=value)


def test_rows_written_counts_table_rows_only():
    row = summarize("base-model", result({"model_params": 1_301_632}, {"params": 1_301_632}), 10.0)
    assert row["rows_written"] == 0 and row["written"] == "" and "rows_per_second" not in row
    assert row["model_params"] == 1_301_632
    row = summarize("evaluate", result({"predictions": 40, "steps": 3}), 2.0)
    assert row["rows_written"] == 40 and row["written"] == "40 predictions" and row["rows_per_second"] == 20.0
    assert row["steps"] == 3


def test_an_evaluations_em_per_dataset_is_in_its_summary():
    row = summarize("evaluate", result({"predictions": 8}, {"model": "base.3shot", "em": {"nq": 12.5, "tqa": 0.0}}), 4.0)
    assert (row["em.nq"], row["em.tqa"], row["model"]) == (12.5, 0.0, "base.3shot")


def test_a_skipped_run_reports_no_speed():
    row = summarize("ingest", result({"documents": 10}, skipped=True), 0.5)
    assert row["skipped"] and "rows_per_second" not in row


def test_progress_in_a_log_is_a_line_per_redraw_not_one_line_of_them_all(monkeypatch, capsys):
    import sys
    from stages import progress as bars
    monkeypatch.setenv("NKB_PROGRESS", "1")
    monkeypatch.setattr(bars, "LOG_INTERVAL_S", 0)  # redraw on every update
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    with bars.progress(total=500, desc="inject base+nkb", unit=" step") as bar:
        for _ in range(500):
            bar.update(1)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) > 10 and "\r" not in "".join(lines) and max(map(len, lines)) < 150
    assert lines[-1].startswith("inject base+nkb: 100%") and lines[-1] != lines[-2]
    monkeypatch.setattr(bars, "LOG_INTERVAL_S", 30)
    with bars.progress(total=5, desc="quick") as bar:  # over before the first interval: no line at all
        bar.update(5)
    assert capsys.readouterr().err == ""


def test_bf16_asked_of_a_cpu_without_it_is_said_before_anything_runs(monkeypatch):
    import torch
    from nkb_model import train as train_module
    from stages.configs import EvaluateConfig, InjectConfig, IngestConfig
    from stages.runner import precision_notes
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    runs = [("ingest", IngestConfig(path="dump.xml.bz2")),
            ("inject", InjectConfig(precision="bf16")),
            ("evaluate", EvaluateConfig(precision="bf16")),
            ("report", EvaluateConfig(precision="fp32"))]
    monkeypatch.setattr(train_module, "cpu_computes_bf16", lambda: False)
    (note,) = precision_notes(runs)
    assert note.startswith("precision bf16 is asked of evaluate, inject, but this CPU has no bf16 arithmetic")
    assert "run in fp32" in note
    assert precision_notes([(name, config.model_copy(update={"device": "cuda"})) for name, config in runs]) == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU, but these stages asked for the CPU
    on_the_cpu = [(name, config.model_copy(update={"device": "cpu"})) for name, config in runs]
    (on_cpu,) = precision_notes(on_the_cpu)
    assert on_cpu.startswith("precision bf16 is asked of evaluate, inject,")
    assert precision_notes(runs) == []  # `auto` takes the GPU
    monkeypatch.setattr(train_module, "cpu_computes_bf16", lambda: True)
    monkeypatch.setattr(train_module, "cpu_bf16_speedup", lambda: 0.57)  # AVX512-BF16 without AMX, an Intel Xeon
    (slower,) = precision_notes(on_the_cpu)
    assert "bf16 matrix products run at 0.57x its fp32 ones' speed" in slower and "run in fp32" in slower
    monkeypatch.setattr(train_module, "cpu_bf16_speedup", lambda: 2.2)
    assert precision_notes(on_the_cpu) == []
