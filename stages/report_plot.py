"""The report as a picture and as Markdown: training loss curves beside EM per model and dataset."""

from __future__ import annotations

import base64
import io

from stages.report import report_rows
from warehouse import Warehouse, query

# Latest successful run per (stage, model) of the training stages, with its loss curve.
CURVES_SQL = """
WITH latest AS (
    SELECT run_id, stage,
           coalesce(json_extract_string(config, '$.name'),
                    json_extract_string(config, '$.model') || '.qa',
                    json_extract_string(config, '$.base_model') || '+' || json_extract_string(config, '$.variant'))
               AS model
    FROM runs WHERE status = 'success' AND stage IN ('base-model', 'inject', 'finetune')
    QUALIFY row_number() OVER (PARTITION BY stage, model ORDER BY finished_at DESC) = 1)
SELECT l.stage, l.model, m.step, m.value
FROM metrics AS m JOIN latest AS l USING (run_id)
WHERE m.step IS NOT NULL AND m.metric LIKE '%loss'
ORDER BY l.stage, l.model, m.step
"""


def report_png(wh: Warehouse) -> bytes:
    """Loss curves (left) and validation EM per model and dataset (right), as PNG bytes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    curves = query(wh, CURVES_SQL).to_pylist()
    rows = [r for r in report_rows(wh) if r["em"] is not None]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    series: dict[tuple[str, str], tuple[list, list]] = {}
    for c in curves:
        steps, values = series.setdefault((c["stage"], c["model"]), ([], []))
        steps.append(c["step"])
        values.append(c["value"])
    for (stage, model), (steps, values) in series.items():
        left.plot(steps, values, label=f"{stage}: {model}", linewidth=1)
    left.set(xlabel="step", ylabel="training loss", title="Loss curves", yscale="log")
    if series:
        left.legend(fontsize=7)
    models = list(dict.fromkeys(r["model"] for r in rows))
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    width = 0.8 / max(len(datasets), 1)
    for i, dataset in enumerate(datasets):
        ems = [next((r["em"] for r in rows if r["model"] == m and r["dataset"] == dataset), 0) for m in models]
        right.bar(np.arange(len(models)) + i * width, ems, width, label=dataset)
    right.set_xticks(np.arange(len(models)) + width * (len(datasets) - 1) / 2, models, rotation=15)
    split = rows[0]["split"] if rows else "validation"
    right.set(ylabel="exact match (%)", title=f"EM per model ({split})")
    if datasets:
        right.legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


def report_markdown(wh: Warehouse) -> str:
    """The report table in Markdown with the plot embedded as a data URI (for a Prefect artifact)."""
    rows = report_rows(wh)
    if not rows:
        return "No report rows yet."
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    models = list(dict.fromkeys(r["model"] for r in rows))

    def fmt(value, digits=1):
        return "–" if value is None else f"{value:.{digits}f}"

    head = ["model"] + [f"EM {d}" for d in datasets] + ["probe EM", "probe EM (seen wording)", "held-out loss",
                                                        "params", "params injected"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in models:
        mine = [r for r in rows if r["model"] == m]
        first = mine[0]
        ems = [fmt(next((r["em"] for r in mine if r["dataset"] == d), None)) for d in datasets]
        lines.append("| " + " | ".join([m] + ems + [fmt(first["probe_em"]), fmt(first.get("probe_seen_em")),
                                                    fmt(first["heldout_loss"], 4), f"{first['params_total']:,}",
                                                    f"{first['params_injected']:,}"]) + " |")
    image = base64.b64encode(report_png(wh)).decode("ascii")
    return (f"# NKB report ({rows[0]['split']}, run {rows[0]['run_id']})\n\n" + "\n".join(lines)
            + "\n\nEM in %; probe: cloze prompts before fine-tuning, in wordings the injection corpus does not use."
            + f"\n\n![loss curves and EM per model](data:image/png;base64,{image})\n")
