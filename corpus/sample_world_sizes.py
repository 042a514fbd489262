"""How many questions each split of a sample world holds, known from its settings before the world is written (an
experiment refuses shots a split cannot give before its first stage runs).

Kept out of `sample_world.py` on purpose: the sample-world stage fingerprints that file, so an edit there regenerates
every user's world and reruns everything downstream. `tests/corpus/test_sample_world.py` holds these sizes against
the worlds the generator writes.
"""

from __future__ import annotations

from corpus.sample_world import DATASETS, RELATIONS


def split_sizes(people: int, validation_share: float = 0.5) -> dict[tuple[str, str], int]:
    """The questions each (dataset, split) of a world of `people` holds: every person's facts dealt to the datasets
    in turn, each dataset's first `validation_share` of them (rounded) asked in validation, the rest in train."""
    facts = people * len(RELATIONS)
    sizes = {}
    for d, dataset in enumerate(DATASETS):
        dealt = len(range(d, facts, len(DATASETS)))
        validation = round(validation_share * dealt)
        sizes[dataset, "train"], sizes[dataset, "validation"] = dealt - validation, validation
    return sizes
