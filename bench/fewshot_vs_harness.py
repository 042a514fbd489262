"""Few-shot QA EM side by side with EleutherAI's lm-evaluation-harness, on the same model, questions and examples.

Our side is the evaluate stage itself (`shots: K`, each question its own draw of examples) on a warehouse's model.
The harness (`lm-eval`, a dev dependency) runs its own `nq_open` task, as installed, pointed at local files: its
prompt, stop strings, answer filter, exact-match settings and default few-shot sampler are the task's own; only the
data source changes (the warehouse's train and asked questions, in the order our stage reads them) and its few-shot
seed is our `shots_seed`, so that both draw the same examples for every question (the prompts, and their tokens as
each side encodes them, are compared one by one). The model is the same object in memory (the harness's `HFLM`
wraps it), NKB slots included.

    python -m bench.fewshot_vs_harness --home WAREHOUSE --model base+nkb [--shots 5] [--split validation] [--limit 200] \
        [--record]

Prints both EMs, the agreement question by question and the first disagreements (of verdict, and of answer text),
and records `metrics` rows in the benchmark warehouse (`bench/results/fewshot` unless --results).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.recorded import ROOT, Records, kind_title, page_head, record_if_asked, record_option, run_line, this_cpu

RECORDS = Records("fewshot_vs_harness")
PAGE = ROOT / "docs" / "fewshot-parity.md"
WHAT = "few-shot QA beside lm-evaluation-harness"
kind_of = this_cpu
UNRECORDED = ("disagreements", "other_answers", "harness_prompt")  # the dataset's text and answers to it


def harness_task(folder: Path, name: str, train: list[dict], questions: list[dict]) -> None:
    """The installed `nq_open` task's settings, pointed at JSONL files in `folder`."""
    import lm_eval
    task = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks" / "nq_open" / "nq_open.yaml").read_text())
    for split, rows in (("train", train), ("validation", questions)):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    task |= {"task": name, "dataset_path": "json",
             "dataset_kwargs": {"data_files": {s: str(folder / f"{s}.jsonl") for s in ("train", "validation")}}}
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(task, sort_keys=False))


def harness_em(model, tokenizer, train: list[dict], questions: list[dict], shots: int, seed: int,
               batch_size: int) -> dict:
    """The harness's per-question exact match, answer, prompt and the prompt's tokens as the harness encodes it."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    with tempfile.TemporaryDirectory() as tmp:
        harness_task(Path(tmp), "nkb_nq_open", train, questions)
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, add_bos_token=True)
        out = simple_evaluate(model=lm, tasks=["nkb_nq_open"], num_fewshot=shots, log_samples=True,
                              task_manager=TaskManager(include_path=tmp), bootstrap_iters=0,
                              fewshot_random_seed=seed)
    samples = sorted(out["samples"]["nkb_nq_open"], key=lambda s: s["doc_id"])
    return {"em": [float(s["exact_match"]) for s in samples],
            "answers": [s["filtered_resps"][0] for s in samples],
            "prompts": [s["arguments"][0][0] for s in samples],
            "tokens": [lm.tok_encode(s["arguments"][0][0]) for s in samples]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", required=True, help="warehouse holding the model and the questions")
    parser.add_argument("--model", default="base", help="a decoder-only model of that warehouse, by name")
    parser.add_argument("--shots", type=int, default=5, help="solved examples in each prompt")
    parser.add_argument("--split", default="validation", help="split asked")
    parser.add_argument("--dataset", default=None, help="dataset asked (default: the split's only one)")
    parser.add_argument("--limit", type=int, default=None, help="ask only the first N questions")
    parser.add_argument("--batch-size", type=int, default=16, help="questions per generation batch, both sides")
    parser.add_argument("--results", default="bench/results/fewshot", help="benchmark warehouse for the figures")
    record_option(parser)
    args = parser.parse_args(argv)

    import pyarrow.compute as pc

    from nkb_model.causal import encode_prompts
    from nkb_model.checkpoint import load_model
    from nkb_model.fewshot import plain_question
    from stages.configs import EvaluateConfig
    from stages.evaluation import evaluate
    from stages.inputs import fewshot_prompts, read_questions
    from stages.models import find_model
    from warehouse import Warehouse, run_stage

    wh = Warehouse(args.home)
    asked = read_questions(wh, [args.dataset] if args.dataset else None, args.split)
    datasets = sorted(set(asked.column("dataset").to_pylist()))
    if len(datasets) != 1:
        parser.error(f"the split holds datasets {datasets}: choose one with --dataset")
    if args.limit:
        asked = asked.slice(0, args.limit)
    config = EvaluateConfig(model=args.model, shots=args.shots, split=args.split, datasets=datasets,
                            batch_size=args.batch_size)
    seed = config.shots_seed
    prompts = fewshot_prompts(wh, asked, config.asking)

    started = time.perf_counter()
    ours = evaluate(wh, config, force=True)
    ours_s = time.perf_counter() - started
    predictions = wh.read("predictions", ["question_id", "prediction", "exact_match"],
                          partitions=[f"{ours.run.config['model_name']}.{args.split}"])
    evaluated = predictions.num_rows  # the stage asks its whole split; --limit compares the first N of it
    wanted = pc.is_in(predictions.column("question_id"), asked.column("question_id"))
    predictions = predictions.filter(wanted).sort_by("question_id")

    model, tokenizer, _ = load_model(find_model(wh, args.model))
    # NQ-open's questions carry no question mark (the harness's template adds one); a sample-world question that
    # does is given without it, so that both prompts end `…?` once, as ours does.
    def rows(table):
        return [{"question": plain_question(q), "answer": a}
                for q, a in zip(table.column("question").to_pylist(), table.column("answers").to_pylist())]
    questions, train = rows(asked), rows(read_questions(wh, datasets, "train"))
    started = time.perf_counter()
    theirs = harness_em(model.eval(), tokenizer, train, questions, args.shots, seed, args.batch_size)
    theirs_s = time.perf_counter() - started

    mine = [float(x) for x in predictions.column("exact_match").to_pylist()]
    answers = predictions.column("prediction").to_pylist()
    differ = [i for i, (a, b) in enumerate(zip(mine, theirs["em"])) if a != b]
    result = {"model": args.model, "shots": args.shots, "questions": len(mine), "dataset": datasets[0],
              "em_ours": round(100 * sum(mine) / len(mine), 2),
              "em_harness": round(100 * sum(theirs["em"]) / len(theirs["em"]), 2),
              "same_answer": sum(a.strip() == b.strip() for a, b in zip(answers, theirs["answers"])),
              "same_em": len(mine) - len(differ),
              "same_prompt": sum(a == b for a, b in zip(prompts, theirs["prompts"])),
              "same_tokens": sum(a == b for a, b in zip(encode_prompts(tokenizer, prompts), theirs["tokens"])),
              "seconds_ours": round(ours_s, 1), "questions_ours": evaluated,
              "seconds_harness": round(theirs_s, 1),
              "disagreements": [{"question": questions[i]["question"], "ours": answers[i],
                                 "harness": theirs["answers"][i], "gold": questions[i]["answer"]}
                                for i in differ[:5]],
              "other_answers": [{"ours": a, "harness": b} for a, b in zip(answers, theirs["answers"])
                                if a.strip() != b.strip()][:5],
              "harness_prompt": theirs["prompts"][0]}
    result["em_difference"] = round(result["em_ours"] - result["em_harness"], 2)
    print(json.dumps(result, indent=1, ensure_ascii=False))

    def body(run):
        for key in ("em_ours", "em_harness", "em_difference", "same_answer", "same_em", "same_prompt", "same_tokens",
                    "seconds_ours", "seconds_harness"):
            run.metric(f"bench.fewshot_vs_harness.{key}", result[key], dataset=datasets[0], split=args.split)
    config = {"model": args.model, "shots": args.shots, "split": args.split, "limit": args.limit, "home": args.home}
    run_stage(Warehouse(args.results), "bench-fewshot", config, "bench", body, force=True)
    record_if_asked(args, __name__, result, argv)
    return 0


def label(result: dict) -> str:
    return f"{result['model']}, {result['dataset']}, {result['questions']} questions, {result['shots']} shots"


def headline(record: dict) -> str:
    runs = [run["result"] for run in record["runs"].values()]
    return (f"the same verdict on {sum(r['same_em'] for r in runs):,} of {sum(r['questions'] for r in runs):,} "
            f"questions, the same prompt tokens on {sum(r['same_tokens'] for r in runs):,} "
            f"({', '.join(record['runs'])})")


def per_100(seconds: float, questions: int) -> str:
    return f"{100 * seconds / questions:.1f}"


def page(records: list[dict]) -> str:
    lines = page_head("Few-shot QA beside lm-evaluation-harness", RECORDS.name,
                      "Our evaluate stage and EleutherAI's lm-evaluation-harness (its installed `nq_open` task: its "
                      "prompt, stop strings, answer filter, exact match and few-shot sampler, pointed at local files "
                      "holding the same questions in our order, its few-shot seed our `shots_seed`), given the same "
                      "model object, batch 16 on both sides; the prompts and their tokens compared one by one. Our "
                      "stage asks its whole split (the time per question compares); the verdicts are the first N "
                      "questions' (`--limit`). Remade "
                      "by `python -m bench.fewshot_vs_harness --home WAREHOUSE --model MODEL --record`.")
    for record in records:
        lines += [f"## {kind_title(record['machine'])}", "",
                  "| model, dataset, questions, shots | EM ours / harness | same verdict | same prompt / tokens | "
                  "same answer text | seconds per 100 questions, ours / harness | commit, date |",
                  "|---|---|---|---|---|---|---|"]
        for name, run in record["runs"].items():
            r = run["result"]
            lines.append(f"| {name} | {r['em_ours']:.2f} / {r['em_harness']:.2f} | **{r['same_em']} of "
                         f"{r['questions']}** | {r['same_prompt']} / {r['same_tokens']} | {r['same_answer']} | "
                         f"{per_100(r['seconds_ours'], r.get('questions_ours', r['questions']))} / "
                         f"{per_100(r['seconds_harness'], r['questions'])} | {run['commit']}, {run['date']} |")
        lines += [""] + [f"- {name}: {run_line(run)}" for name, run in record["runs"].items()] + [""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
