"""The evaluate stage: a model's answers to a split's questions scored by exact match, or its outputs on a
general-generation task scored by ROUGE-L or SacreBLEU. A decoder-only LM can be asked few-shot instead of fine-tuned
(`shots`), as such models are evaluated."""

from __future__ import annotations

import time

from stages import reads
from stages.configs import EvaluateConfig
from stages.inputs import asked_in_prompt, gen_examples, gen_inputs, model_inputs, read_questions, retrieval_mode
from stages.models import model_lineage, source_model
from stages.names import answers_name
from warehouse import StagedRun, StageResult, Warehouse


def evaluate(wh: Warehouse, config: EvaluateConfig, force: bool = False) -> StageResult:
    """QA: greedy answers for every question of the split, EM (SQuAD normalisation, max over gold answers);
    with `shots`, each question after K solved ones of its dataset's train split. A generation task: beam search,
    ROUGE-L (summarisation) or SacreBLEU (translation)."""
    from nkb_model.train import choose_device
    source = source_model(wh, config.model)
    task = config.task or source.info.get("task")
    if config.shots and task:
        raise ValueError(f"evaluate: shots ({config.shots}) asks questions few-shot; {config.model} is evaluated on "
                         f"the generation task {task!r}")
    name = answers_name(source.name, config.shots, config.documents)
    if task:
        examples, groups = gen_examples(wh, task, config.split), [task]
        data = [reads.task_examples(wh, task, config.split)]
    else:
        examples = read_questions(wh, config.datasets, config.split)
        groups = sorted(set(examples.column("dataset").to_pylist()))
        data = [reads.questions(wh, groups, config.split),
                reads.retrievals(wh, groups) if retrieval_mode(source.info) != "none" or config.documents
                else reads.NOTHING,
                reads.questions(wh, groups, "train") if config.shots else reads.NOTHING]
    declared = reads.Declared("evaluate", config, [reads.model(source), *data], identity={"task": task},
                        record=config.model_dump() | {"model_name": name, "task": task})
    device = choose_device(config.device, config.precision)
    return declared.run(wh, lambda run: _evaluate(run, wh, config, source, examples, groups, task, name, device),
                        force=force, device=device.name)


def _evaluate(run: StagedRun, wh: Warehouse, config: EvaluateConfig, source, examples, groups: list[str],
              task: str | None, name: str, device) -> dict:
    started = time.perf_counter()
    model, tokenizer, info = source.load(device)
    outputs = model_outputs(wh, examples, model, tokenizer, info, config, task, device)
    ids, ds, correct, scores = (generation_scores(examples, outputs, task) if task
                                else qa_scores(examples, outputs, groups))
    for key, score in scores.items():  # a task's metric, or a dataset's EM
        metric, dataset = (key, task) if task else ("em", key)
        run.metric(metric, score, dataset=dataset, split=config.split)
    if source.directory.is_relative_to(wh.files_dir):  # this warehouse's model: its card gets the scores
        em = ("em" + (f" {config.shots}-shot" if config.shots else "")
              + (f", {config.documents} documents" if config.documents else ""))
        card = model_card_with(wh, info, {(task, config.split, k) if task else (k, config.split, em): v
                                          for k, v in scores.items()})
        run.publish_file(source.directory / "README.md", lambda path: path.write_text(card))
    run.write("predictions", f"{name}.{config.split}", {
        "model": [name] * len(ids), "question_id": ids, "dataset": ds, "split": [config.split] * len(ds), "prediction": outputs,
        "exact_match": correct})
    return {"model": name, "questions": len(outputs),
            ("scores" if task else "em"): {k: round(v, 2) for k, v in scores.items()}, "seconds": time.perf_counter() - started, "device": device.name}


def model_outputs(wh: Warehouse, examples, model, tokenizer, info: dict, config: EvaluateConfig, task: str | None,
                  device) -> list[str]:
    """What `model` answers to each example as evaluate asks it: greedy for questions (each few-shot answer cut at
    its line), beam search for a generation task. `info`: the model's, whose prompt format and input length apply."""
    from nkb_model.families import generate
    from nkb_model.fewshot import answer_of
    texts, knowledge_ids = ((gen_inputs(examples), None) if task
                            else model_inputs(wh, examples, model, tokenizer, info, config.asking))
    prompted = not task and asked_in_prompt(info, config.shots)
    outputs = generate(model, tokenizer, texts, device, config.batch_size,
                       None if prompted else info.get("max_input_len", 256),
                       config.max_new_tokens or (64 if task else 24), config.num_beams or (4 if task else 1),
                       knowledge_ids)
    return [answer_of(o) for o in outputs] if prompted else outputs


def generation_scores(examples, outputs: list[str], task: str):
    """(example ids, datasets, exact matches, {metric: score}) of a generation task's outputs: ROUGE-L for
    summaries, SacreBLEU for translations."""
    from nkb_model.metrics import bleu, rouge_l
    references = examples.column("target").to_pylist()
    correct = [p.strip() == r.strip() for p, r in zip(outputs, references)]
    summaries = examples.column("kind")[0].as_py() == "summarization"
    score = {"rougeL": rouge_l(outputs, references)} if summaries else {"bleu": bleu(outputs, references)}
    return examples.column("example_id").to_pylist(), [task] * examples.num_rows, correct, score


def qa_scores(examples, outputs: list[str], datasets: list[str]):
    """(question ids, datasets, exact matches, {dataset: EM in %}) of answers to the questions."""
    from nkb_model.metrics import exact_match
    ds = examples.column("dataset").to_pylist()
    correct = [exact_match(p, g) for p, g in zip(outputs, examples.column("answers").to_pylist())]
    scores = {}
    for dataset in datasets:
        hits = [c for c, d in zip(correct, ds) if d == dataset]
        scores[dataset] = 100.0 * sum(hits) / len(hits)
    return examples.column("question_id").to_pylist(), ds, correct, scores


def model_card_with(wh: Warehouse, info: dict, new_scores: dict) -> str:
    """The model's card with its new scores ({(dataset, split, metric): score})."""
    from stages.model_card import model_card
    return model_card(wh, info, model_lineage(wh, info), new_scores=new_scores)
