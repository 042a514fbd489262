"""The report plot names each curve by the run's own model and task, one panel per kind of training."""

from stages.configs import BaseModelConfig, FinetuneConfig, InjectConfig
from stages.report_plot import distinct_colours, report_figure, smooth
from warehouse import Warehouse, run_stage


def record(wh, stage, config, curves: dict[str, list[float]]):
    def body(run):
        for metric, values in curves.items():
            for step, value in enumerate(values):
                run.metric(metric, value, split="train", step=step)
        return {}
    run_stage(wh, stage, config.model_dump(), f"fp-{stage}-{config.task if stage == 'finetune' else ''}", body)


def test_curves_are_labelled_by_model_and_task_and_split_by_objective(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    record(wh, "base-model", BaseModelConfig(name="base"), {"pretrain_loss": [3, 2], "pretrain_ssm_loss": [4, 3]})
    record(wh, "inject", InjectConfig(corpus="wiki", general_share=0.5, general_corpus="general"),
           {"ssm_loss": [2, 1], "general_loss": [0.3, 0.2]})
    for task in (None, "translation"):
        record(wh, "finetune", FinetuneConfig(model="base+nkb", task=task), {f"{task or 'qa'}_loss": [1, 0.5]})
    fig = report_figure(wh)
    curve_axes = [ax for ax in fig.axes if ax.get_visible() and ax.get_legend()
                  and ax.get_title() != "EM per model (validation)"]
    panels = {ax.get_title(): [t.get_text() for t in ax.get_legend().get_texts()] for ax in curve_axes}
    assert panels == {"Pretraining": ["base: span corruption", "base: salient span masking"],
                      "Injection": ["base+nkb: general text", "base+nkb: SSM"],
                      "Fine-tuning": ["base+nkb.qa", "base+nkb.translation"]}


def test_colours_never_repeat_and_smoothing_averages_the_trailing_window():
    for n in (3, 11, 25):
        assert len(set(distinct_colours(n))) == n
    assert smooth([1, 3, 5, 7], 2) == [1, 2, 4, 6]
