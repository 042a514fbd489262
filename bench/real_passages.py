"""Real Wikipedia passages and the NQ-open questions they answer, as an experiment: the demo's template on real text.

The source is `qa_data/nq-open-oracle.jsonl.gz` of nelson-liu/lost-in-the-middle (2,655 NQ-open questions, each
with the Wikipedia passage NQ's annotators marked as holding its answer: `{question, answers, ctxs: [{title, text,
hasanswer, isgold}], nq_annotated_gold}`). Of the questions whose passage holds an answer, a seeded draw of
`--questions` is split into train and validation; their passages are the knowledge (each once), and passages of
other questions are the general text (the held-out loss). The experiment file keeps every setting of the demo's
(`experiments/sample-world-smollm2.yaml`) but its data, the injection's steps (`REAL_STEPS` for ~600 passages, in
proportion for other draws) and the settings measured on real text, which it takes from the template for a real
corpus (`experiments/example-causal-lm.yaml`, `REAL_TEXT_SETTINGS`).

    python -m bench.real_passages nq-open-oracle.jsonl.gz --out real-nq
    nkb --home real-nq/.nkb pipeline real-nq/real-nq-smollm2.yaml
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import yaml

from bench.recorded import ROOT, Records, dagger, kind_title, page_head, run_line, transcribed_lines
from corpus.files import iter_jsonl
from stages.experiment import SAMPLE_WORLD_SMOLLM2

EXPERIMENT = "real-nq-smollm2.yaml"
REAL_CORPUS_TEMPLATE = SAMPLE_WORLD_SMOLLM2.with_name("example-causal-lm.yaml")
# The injection's settings whose best differs between the sample world and real passages (docs/decisions.md): these
# runs are where the template's values were measured, so they are read from it, not written twice.
REAL_TEXT_SETTINGS = ("qa_share", "qa_eos", "own_text_weight")


def read_oracle(path: Path) -> list[dict]:
    """The file's questions with their gold passage: {question, answers, title, text, hasanswer}; ValueError naming
    the line at fault."""
    rows = []
    for number, record in iter_jsonl(path):
        try:
            gold = record["ctxs"][0]
            rows.append({"question": record["question"], "answers": record["answers"], "title": gold["title"],
                         "text": gold["text"], "hasanswer": bool(gold.get("hasanswer", True))})
        except (KeyError, IndexError, TypeError) as exc:
            raise ValueError(f"{path}, line {number}: not a question with its passage "
                             f"(question, answers, ctxs[0].title/text): missing {exc}") from None
    return rows


def split(rows: list[dict], questions: int, validation: int, general: int, seed: int) -> dict[str, list[dict]]:
    """train / validation questions, their passages (each once) and other questions' passages as general text."""
    answerable = [r for r in rows if r["hasanswer"]]
    if questions > len(answerable) or validation >= questions:
        raise ValueError(f"{questions} questions ({validation} of them validation) asked of {len(answerable)} "
                         "whose passage holds an answer")
    random.Random(seed).shuffle(answerable)
    chosen = answerable[:questions]
    passages = dict.fromkeys((r["title"], r["text"]) for r in chosen)  # each once, in draw order
    others = [p for p in dict.fromkeys((r["title"], r["text"]) for r in answerable[questions:]) if p not in passages]
    return {"train": chosen[:questions - validation], "validation": chosen[questions - validation:],
            "passages": documents("p", passages), "general": documents("g", others[:general])}


def documents(prefix: str, passages) -> list[dict]:
    """(title, text) pairs as JSONL corpus rows {id, title, text}."""
    return [{"id": f"{prefix}{i}", "title": title, "text": text} for i, (title, text) in enumerate(passages)]


# The injection's steps on the real passages: those of docs/results.md's runs, 1,800 for the default draw's ~600
# passages. The demo's own (1,400) are nine passes over its smaller world's segments; 600 passages at 1,800 steps
# were already memorised without answers. A larger draw gets steps in proportion (`steps_for`), so the passes over
# the passages stay those measured (docs/results.md, real passages).
REAL_STEPS = 1800
REAL_STEPS_PASSAGES = 600


def steps_for(passages: int) -> int:
    """`REAL_STEPS` scaled to a draw's passages, in hundreds."""
    return max(100, int(round(REAL_STEPS * passages / REAL_STEPS_PASSAGES, -2)))


def experiment(template: Path, steps: int, name: str = "real-nq-smollm2", corpus: str = "nqwiki",
               dataset: str = "nq", knowledge: str = "passages.jsonl") -> dict:
    """The demo's experiment with the files written beside it in place of the sample world's (the knowledge file,
    general.jsonl, train.jsonl and validation.jsonl), at `steps`, with the real-corpus template's
    `REAL_TEXT_SETTINGS`."""
    config = yaml.safe_load(template.read_text())
    for key in ("sample_world", "probes"):
        config.pop(key, None)
    real_text = yaml.safe_load(REAL_CORPUS_TEMPLATE.read_text())["stages"]["inject"]
    inject = config.setdefault("stages", {}).setdefault("inject", {})
    inject.update({key: real_text[key] for key in REAL_TEXT_SETTINGS}, steps=steps)
    return {**config, "name": name,
            "knowledge": [{"path": knowledge, "corpus": corpus}],
            "general": [{"path": "general.jsonl", "corpus": "general"}],
            "questions": [{"path": f"{s}.jsonl", "format": "jsonl", "dataset": dataset, "split": s}
                          for s in ("train", "validation")]}


def write(out: Path, parts: dict[str, list[dict]], template: Path, steps: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in ("passages", "general"):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(p) + "\n" for p in parts[name]))
    for name in ("train", "validation"):
        (out / f"{name}.jsonl").write_text("".join(
            json.dumps({"id": f"{name}-{n}", "question": r["question"], "answers": r["answers"]}) + "\n"
            for n, r in enumerate(parts[name])))
    (out / EXPERIMENT).write_text(f"# Written by python -m bench.real_passages: {template.name}'s settings, real data\n"
                                  + yaml.safe_dump(experiment(template, steps), sort_keys=False))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("oracle", type=Path, help="lost-in-the-middle's qa_data/nq-open-oracle.jsonl.gz")
    parser.add_argument("--out", type=Path, required=True, help="folder for the data and the experiment file")
    parser.add_argument("--questions", type=int, default=600, help="questions drawn (train and validation)")
    parser.add_argument("--validation", type=int, default=200, help="of them, the validation split")
    parser.add_argument("--general", type=int, default=300, help="other questions' passages as general text")
    parser.add_argument("--seed", type=int, default=0, help="the draw's seed")
    parser.add_argument("--steps", type=int,
                        help=f"the injection's steps (default: {REAL_STEPS} for {REAL_STEPS_PASSAGES} passages, "
                             "in proportion to the draw's)")
    parser.add_argument("--template", type=Path, default=SAMPLE_WORLD_SMOLLM2,
                        help="the experiment whose settings it keeps (the real-text ones apart)")
    args = parser.parse_args(argv)
    try:
        parts = split(read_oracle(args.oracle), args.questions, args.validation, args.general, args.seed)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    steps = args.steps or steps_for(len(parts["passages"]))
    write(args.out, parts, args.template, steps)
    print(f"{len(parts['train'])} train and {len(parts['validation'])} validation questions, "
          f"{len(parts['passages'])} passages, {len(parts['general'])} general passages, {steps} steps: "
          f"nkb --home {args.out}/.nkb pipeline {args.out / EXPERIMENT}")
    return 0


RECORDS = Records("real-passages")
PAGE = ROOT / "docs" / "real-passages.md"
WHAT = "NQ-open questions and the Wikipedia passages that answer them"


def figure(value: float) -> str:
    """A figure as measured: one decimal, or two where a mean of two seeds has them."""
    return f"{value:.1f}" if round(value, 1) == value else f"{value:.2f}"


def seeds_cell(row: dict, key: str, form=figure) -> str:
    """Each seed's figure, then their mean with its 95 % interval over the questions where one was measured."""
    values = row.get(key)
    if not values:
        return ""
    cell = ", ".join(map(form, values))
    mean = row.get(f"{key}_mean")
    interval = f" ({figure(mean[1])}-{figure(mean[2])})" if mean else ""
    return cell + (f": **{figure(mean[0])}**{interval}" if mean and len(values) > 1 else interval)


def headline(record: dict) -> str:
    run = next(iter(record["runs"].values()))
    rows = run["result"]["rows"]
    nkb, base = rows["base+NKB"], rows["base"]
    return (f"base+NKB {nkb['em_5shot_mean'][0]:.1f} 5-shot over {len(nkb['em_5shot'])} seeds against the base's "
            f"{base['em_5shot'][0]:.1f}, a lead of {nkb['lead'][0]:.1f} ({nkb['lead'][1]:.1f}-{nkb['lead'][2]:.1f}) "
            f"({run['commit']})")


def page(records: list[dict]) -> str:
    lines = page_head("Real passages: NQ-open questions and the Wikipedia passages that answer them", RECORDS.name,
                      "`python -m bench.real_passages nq-open-oracle.jsonl.gz --out real-nq` writes NQ-open questions "
                      "and the Wikipedia passages NQ's annotators marked as holding their answers (lost-in-the-middle's "
                      "file), with an experiment of the demo's settings but those measured on real text (taken from "
                      "`experiments/example-causal-lm.yaml`); `nkb --home real-nq/.nkb pipeline "
                      "real-nq/real-nq-smollm2.yaml` runs it, each route and seed by `python -m bench.levers "
                      "--experiment real-nq/real-nq-smollm2.yaml --row ROUTE --set stages.inject.seed=N`, and "
                      "`python -m bench.real_passages_table --home real-nq/.nkb --label LABEL --setting TEXT --row "
                      "ROW=MODEL,MODEL ... --record` reads each row's seeds together (means and paired leads over the "
                      "same questions, with 95 % bootstrap intervals) and keeps the table here.")
    for record in records:
        lines += [f"## {kind_title(record['machine'])}", "", *transcribed_lines(record["runs"].values())]
        for name, run in record["runs"].items():
            result = run["result"]
            lines += [f"### {name}", "", f"Measured at {run_line(run)}{dagger(run)}. {result['setting']}", "",
                      "| model | 5-shot EM per seed: mean (95 %) | 0-shot EM | 5-shot lead over the base (95 %) | "
                      f"held-out loss change (base {result['heldout_loss_base']}) | capitals kept of "
                      f"{result['capitals_known']} (routed) | parameters trained | training s |",
                      "|---|---|---|---|---|---|---|---|"]
            for model, row in result["rows"].items():
                lead = f"{figure(row['lead'][0])} ({figure(row['lead'][1])}-{figure(row['lead'][2])})" if row.get("lead") else ""
                routed = f" ({', '.join(map(str, row['capitals_routed']))})" if row.get("capitals_routed") else ""
                lines.append(f"| {model} | {seeds_cell(row, 'em_5shot')} | {seeds_cell(row, 'em_0shot')} | {lead} | "
                             f"{seeds_cell(row, 'heldout_change', lambda v: f'{v:+.1f} %')} | "
                             f"{', '.join(map(str, row['capitals_kept']))}{routed} | {row['params_trained']:,} | "
                             f"{', '.join(f'{s:,}' for s in row.get('train_seconds', []))} |")
            lines += [""] + [f"- {note}" for note in result.get("notes", [])] + [""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
