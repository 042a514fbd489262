"""A model folder's README.md: what the model is, its base, how to prompt it, how it was built, its scores."""

from __future__ import annotations

from nkb_model.architectures import DEFAULT_ARCH, architecture
from nkb_model.families import family_of, qa_pair
from nkb_model.methods import of_kind
from stages.inputs import retrieval_mode
from warehouse import RunRecord, Warehouse, list_runs, run_metrics

EXAMPLE_QUESTION = "who wrote the origin of species?"
METRICS = {"em": "exact match, %", "rougeL": "ROUGE-L F1, %", "bleu": "SacreBLEU"}


def model_card(wh: Warehouse, info: dict, runs: list[RunRecord], exported: bool = False, adapter: bool = False,
               new_scores: dict[tuple[str, str, str], float] | None = None) -> str:
    """The card of a model described by `info` and built by `runs` (`stages.models.model_lineage`);
    `new_scores` {(dataset, split, metric): score} are those of an evaluation not yet recorded."""
    lines = _what_it_is(info, exported) + _prompt_format(info) + _loading(info, exported, adapter)
    if runs:
        lines += ["## How it was built", "", "| run | stage | settings |", "|---|---|---|"]
        lines += [f"| `{r.run_id}` | {r.stage} | {_settings(r.config)} |" for r in runs] + [""]
    scores = _scores(wh, info["name"]) | (new_scores or {})
    if scores:
        lines += ["## Scores", "", "| dataset | split | metric | score |", "|---|---|---|---|"]
        lines += [f"| {d} | {s} | {METRICS.get(m, m)} | {v:.1f} |" for (d, s, m), v in sorted(scores.items())] + [""]
    return "\n".join(lines)


def _what_it_is(info: dict, exported: bool) -> list[str]:
    """The card's title and first lines: the kind of model, its slots, its base and where it came from."""
    name, kind = info["name"], info.get("kind", "base")
    family = architecture(info.get("arch", DEFAULT_ARCH)).title
    what = {"base": f"a {family} base", **{m.name: f"a {family} with {m.summary}" for m in of_kind("inject")},
            "finetuned": f"a closed-book QA model fine-tuned from `{info.get('source')}`",
            "edited": f"`{info.get('source')}` with knowledge edited in its NKB slots"}.get(kind, kind)
    lines = [f"# {name}", "", f"{what[0].upper()}{what[1:]}, built by nkb-pipeline.", ""]
    if info.get("layers"):
        lines += [f"- NKB slots: {info.get('slots')} in each of {', '.join(info['layers'])}"
                  + (" (merged into the feed-forward layers as extra neurons: the FFN width grows by the slot count)"
                     if exported else ""), ""]
    if info.get("base_model"):
        lines += [f"- base: `{info['base_model']}`", ""]
    if kind == "base" and info.get("source"):
        original = info.get("original", {})
        lines += [f"- brought in from `{info['source']}`"
                  + (f" (GGUF, {original.get('quantization', 'quantised')}, dequantised; SHA-256 "
                     f"{info.get('source_sha256', '?')[:16]}…)" if info.get("source_format") == "gguf" else "")]
        lines += [f"- original: {original['name']}" + (f" by {original['organization']}"
                                                       if original.get("organization") else "")] \
            if original.get("name") else []
        lines += [f"- license: {original.get('license', 'see the original model')}", ""]
    return lines


def _prompt_format(info: dict) -> list[str]:
    """How to ask the model: its task's form, the question's form it was fine-tuned on, or its family's."""
    lines = ["## Prompt format", ""]
    if info.get("task"):
        return lines + [f"Fine-tuned on the `{info['task']}` task: input a source text of that task, output its "
                        "target.", ""]
    if info.get("kind", "base") in ("finetuned", "edited"):
        text, answer = qa_pair(EXAMPLE_QUESTION, "Charles Darwin", info.get("answer_format", "plain"))
        return lines + [f"Input `{text}`, output `{answer}`"
                        + (" (the answer between the two sentinels)" if "<extra_id_1>" in answer else "") + "."
                        + (f" The question is followed by its top {info.get('knowledge_docs')} retrieved documents "
                           f"({info['knowledge']})." if retrieval_mode(info) != "none" else ""), ""]
    return lines + [family_of(info.get("arch", DEFAULT_ARCH)).prompt_format, ""]


def _loading(info: dict, exported: bool, adapter: bool) -> list[str]:
    """How to load the model: with stock transformers, or with nkb-pipeline's loader (which mounts the slots)."""
    name, kind = info["name"], info.get("kind", "base")
    lines = ["## Loading", "", "```python"]
    if exported or (kind == "base" and not adapter):
        auto = family_of(info.get("arch", DEFAULT_ARCH)).auto_class().__name__
        lines += [f"from transformers import {auto}, AutoTokenizer",
                  f'model = {auto}.from_pretrained("path/to/this/folder")',
                  'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")']
    else:
        lines += ["from nkb_model.checkpoint import load_model  # nkb-pipeline's loader: mounts the slots",
                  'model, tokenizer, info = load_model("path/to/this/folder")']
    lines += ["```", ""]
    if not exported and kind != "base":
        lines += [f"`nkb export {name} FOLDER` writes it as a folder that stock `transformers` loads, the slots "
                  "merged into the feed-forward layers.", ""]
    return lines


def _settings(config: dict) -> str:
    if config.get("source") and "pretrain_corpus" in config:  # a base brought in: no pretraining settings were used
        return f"name={config.get('name')}, source={config['source']}"
    keys = ("name", "model", "base_model", "corpus", "steps", "epochs", "batch_size", "lr", "layers", "slots",
            "datasets", "size")
    return ", ".join(f"{k}={config[k]}" for k in keys if config.get(k) not in (None, [], ""))


def _scores(wh: Warehouse, name: str) -> dict[tuple[str, str, str], float]:
    """{(dataset, split, metric): score} of the newest evaluation of the model on each split."""
    scores: dict[tuple[str, str, str], float] = {}
    for run in list_runs(wh, stage="evaluate"):
        if run.status == "success" and run.config.get("model_name") == name:
            for row in run_metrics(wh, run.run_id):
                if row["metric"] in METRICS:
                    scores.setdefault((row["dataset"], row["split"], row["metric"]), row["value"])
    return scores
