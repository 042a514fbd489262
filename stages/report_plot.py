"""The report as a picture and as Markdown: training loss curves (pretraining, injection, fine-tuning) beside EM
per model and dataset."""

from __future__ import annotations

import base64
import io

from stages.configs import REPORT_ROWS
from stages.report import report_rows
from warehouse import Warehouse, list_runs, run_metrics

# The panels of training curves: (title, stage, {metric: what its steps trained on}); a fine-tune's metric is
# `<task>_loss` (qa_loss for QA), matched by its suffix.
PANELS = [
    ("Pretraining", "base-model", {"pretrain_loss": "span corruption", "pretrain_ssm_loss": "salient span masking"}),
    ("Injection", "inject", {"ssm_loss": "SSM", "general_loss": "general text", "qa_loss": "questions"}),
    ("Fine-tuning", "finetune", {"_loss": ""}),
]
SMOOTHING = 25  # steps in the moving average: one step's loss is noise
LINE_STYLES = ("-", "--", ":")


def training_curves(wh: Warehouse, models: set[str] | None = None) -> dict[str, dict[tuple[str, str], tuple]]:
    """{panel: {(model, objective or ""): (steps, smoothed losses)}} of the newest successful run of each model: of `models` and
    their fine-tuned versions (`MODEL.qa`) where given, else of every model the warehouse trained."""
    from stages.registry import model_of
    out: dict[str, dict[tuple[str, str], tuple]] = {}
    for title, stage, metrics in PANELS:
        newest: dict[str, object] = {}
        for run in list_runs(wh, stage=stage):  # newest first
            model = model_of(stage, run.config)
            if run.status == "success" and model and model not in newest and (
                    models is None or any(model == m or model.startswith(f"{m}.") for m in models)):
                newest[model] = run
        curves = out.setdefault(title, {})
        for model, run in sorted(newest.items()):
            by_metric: dict[str, list[tuple[int, float]]] = {}
            for row in run_metrics(wh, run.run_id):
                if row["step"] is not None and any(row["metric"].endswith(m) for m in metrics):
                    by_metric.setdefault(row["metric"], []).append((row["step"], row["value"]))
            for metric, points in sorted(by_metric.items()):
                what = metrics.get(metric, "") if len(by_metric) > 1 else ""
                points.sort()
                curves[model, what] = ([p[0] for p in points], smooth([p[1] for p in points], SMOOTHING))
    return {title: curves for title, curves in out.items() if curves}


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over up to `window` values."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def report_figure(wh: Warehouse):
    """A matplotlib figure: a panel of loss curves per training kind, and what each model knows (`knowledge_bars`)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report_rows(wh)
    panels = training_curves(wh, reported_models(wh, rows))
    tradeoff = forgetting_points(rows)
    facts = any(point[-1] is not None for point in tradeoff)
    columns = 2
    drawn = len(panels) + 1 + bool(tradeoff) + facts
    grid_rows = (drawn + columns - 1) // columns
    fig, axes = plt.subplots(grid_rows, columns, figsize=(13, 4.6 * grid_rows), squeeze=False)
    axes = list(axes.flat)
    for ax in axes[drawn:]:
        ax.set_visible(False)
    for ax, (title, curves) in zip(axes, panels.items()):
        # a model's curves share its colour, an objective its line style: `base+nkb: questions` then `: SSM`
        models, objectives = (list(dict.fromkeys(key[i] for key in curves)) for i in (0, 1))
        colours = dict(zip(models, distinct_colours(len(models))))
        for (model, objective), (steps, values) in curves.items():
            ax.plot(steps, values, color=colours[model], label=f"{model}: {objective}" if objective else model,
                    linewidth=1.2, linestyle=LINE_STYLES[objectives.index(objective) % len(LINE_STYLES)])
        ax.set(xlabel="step", ylabel=f"training loss (moving average of {SMOOTHING} steps)", title=title,
               yscale="log")
        ax.legend(fontsize=7)
    knowledge_bars(axes[len(panels)], rows)
    if tradeoff:
        forgetting_scatter(axes[len(panels) + 1], tradeoff)
    if facts:
        forgetting_scatter(axes[len(panels) + 2], tradeoff, by_facts=True)
    fig.tight_layout()
    return fig


def reported_models(wh: Warehouse, rows: list[dict]) -> set[str] | None:
    """The models the latest report's rows name (None before any report): the figure's curves are theirs, not those
    of trials trained into the same warehouse under other names."""
    config = next((r.config for r in list_runs(wh, stage="report") if rows and r.run_id == rows[0]["run_id"]), None)
    if not config:
        return None
    return {config[row.field] for row in REPORT_ROWS if config.get(row.field)} or None


def forgetting_points(rows: list[dict]) -> list[tuple[str, float, tuple, float, float | None]]:
    """(model, average EM, its 95 % interval, held-out loss against the base's in %, facts retained in % or None)
    for each model with both an EM and a held-out loss, the base's included; empty without the base's loss."""
    from stages.report import by_model
    return [(model, r["em"], (r["em_low"], r["em_high"]) if r.get("em_low") is not None else (r["em"], r["em"]),
             r["heldout_loss_change"], r.get("facts_retained"))
            for model, r in by_model(rows).items() if r["em"] is not None and r.get("heldout_loss_change") is not None]


def forgetting_scatter(ax, points, by_facts: bool = False) -> None:
    """EM against forgetting, a point per route: up is more knowledge out as answers; right is more general text
    forgotten (held-out loss above the base's), or with `by_facts` more of the base's known facts kept. The legend
    says both measures (a legend, not labels: routes that forget alike sit on one another)."""
    for (model, em, (low, high), loss, retained), colour in zip(points, distinct_colours(len(points))):
        if by_facts and retained is None:
            continue
        kept = "" if retained is None else f", {retained:.0f}% facts kept"
        ax.errorbar([retained if by_facts else loss], [em], yerr=[[em - low], [high - em]], fmt="o", color=colour,
                    capsize=3, label=f"{model}: loss {loss:+.1f}%{kept}")
    ax.axvline(100 if by_facts else 0, color="grey", linewidth=0.6)
    ax.legend(fontsize=7)
    ax.set(xlabel="of the real-world facts the base knew, still right (%)" if by_facts
           else "held-out loss against the base's (%): what general text it forgot", ylabel="EM (%), 95 % interval",
           title="Knowledge gained against the base's facts kept" if by_facts
           else "Knowledge gained against what was forgotten")


def knowledge_bars(ax, rows: list[dict]) -> None:
    """A group of bars per model: EM per dataset (and on average, if there are several) with its 95 % interval,
    then the knowledge probe in unseen and in seen wording, where the report has them."""
    import numpy as np
    from stages.report import em_intervals
    models = list(dict.fromkeys(r["model"] for r in rows))
    datasets = [d for d in dict.fromkeys(r["dataset"] for r in rows if r["em"] is not None) if d != "average"]
    intervals = em_intervals(rows)

    def value(model, key, dataset=None):
        return next((r[key] for r in rows if r["model"] == model and dataset in (None, r["dataset"])), None)
    series = []  # (label, heights, (below, above) or None)
    for dataset in datasets + (["average"] if len(datasets) > 1 else []):
        ems = [value(m, "em", dataset) for m in models]
        spans = [intervals.get((m, dataset)) for m in models]
        error = None if None in spans else np.array([[e - lo, hi - e] for e, (lo, hi) in zip(ems, spans)]).T
        series.append((f"EM {dataset}", ems, error))
    for key, label in (("probe_em", "probe, unseen wording"), ("probe_seen_em", "probe, seen wording")):
        probes = [value(m, key) for m in models]
        if any(p is not None for p in probes):
            series.append((label, probes, None))
    width = 0.8 / max(len(series), 1)
    for i, (label, heights, error) in enumerate(series):
        ax.bar(np.arange(len(models)) + i * width, [h or 0 for h in heights], width, label=label, yerr=error,
               capsize=3)
    ax.set_xticks(np.arange(len(models)) + width * (len(series) - 1) / 2, models, rotation=15)
    split = rows[0]["split"] if rows else "validation"
    ax.set(ylabel="% of questions or probes", title=f"What each model knows ({split})")
    if series:
        ax.legend(fontsize=8)


def distinct_colours(n: int) -> list:
    """`n` colours, none repeated: tab10 or tab20 while they last, else evenly spaced hues."""
    import matplotlib.pyplot as plt
    if n <= 20:
        palette = plt.get_cmap("tab10" if n <= 10 else "tab20")
        return [palette(i) for i in range(n)]
    return [plt.get_cmap("hsv")(i / n) for i in range(n)]


def report_png(wh: Warehouse) -> bytes:
    """`report_figure` as PNG bytes."""
    import matplotlib.pyplot as plt
    fig = report_figure(wh)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


def report_markdown(wh: Warehouse) -> str:
    """The report's rows (`stages.report.report_table`) in Markdown with the plot embedded as a data URI (for a
    Prefect artifact)."""
    from stages.report import report_table, rows_to_read
    rows = rows_to_read(report_rows(wh))
    if not rows:
        return "No report rows yet."
    table = report_table(rows, digits=True)
    table = table.select([c for c in table.column_names if table.column(c).null_count < table.num_rows]).to_pydict()

    def fmt(value):
        return "–" if value is None else f"{value:,}" if isinstance(value, int) else f"{value:g}" \
            if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(table) + " |", "|" + "---|" * len(table)]
    lines += ["| " + " | ".join(map(fmt, values)) + " |" for values in zip(*table.values())]
    image = base64.b64encode(report_png(wh)).decode("ascii")
    return (f"# NKB report ({rows[0]['split']}, run {rows[0]['run_id']})\n\n" + "\n".join(lines)
            + "\n\nEM in %; probe: cloze prompts before fine-tuning, in wordings the injection corpus does not use."
            + f"\n\n![loss curves, EM and probes per model](data:image/png;base64,{image})\n")
