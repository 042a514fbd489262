"""Reading a stage's inputs from the warehouse: corpus text, questions, generation examples, retrieved
documents, and the lineage strings that stand for them in an inputs fingerprint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nkb_model.families import qa_pair
from warehouse import Warehouse

PRETRAINING = "pretraining"  # the `segments` partition <corpus>.pretraining holds a corpus's pretraining sentences
AUGMENTED = "augmented"  # and <corpus>.augmented the other wordings of its retrieved segments (the augment stage's)
# The stage to run before salient-spans, for segments of each source.
SEGMENTS_BY = {"retrieved": "retrieve", PRETRAINING: "pretraining-data", AUGMENTED: "augment"}


def world_dir(wh: Warehouse) -> Path:
    """Where the sample-world stage writes the sample world's files."""
    return wh.files_dir / "sample-world"


# ---- lineage: what stands for a table's data in a fingerprint --------------------------------------

def corpora(wh: Warehouse) -> list[str]:
    """The corpora of `documents`."""
    return sorted({name for name, _ in wh.lineage("documents")})


def one_corpus(wh: Warehouse, corpus: str | None, field: str = "corpus") -> str:
    """`corpus` when given; else the warehouse's only corpus, or an error that lists them."""
    if corpus:
        return corpus
    found = corpora(wh)
    if len(found) == 1:
        return found[0]
    if not found:
        raise ValueError("no corpus in the warehouse yet; run the ingest stage first")
    raise ValueError(f"the warehouse holds several corpora ({', '.join(found)}): say which with {field}=")


def corpus_lineage(wh: Warehouse, corpus: str) -> str:
    """The inputs fingerprint of the run that ingested `corpus`."""
    found = [fp for name, fp in wh.lineage("documents", corpus) if name == corpus]
    if not found:
        raise ValueError(f"no documents for corpus {corpus!r} (corpora: {', '.join(corpora(wh)) or 'none'}); "
                         "run the ingest stage first")
    return found[0]


def partition_family(wh: Warehouse, table: str, partition: str) -> list[tuple[str, str]]:
    """(name, lineage) of a partition and its shards (`<partition>-00000`, ...)."""
    return [(name, fp) for name, fp in wh.lineage(table, partition)
            if name == partition or name.startswith(partition + "-")]


def span_partitions(wh: Warehouse, corpus: str, source: str = "retrieved") -> tuple[str, list[str]]:
    """The `segments` partition of a corpus's retrieved documents (source=retrieved), pretraining sentences or
    augmented segments, and its `salient_spans` shards. Raises, saying which stages to run, when either is missing."""
    segments = corpus if source == "retrieved" else f"{corpus}.{source}"
    spans = [name for name, _ in partition_family(wh, "salient_spans", segments)]
    if not partition_family(wh, "segments", segments) or not spans:
        first = SEGMENTS_BY[source] + ("" if source == "retrieved" else f" --set corpus={corpus}")
        raise ValueError(f"no salient spans of {corpus!r} ({source}); run the {first} stage, then "
                         f"salient-spans --set corpus={corpus} --set source={source}")
    return segments, spans


# ---- reading ---------------------------------------------------------------------------------------

def corpus_texts(wh: Warehouse, corpus: str) -> list[str]:
    texts = []
    for batch in wh.scan("documents", ["text"], filter=pc.field("corpus") == corpus):
        texts += batch.column("text").to_pylist()
    if not texts:
        raise ValueError(f"corpus {corpus!r} has no documents")
    return texts


def packed_rows(wh: Warehouse, tokenizer, corpus: str, seq_len: int) -> np.ndarray:
    """A corpus's documents tokenized and packed into rows of `seq_len` tokens; the same for pretraining and for
    injection's general text, so that injection can tell the base's held-out rows apart."""
    from nkb_model.base_model import pack
    ids = tokenizer(corpus_texts(wh, corpus), add_special_tokens=False)["input_ids"]
    return pack(ids, seq_len, tokenizer.eos_token_id)


def segments_with_spans(wh: Warehouse, corpus: str, source: str = "retrieved") -> tuple[pa.Table, pa.Table]:
    """(segments with at least one salient span, their spans) of a corpus, for salient span masking."""
    segments, spans = span_partitions(wh, corpus, source)
    found = wh.read("salient_spans", ["segment_id", "start_char", "end_char"], partitions=spans)
    texts = wh.read("segments", ["segment_id", "text"], filter=pc.field("segment_id").isin(
        found.column("segment_id").unique()), partitions=[segments])
    return texts, found


def read_questions(wh: Warehouse, datasets: list[str] | None, split: str) -> pa.Table:
    """The split's questions (of `datasets`, or all), in question_id order."""
    table = wh.read("questions", ["question_id", "dataset", "split", "question", "answers"],
                    filter=pc.field("split") == split)
    if datasets:
        table = table.filter(pc.field("dataset").isin(datasets))
    if table.num_rows == 0:
        raise ValueError(f"no {split!r} questions{' for ' + ', '.join(datasets) if datasets else ''}; "
                         "run the questions stage first")
    return table.sort_by("question_id")


def require_shots(wh: Warehouse, runs: list[tuple[str, object]]) -> None:
    """Refuse runs that ask for more solved examples (`shots`) than a dataset's train split holds, before the first
    of them starts: the draw would fail only when the question is asked, after every model was trained."""
    counts = wh.read("questions", ["dataset", "split"]).group_by(["dataset", "split"]).aggregate([([], "count_all")])
    held = {(d, s): n for d, s, n in zip(*(counts.column(c).to_pylist() for c in ("dataset", "split", "count_all")))}
    for name, config in runs:
        shots = getattr(config, "shots", 0)
        if not shots:
            continue
        asked = getattr(config, "datasets", None) or sorted(d for d, s in held if s == config.split)
        for dataset in asked:
            if held.get((dataset, "train"), 0) < shots:
                raise ValueError(f"{name}: shots={shots} draws {shots} solved examples for each question from "
                                 f"dataset {dataset}'s train split, which holds {held.get((dataset, 'train'), 0)} "
                                 "questions: lower shots (no model was trained)")


def gen_examples(wh: Warehouse, task: str, split: str) -> pa.Table:
    """A general-generation task's split from `gen_examples`, in id order."""
    table = wh.read("gen_examples", filter=(pc.field("task") == task) & (pc.field("split") == split))
    if table.num_rows == 0:
        tasks = sorted({n for n, _ in wh.lineage("gen_examples")})
        raise ValueError(f"no {split!r} examples of task {task!r} (loaded: {', '.join(tasks) or 'none'}); "
                         "run the generation-data stage first")
    return table.sort_by("example_id")


def gen_inputs(table: pa.Table) -> list[str]:
    from corpus.generation_data import model_input
    return [model_input(k, s, a, b) for k, s, a, b in zip(*(table.column(c).to_pylist() for c in
                                                             ("kind", "source", "source_lang", "target_lang")))]


def asked_in_prompt(info: dict, shots: int) -> bool:
    """Whether a model is asked in lm-evaluation-harness's prompt, after `shots` solved questions (none at 0): when
    asked few-shot, and when it is a decoder-only model never fine-tuned on questions (no `answer_format`), which has
    no form of its own to be asked in: the harness's zero-shot."""
    from nkb_model.families import family_of
    never_fine_tuned = "answer_format" not in info and not info.get("task")
    return shots > 0 or (never_fine_tuned and "arch" in info and family_of(info["arch"]).prompted)


def model_inputs(wh: Warehouse, questions: pa.Table, model, tokenizer, info: dict, asking=None):
    """What `model` reads for each question when asked as `asking` (a `stages.configs.Asking`; None: as it was
    fine-tuned): (texts, Kformer's document ids or None). The one place that turns questions into a model's inputs:
    the few-shot prompt (or the harness's zero-shot one for a decoder-only LM never fine-tuned, `asked_in_prompt`),
    else the question in the form the model was fine-tuned on, with its retrieved documents if it was fine-tuned
    with them."""
    from nkb_model.families import family
    if asking is not None and asked_in_prompt(info, asking.shots):
        if asking.shots and not family(model).prompted:
            raise ValueError(f"shots is for decoder-only models; {info.get('name', 'this model')} is an "
                             "encoder-decoder model, which is fine-tuned (finetune) and then asked with shots: 0")
        return fewshot_prompts(wh, questions, asking), None
    if asking is not None and asking.documents:
        raise ValueError(f"documents puts retrieved documents in a prompt; {info.get('name', 'this model')} is "
                         "asked in the form it was fine-tuned on: ask it with shots, or ask a decoder-only base "
                         "never fine-tuned (concat is the fine-tuned route with documents)")
    return qa_inputs(wh, questions, tokenizer, info)


def fewshot_prompts(wh: Warehouse, questions: pa.Table, asking) -> list[str]:
    """Each question after K solved questions of its own dataset's train split, as decoder-only LMs are asked
    (`nkb_model.fewshot`), drawn with `asking.seed` for each question (or once for all), and after its top
    `asking.documents` retrieved documents when it asks for them. A question's draw is the one its place in its
    whole split gets, so a subset of the split (surgery's, analysis's) is asked as evaluate asked it."""
    from nkb_model.fewshot import draw_shots, fewshot_prompt
    datasets, splits = questions.column("dataset").to_pylist(), questions.column("split").to_pylist()
    pool = read_questions(wh, sorted(set(datasets)), "train")
    shots_of = {}
    for dataset, split in sorted(set(zip(datasets, splits))):
        examples = pool.filter(pc.equal(pool.column("dataset"), dataset))
        mine = read_questions(wh, [dataset], split)
        asked = list(zip(mine.column("question").to_pylist(), mine.column("answers").to_pylist()))
        draws = draw_shots(examples.column("question").to_pylist(), examples.column("answers").to_pylist(),
                           asking.shots, asking.seed, asked, asking.per_question)
        shots_of.update(zip(mine.column("question_id").to_pylist(), draws))
    ids = questions.column("question_id").to_pylist()
    documents = ([[" ".join(d.split()[:asking.document_words]) for d in docs]
                  for docs in retrieved_documents(wh, ids, asking.documents)] if asking.documents
                 else [None] * len(ids))
    return [fewshot_prompt(shots_of[i], q, d) for i, q, d in zip(ids, questions.column("question").to_pylist(),
                                                                   documents)]


def retrieved_documents(wh: Warehouse, question_ids: list[str], docs: int | None) -> list[list[str]]:
    """The texts of each question's retrieved documents in rank order (the top `docs`, or all)."""
    wanted = pc.field("question_id").isin(question_ids)
    hits = wh.read("retrievals", ["question_id", "rank", "doc_id"],
                   filter=wanted if docs is None else wanted & (pc.field("rank") <= docs))
    if hits.num_rows == 0:
        raise ValueError("no retrievals for these questions; run the retrieve stage first")
    documents = wh.read("documents", ["doc_id", "text"], filter=pc.field("doc_id").isin(hits.column("doc_id").unique()))
    text_of = dict(zip(documents.column("doc_id").to_pylist(), documents.column("text").to_pylist()))
    by_question: dict[str, list[tuple[int, str]]] = {}
    for q, rank, doc in zip(*(hits.column(c).to_pylist() for c in ("question_id", "rank", "doc_id"))):
        by_question.setdefault(q, []).append((rank, text_of.get(doc, "")))
    return [[text for _, text in sorted(by_question.get(q, []))] for q in question_ids]


def retrieval_mode(info: dict) -> str:
    """How a model reads retrieved documents beside a question: none, concat or kformer (fine-tuning's `knowledge`).
    Models injected before their knowledge's digest had a key of its own held the digest under this one: none."""
    mode = info.get("knowledge", "none")
    return mode if mode in ("concat", "kformer") else "none"


def qa_inputs(wh: Warehouse, questions: pa.Table, tokenizer, info: dict):
    """Model inputs for `questions` the way the model was fine-tuned (`info`): the texts, and for Kformer the
    documents' token ids. Concat appends the documents after the question, so truncation cuts documents."""
    texts = [qa_pair(q, None, info.get("answer_format", "plain"))[0] for q in questions.column("question").to_pylist()]
    mode = retrieval_mode(info)
    if mode == "none":
        return texts, None
    ranked = mode == "kformer" and info.get("kformer_rank", False)
    documents = retrieved_documents(wh, questions.column("question_id").to_pylist(),
                                    None if ranked else info["knowledge_docs"])
    if mode == "concat":
        return [f"{t} context: {' '.join(d)}" for t, d in zip(texts, documents)], None
    from nkb_model.kformer import encode_documents
    return texts, encode_documents(tokenizer, documents, info["kformer_doc_tokens"])
