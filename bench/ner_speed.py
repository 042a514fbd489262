"""NER benchmark: words/s of our salient-spans NER (NER component only, nlp.pipe, batches, 2 processes
as the stage uses on 2 cores for more than 2,000 segments)
vs a naive `for t in texts: nlp(t)` loop with spaCy's full pipeline, on segments of the scaled
sample world's retrieved documents. Prints JSON and records `metrics` rows.

    python -m bench.ner_speed [--words 60000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import pyarrow.compute as pc

from bench import record
from bench.world import DEFAULT_HOME, scaled_world
from corpus import ner
from corpus.segment import segment
from stages.configs import SalientSpansConfig


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--words", type=int, default=60_000, help="words of text to run NER on")
    parser.add_argument("--people", type=int, default=50_000, help="people in the world (about 2 documents each)")
    parser.add_argument("--home", default=str(DEFAULT_HOME), help="benchmark warehouse")
    args = parser.parse_args(argv)
    wh = scaled_world(args.home, args.people)

    texts, words = [], 0
    for batch in wh.scan("documents", ["text"], filter=pc.field("corpus") == "sampleworld", batch_size=500):
        for doc in batch.column("text").to_pylist():
            for piece in segment(doc):
                texts.append(piece)
                words += len(piece.split())
        if words >= args.words:
            break
    defaults = SalientSpansConfig()

    ner.load_ner()  # model loading is not part of either rate
    started = time.perf_counter()
    ours = list(ner.salient_spans(((t, i) for i, t in enumerate(texts)), defaults.labels, defaults.batch_size, 2))
    ours_seconds = time.perf_counter() - started

    nlp = ner.full_pipeline()
    started = time.perf_counter()
    naive = [nlp(t) for t in texts]
    naive_seconds = time.perf_counter() - started

    same = sum([(s.start_char, s.end_char, s.label) for s in spans] ==
               [(e.start_char, e.end_char, e.label_) for e in doc.ents if e.label_ in defaults.labels]
               for (_, spans), doc in zip(ours, naive))
    figures = {"segments": len(texts), "words": words,
               "ours_words_per_s": round(words / ours_seconds, 1), "naive_words_per_s": round(words / naive_seconds, 1),
               "segments_with_identical_entities": round(same / len(texts), 4)}
    figures["speedup"] = round(figures["ours_words_per_s"] / figures["naive_words_per_s"], 2)
    config = {"words": args.words, "n_process": 2, "batch_size": defaults.batch_size}
    figures["run_id"] = record(wh, "ner", figures, config)
    print(json.dumps({"benchmark": "ner", **figures}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
