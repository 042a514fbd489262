"""Model names: one grammar, built and read by `stages.names` alone."""

import pytest

from stages.names import ModelName, answers_name, evaluated_name, way_of_asking


@pytest.mark.parametrize("text, parts", [
    ("base", ("base", None, None, 0)),
    ("base+nkb", ("base", "nkb", None, 0)),
    ("base+nkb-a.qa", ("base", "nkb-a", "qa", 0)),
    ("base.kformer", ("base", None, "kformer", 0)),
    ("base+nkb.3shot", ("base", "nkb", None, 3)),
    ("base+nkb.qa.edited", ("base", "nkb", "qa.edited", 0)),
    ("base.3docs.5shot", ("base", None, None, 5)),
    ("m.0docs.3shot", ("m", None, "0docs", 3)),
    ("large+nkb.summaries", ("large", "nkb", "summaries", 0)),
    # names given by hand read back unchanged, whatever their parts seem to be
    ("Qwen2.5-0.5B", ("Qwen2", None, "5-0.5B", 0)),
    ("m.0shot", ("m", None, "0shot", 0)),
    ("m.03shot", ("m", None, "03shot", 0)),
    ("m.shot", ("m", None, "shot", 0)),
    ("m.²shot", ("m", None, "²shot", 0)),
])
def test_a_name_reads_as_its_parts_and_back_as_the_same_text(text, parts):
    name = ModelName.parse(text)
    assert (name.base, name.route, name.tuning, name.shots) == parts
    assert str(name) == text


def test_the_names_of_a_rows_answers_are_built_one_way():
    assert evaluated_name("base+nkb", 0) == "base+nkb.qa" and evaluated_name("base+nkb", 5) == "base+nkb.5shot"
    assert str(ModelName.parse("base+nkb.qa").tuned("edited")) == "base+nkb.qa.edited"
    assert answers_name("t5.v2", 0) == "t5.v2"  # asked as fine-tuned: its own name, even one that parses oddly
    assert answers_name("base", 2) == "base.2shot"
    assert [way_of_asking(k) for k in (0, 5)] == ["fine-tuned", "5-shot"]
    # asked with retrieved documents in the prompt: never fine-tuned, filed under the count of documents
    assert evaluated_name("base", 5, 3) == "base.3docs.5shot" and evaluated_name("base", 0, 3) == "base.3docs"
    assert way_of_asking(0, 3) == "0-shot" and ModelName.parse("base.3docs.5shot").documents == 3
    # asked in the prompt with no examples: never fine-tuned, filed under the model's own name
    assert evaluated_name("base+nkb", 0, prompted=True) == "base+nkb" and way_of_asking(0, prompted=True) == "0-shot"
    assert evaluated_name("base", 0, 3, prompted=True) == "base.3docs"
