"""The report plot names each curve by the run's own model and task, one panel per kind of training."""

import numpy as np
import pytest
from matplotlib.container import BarContainer

from stages.configs import BaseModelConfig, FinetuneConfig, InjectConfig
from stages.report import REPORT_COLUMNS, em_intervals, em_intervals_of, report_rows
from stages.report_plot import distinct_colours, report_figure, smooth
from warehouse import Warehouse, run_stage


def record(wh, stage, config, curves: dict[str, list[float]]):
    def body(run):
        for metric, values in curves.items():
            for step, value in enumerate(values):
                run.metric(metric, value, split="train", step=step)
        return {}
    run_stage(wh, stage, config.model_dump(), f"fp-{stage}-{config.task if stage == 'finetune' else ''}", body)


def report_columns(**given: list) -> dict[str, list]:
    """A `report` partition's columns: those given, every other column of the schema empty."""
    rows = len(next(iter(given.values())))
    return {c: given.get(c, [None] * rows) for c in REPORT_COLUMNS}


@pytest.mark.slow
def test_curves_are_labelled_by_model_and_task_and_split_by_objective(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    record(wh, "base-model", BaseModelConfig(name="base"), {"pretrain_loss": [3, 2], "pretrain_ssm_loss": [4, 3]})
    record(wh, "inject", InjectConfig(corpus="wiki", general_share=0.5, general_corpus="general"),
           {"ssm_loss": [2, 1], "general_loss": [0.3, 0.2]})
    for task in (None, "translation"):
        record(wh, "finetune", FinetuneConfig(model="base+nkb", task=task), {f"{task or 'qa'}_loss": [1, 0.5]})
    fig = report_figure(wh)
    curve_axes = [ax for ax in fig.axes if ax.get_visible() and ax.get_legend()
                  and not ax.get_title().startswith("What each model knows")]
    panels = {ax.get_title(): [t.get_text() for t in ax.get_legend().get_texts()] for ax in curve_axes}
    assert panels == {"Pretraining": ["base: span corruption", "base: salient span masking"],
                      "Injection": ["base+nkb: general text", "base+nkb: SSM"],
                      "Fine-tuning": ["base+nkb.qa", "base+nkb.translation"]}


@pytest.mark.slow
def test_each_model_shows_its_em_with_its_interval_beside_its_probes(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    hits = {"base": [False] * 9 + [True], "base+NKB": [True] * 3 + [False] * 7}

    spans = [em_intervals_of({"dataset": ["nq"] * 10, "exact_match": hits[m]})["nq"] for m in hits]

    def body(run):
        run.write("report", "latest", report_columns(
            model=["base", "base", "base+NKB", "base+NKB"], dataset=["nq", "average"] * 2,
            split=["validation"] * 4, em=[10.0, 10.0, 30.0, 30.0], em_low=[s[0] for s in spans for _ in "ab"],
            em_high=[s[1] for s in spans for _ in "ab"], params_total=[5] * 4, params_trained=[0, 0, 2, 2],
            probe_em=[1.0, 1.0, 25.0, 25.0], probe_seen_em=[0.0, 0.0, 70.0, 70.0], heldout_loss=[4.0] * 4,
            model_run=["r"] * 4))
        return {}
    run_stage(wh, "report", {}, "fp-report", body)
    (ax,) = [ax for ax in report_figure(wh).axes if ax.get_title() == "What each model knows (validation)"]
    # one dataset: its EM alone (the average would repeat it), then the probes; a bar per model in each
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["EM nq", "probe, unseen wording",
                                                                   "probe, seen wording"]
    assert [round(p.get_height(), 1) for p in ax.patches] == [10.0, 30.0, 1.0, 25.0, 0.0, 70.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["base", "base+NKB"]
    em_bars, *probe_bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert all(c.errorbar is None for c in probe_bars)  # a probe has no interval here
    drawn = [tuple(segment[:, 1]) for segment in em_bars.errorbar.lines[2][0].get_segments()]
    intervals = em_intervals(report_rows(wh))
    assert drawn == [pytest.approx(intervals[(m, "nq")]) for m in hits]
    assert [intervals[(m, "nq")] for m in hits] == [pytest.approx(s) for s in spans]
    assert drawn[0] != drawn[1]


def test_a_rows_interval_is_the_bootstrap_of_its_answers_and_the_average_resamples_each_dataset_alone():
    answers = {"dataset": ["a"] * 10 + ["b"] * 10, "exact_match": [True] * 5 + [False] * 5 + [True] * 10}
    intervals = em_intervals_of(answers)
    assert intervals["a"][0] < 50.0 < intervals["a"][1] and intervals["b"] == (100.0, 100.0)
    assert intervals["average"][0] < 75.0 < intervals["average"][1] and intervals["average"][1] <= 100.0
    assert intervals["average"][1] - intervals["average"][0] < intervals["a"][1] - intervals["a"][0]


def test_colours_never_repeat_and_smoothing_averages_the_trailing_window():
    for n in (3, 11, 25):
        assert len(set(distinct_colours(n))) == n
    assert smooth([1, 3, 5, 7], 2) == [1, 2, 4, 6]


@pytest.mark.slow
def test_each_route_is_a_point_of_em_against_the_general_text_it_forgot_labelled_with_the_facts_it_kept(tmp_path):
    wh = Warehouse(tmp_path / "wh")

    def body(run):
        run.write("report", "latest", report_columns(
            model=["base", "base", "base+NKB", "base+NKB", "base+FT", "base+FT"], dataset=["nq", "average"] * 3,
            split=["validation"] * 6, em=[0.0, 0.0, 30.0, 30.0, 20.0, 20.0], params_total=[5] * 6,
            params_trained=[0, 0, 2, 2, 2, 2], heldout_loss=[4.0, 4.0, 4.04, 4.04, 5.0, 5.0],
            heldout_loss_change=[0.0, 0.0, 1.0, 1.0, 25.0, 25.0], facts_retained=[100.0, 100.0, 98.0, 98.0, 50.0, 50.0],
            model_run=["r"] * 6))
        return {}
    run_stage(wh, "report", {}, "fp-report", body)
    (ax,) = [ax for ax in report_figure(wh).axes if ax.get_title() == "Knowledge gained against what was forgotten"]
    points = [tuple(np.round(line.get_xydata()[0], 3)) for line in ax.lines if line.get_marker() == "o"]
    assert points == [(0.0, 0.0), (1.0, 30.0), (25.0, 20.0)]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "base: loss +0.0%, 100% facts kept", "base+NKB: loss +1.0%, 98% facts kept", "base+FT: loss +25.0%, 50% facts kept"]
    # and against the facts kept, where routes that forget general text alike can differ
    (ax,) = [ax for ax in report_figure(wh).axes if ax.get_title() == "Knowledge gained against the base's facts kept"]
    assert [tuple(np.round(line.get_xydata()[0], 3)) for line in ax.lines if line.get_marker() == "o"] == [
        (100.0, 0.0), (98.0, 30.0), (50.0, 20.0)]


@pytest.mark.slow
def test_the_curves_are_those_of_the_reports_models_not_of_trials_beside_them(tmp_path):
    from stages.configs import ReportConfig
    wh = Warehouse(tmp_path / "wh")
    def losses(run):
        for metric in ("qa_loss", "ssm_loss"):
            run.metric(metric, 1.0, split="train", step=0)
        return {}
    for name in ("base+nkb", "trial"):  # a lever trial trained into the experiment's warehouse under its own name
        config = InjectConfig(corpus="wiki", name=name, qa_share=0.5)
        run_stage(wh, "inject", config.model_dump(), f"fp-{name}", losses)
    record(wh, "finetune", FinetuneConfig(model="base+nkb"), {"qa_loss": [1, 0.5]})

    def body(run):
        run.write("report", "latest", report_columns(model=["base+NKB"], dataset=["average"], split=["validation"],
                                                     em=[1.0], params_total=[5], params_trained=[2], model_run=["r"]))
        return {}
    run_stage(wh, "report", ReportConfig().model_dump(), "fp-report", body)
    axes = {ax.get_title(): ax for ax in report_figure(wh).axes if ax.get_visible() and ax.get_legend()}
    panels = {title: [t.get_text() for t in axes[title].get_legend().get_texts()] for title in ("Injection",
                                                                                                 "Fine-tuning")}
    assert panels == {"Injection": ["base+nkb: questions", "base+nkb: SSM"], "Fine-tuning": ["base+nkb.qa"]}
    questions, ssm = axes["Injection"].get_lines()  # one model: one colour, an objective each its line style
    assert questions.get_color() == ssm.get_color() and questions.get_linestyle() != ssm.get_linestyle()


def test_a_models_average_of_one_dataset_is_left_out_where_the_report_is_read():
    from stages.report import rows_to_read
    rows = [{"model": "base", "dataset": "nq"}, {"model": "base", "dataset": "average"},
            {"model": "base+NKB", "dataset": "nq"}, {"model": "base+NKB", "dataset": "tqa"},
            {"model": "base+NKB", "dataset": "average"}]
    assert [(r["model"], r["dataset"]) for r in rows_to_read(rows)] == [
        ("base", "nq"), ("base+NKB", "nq"), ("base+NKB", "tqa"), ("base+NKB", "average")]
