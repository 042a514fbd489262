"""The augment stage: other wordings of a corpus's retrieved segments (`corpus.rewordings`), written to
`augmented_segments` with their source segment and method, and as the `segments` partition <corpus>.augmented,
whose salient spans (salient-spans source=augmented) inject trains on beside the segments' own (`augmented`)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpus import rewordings
from corpus.segment import sentences
from stages import reads
from stages.configs import AugmentConfig
from stages.inputs import AUGMENTED, one_corpus, span_partitions
from stages.models import source_model
from stages.progress import progress
from stages.sources import resolve_source
from warehouse import StagedRun, StageResult, Warehouse, file_digest

COLUMNS = ("segment_id", "source_segment_id", "doc_id", "method", "text", "model")


@dataclass(frozen=True)
class Paraphraser:
    """The LM that writes paraphrases: what the table names it, what stands for it in the fingerprint, loading it."""
    name: str
    read: reads.Read
    load: Callable[[], tuple]


def paraphraser(wh: Warehouse, name: str) -> Paraphraser:
    """A model of the warehouse or a Hugging Face folder (`stages.models.source_model`), else a .gguf file or
    pip:PACKAGE (`stages.sources.resolve_source`), dequantised on loading."""
    try:
        source = source_model(wh, name)
        return Paraphraser(source.info.get("source", name), reads.model(source), lambda: source.load()[:2])
    except ValueError:
        path = resolve_source(name)  # refuses, saying what it looked for, what is neither
    if path.suffix != ".gguf":
        raise ValueError(f"paraphrase_model {name}: neither a model of this warehouse, a Hugging Face folder, "
                         "nor a .gguf file")

    def load():
        from nkb_model.checkpoint import load_gguf
        return load_gguf(path)[:2]
    return Paraphraser(name, reads.mark(f"{path.name}:{file_digest(path)}"), load)


def augment(wh: Warehouse, config: AugmentConfig, force: bool = False) -> StageResult:
    """Each retrieved segment of the corpus (with a salient span) in other wordings, by `methods`; resumable by
    shard (the paraphrases are what takes time)."""
    from nkb_model.train import choose_device
    config = config.model_copy(update={"corpus": one_corpus(wh, config.corpus)})
    writer = paraphraser(wh, config.paraphrase_model) if "paraphrase" in config.methods else None
    declared = reads.Declared("augment", config, [reads.spans(wh, config.corpus), reads.corpus(wh, config.corpus),
                                                  writer.read if writer else reads.NOTHING])
    device = choose_device(config.device, config.precision)
    return declared.run(wh, lambda run: _augment(run, wh, config, writer, device), force=force, resumable=True,
                        device=device.name)


def _augment(run: StagedRun, wh: Warehouse, config: AugmentConfig, writer: Paraphraser | None, device) -> dict:
    started = time.perf_counter()
    segments, spans = segments_to_augment(wh, config.corpus)
    loaded = writer.load() if writer else None
    if loaded:
        from nkb_model.families import family
        if family(loaded[0]).has_encoder:
            raise ValueError(f"paraphrase_model {config.paraphrase_model} is an encoder-decoder model; paraphrases "
                             "are written by a decoder-only (instruct) LM: name one with paraphrase_model=")
        loaded[0].to(device.device).eval().requires_grad_(False)
    shards = run.shards("augmented_segments", config.corpus)
    resumed = shards.done_count()
    with progress(desc="augment", unit=" seg", total=len(segments)) as bar:
        for index, lo in enumerate(range(0, len(segments), config.shard_size)):
            part = segments[lo:lo + config.shard_size]
            if shards.is_done(index):  # written before a crash
                bar.update(len(part))
                continue
            shards.write(index, augmented_rows(part, spans, config, writer, loaded, device,
                                               whole_steps(bar.update, len(part))))
    table = pa.concat_tables([pq.read_table(staged, columns=list(COLUMNS)) for staged, _ in shards.files()])
    run.write("segments", f"{config.corpus}.{AUGMENTED}", table.select(["segment_id", "doc_id", "text"]))
    run.replace_partitions("salient_spans", f"{config.corpus}.{AUGMENTED}-")  # they described other segments
    methods = table.column("method").to_pylist()
    counts = {method: methods.count(method) for method in config.methods}
    for method, n in counts.items():
        run.metric("augmented_segments", n, dataset=method)
    return {"corpus": config.corpus, "segments": len(segments), "written": counts, "resumed_shards": resumed,
            "seconds": time.perf_counter() - started, "device": device.name}


def whole_steps(update: Callable[[int], None], size: int) -> Callable[[float], None]:
    """`advance(share)` for work of `size` units: `update` gets whole units that sum to `size` once the shares
    reach 1 (fractions of a batch would sum past the bar's total in floating point)."""
    shares, shown = 0.0, 0

    def advance(share: float) -> None:
        nonlocal shares, shown
        shares += share
        units = min(size, round(shares * size))
        update(units - shown)
        shown = units
    return advance


def segments_to_augment(wh: Warehouse, corpus: str) -> tuple[list[dict], dict[str, list[tuple[int, int, str]]]]:
    """The corpus's retrieved segments that have salient spans, each with its document's title and whether the
    document is about a person (`person`), and their spans (start, end, label) by segment."""
    segments_part, span_parts = span_partitions(wh, corpus)
    found = wh.read("salient_spans", ["segment_id", "start_char", "end_char", "label", "text"], partitions=span_parts)
    spans: dict[str, list[tuple[int, int, str]]] = {}
    people: dict[str, list[str]] = {}  # the PERSON spans' texts by segment
    for seg, start, end, label, text in zip(*(found.column(c).to_pylist() for c in found.column_names)):
        spans.setdefault(seg, []).append((start, end, label))
        if label == "PERSON":
            people.setdefault(seg, []).append(text)
    table = wh.read("segments", ["segment_id", "doc_id", "text"], partitions=[segments_part],
                    filter=pc.field("segment_id").isin(list(spans))).sort_by("segment_id")
    docs = wh.read("documents", ["doc_id", "title"], filter=(pc.field("corpus") == corpus)
                   & pc.field("doc_id").isin(table.column("doc_id").unique()))
    titles = dict(zip(docs.column("doc_id").to_pylist(), docs.column("title").to_pylist()))
    rows = [row | {"title": titles.get(row["doc_id"]) or ""} for row in table.to_pylist()]
    named: dict[str, list[str]] = {}  # the PERSON spans' texts by document
    for row in rows:
        named.setdefault(row["doc_id"], []).extend(people.get(row["segment_id"], []))
    return [row | {"person": rewordings.is_person_subject(row["title"], named[row["doc_id"]])} for row in rows], spans


def augmented_rows(segments: list[dict], spans: dict, config: AugmentConfig, writer: Paraphraser | None, loaded,
                   device, advance: Callable[[float], None]) -> dict[str, list]:
    """The rows of `augmented_segments` for these segments, by method; `advance(share)` as a share of the work is
    done."""
    rows: dict[str, list] = {c: [] for c in COLUMNS}

    def add(segment: dict, method: str, text: str | None, k: int | str = "", name: str | None = None) -> None:
        if text:
            for column, value in zip(COLUMNS, (f"{segment['segment_id']}~{method}{k}", segment["segment_id"],
                                               segment["doc_id"], method, text, name)):
                rows[column].append(value)
    for segment in segments:
        rng = random.Random(f"{config.seed}:{segment['segment_id']}")
        if "permute" in config.methods:
            add(segment, "permute", rewordings.permuted(segment["text"], rng))
        if "full_name" in config.methods and segment["person"]:
            people = [(a, b) for a, b, label in spans[segment["segment_id"]] if label == "PERSON"]
            add(segment, "full_name", rewordings.with_full_name(segment["text"], segment["title"], people))
    if writer:
        for segment, k, text in paraphrased(segments, spans, config, loaded, device, advance):
            add(segment, "paraphrase", text, k, writer.name)
    else:
        advance(1.0)
    return rows


def paraphrased(segments: list[dict], spans: dict, config: AugmentConfig, loaded, device,
                advance: Callable[[float], None]):
    """(segment, k, paraphrase k of it or None): each sentence reworded by the LM; a sentence whose paraphrase is
    dropped (`corpus.rewordings.kept_paraphrase`) keeps its own words, and a segment none of whose sentences changed
    gets none."""
    jobs = []  # (segment index, sentence, k, the spans' texts in it)
    for i, segment in enumerate(segments):
        text, found = segment["text"], spans[segment["segment_id"]]
        for a, b in sentences(text):
            keep = [text[s:e] for s, e, _ in found if a <= s and e <= b]
            jobs += [(i, text[a:b], k, keep) for k in range(config.paraphrases)]
    written = write_paraphrases([(k, sentence) for _, sentence, k, _ in jobs], config, loaded, device, advance)
    by_segment: dict[tuple[int, int], list[tuple[str, str | None]]] = {}
    for (i, sentence, k, keep), out in zip(jobs, written):
        by_segment.setdefault((i, k), []).append((sentence, rewordings.kept_paraphrase(sentence, out, keep)))
    for (i, k), parts in sorted(by_segment.items()):
        changed = any(p for _, p in parts)
        yield segments[i], k, " ".join(p or s for s, p in parts) if changed else None


def write_paraphrases(asked: list[tuple[int, str]], config: AugmentConfig, loaded, device,
                      advance: Callable[[float], None]) -> list[str]:
    """What the LM writes for each (k, sentence), greedily: the requests of one paraphrase k after its
    demonstrations, read once (`nkb_model.decoding.SharedPrefix`); similar lengths batched together, each batch
    written up to twice its longest request and a little more (a longer paraphrase is dropped anyway)."""
    from nkb_model.decoding import SharedPrefix
    lm, tokenizer = loaded
    requests = [rewordings.paraphrase_request(sentence) for _, sentence in asked]
    lengths = [len(ids) for ids in tokenizer(requests, add_special_tokens=False)["input_ids"]]
    heads = {k: SharedPrefix(lm, tokenizer, rewordings.paraphrase_demonstrations(k), device) for k in {k for k, _ in asked}}
    written: dict[int, str] = {}
    for k, head in heads.items():
        mine = sorted((j for j, (kj, _) in enumerate(asked) if kj == k), key=lengths.__getitem__)
        for lo in range(0, len(mine), config.batch_size):
            batch = mine[lo:lo + config.batch_size]
            cap = min(config.max_new_tokens, 2 * max(lengths[j] for j in batch) + 8)
            written |= dict(zip(batch, head.generate([requests[j] for j in batch], cap)))
            advance(len(batch) / len(asked))
    if not asked:
        advance(1.0)
    return [written[j] for j in range(len(asked))]
