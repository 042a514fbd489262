"""Routing by retrieval: the threshold's rule and the combination as pure logic, and the routing decision on a real
Lucene index of a small invented world (one question naming its subject, one sharing only a common word)."""

import pytest

from corpus import bm25
from corpus.routing import best_scores, routed, routing_threshold, routing_window, stretches

WORLD = [("d1", "Varnholm is a country whose capital is Lurlaispaend."),
         ("d2", "Hourdraes Bouhel was born in Lurlaispaend and studied at the Academy of Dereithdreil."),
         ("d3", "Tokim Treithei is a painter from Tirrum, a city of Varnholm."),
         ("d4", "The Academy of Dereithdreil is a university in Dereithdreil.")]


def test_threshold_is_the_fraction_of_the_lowest_train_score():
    assert routing_threshold([7.4, 7.1, 8.9]) == pytest.approx(7.1)
    assert routing_threshold([7.4, 7.1, 8.9], fraction=0.5) == pytest.approx(3.55)


@pytest.mark.parametrize("scores, fraction, message", [([], 0.5, "train split"), ([1.0], 0.0, "fraction"),
                                                        ([1.0], 1.5, "fraction")])
def test_threshold_refuses_what_cannot_set_it(scores, fraction, message):
    with pytest.raises(ValueError, match=message):
        routing_threshold(scores, fraction)


def test_a_text_longer_than_the_window_is_cut_into_overlapping_stretches_that_cover_it():
    assert stretches("where was Tokim born?", 7) == ["where was Tokim born?"]
    words = [f"w{i}" for i in range(11)]
    got = stretches(" ".join(words), 4)
    assert got == ["w0 w1 w2 w3", "w2 w3 w4 w5", "w4 w5 w6 w7", "w6 w7 w8 w9", "w7 w8 w9 w10"]
    assert {w for g in got for w in g.split()} == set(words)  # every word is in some stretch, the last one too
    assert stretches("a b c", 1) == ["a", "b", "c"]


def test_the_window_is_the_longest_train_question():
    assert routing_window(["where was Tokim born?", "what city is Tokim Treithei from?"]) == 6
    with pytest.raises(ValueError, match="train split"):
        routing_window([])


def test_routed_takes_the_slots_only_where_routed_to_them():
    assert routed([True, False, True], ["s1", "s2", "s3"], ["b1", "b2", "b3"]) == ["s1", "b2", "s3"]
    with pytest.raises(ValueError, match="one decision per item"):
        routed([True], ["s1", "s2"], ["b1", "b2"])


@pytest.mark.slow  # starts Lucene's JVM and builds an index
def test_a_question_about_the_world_is_routed_and_one_about_another_is_not(tmp_path):
    bm25.write_json_collection(WORLD, tmp_path / "collection")
    bm25.build_index(tmp_path / "collection", tmp_path / "index", threads=1)
    with bm25.Searcher(tmp_path / "index") as searcher:
        train = best_scores(searcher, ["where was Hourdraes Bouhel born?", "what city is Tokim Treithei from?"])
        asked = best_scores(searcher, ["Hourdraes Bouhel studied at the academy of", "The capital of France is",
                                       "", "zzz"])
    assert (train > 0).all()
    assert list(asked[2:]) == [0.0, 0.0]  # an empty text and one matching nothing score nothing
    to_slots = asked >= routing_threshold(train)
    assert list(to_slots) == [True, False, False, False]


# Everyday words in a few long documents: each has a low IDF, which a long text sums over many of them.
COMMON = ("people live work time year day week house road river market school music food water light night morning "
          "garden friend family story letter table window door book paper").split()


@pytest.mark.slow  # starts Lucene's JVM and builds an index
def test_a_long_text_is_routed_by_its_best_stretch_not_by_the_score_its_common_words_pile_up(tmp_path):
    """BM25 sums over a query's terms: a long text sharing only everyday words with the knowledge outscores a
    question naming its subject. Scored on stretches as long as the train questions, it does not."""
    everyday = [(f"c{i}", " ".join(COMMON[i:] + COMMON[:i])) for i in range(4)]
    bm25.write_json_collection(WORLD + everyday, tmp_path / "collection")
    bm25.build_index(tmp_path / "collection", tmp_path / "index", threads=1)
    train = ["where was Hourdraes Bouhel born?", "what city is Tokim Treithei from?"]
    chatter = " ".join(COMMON)
    naming = f"{chatter} and then Tokim Treithei came from Tirrum"
    with bm25.Searcher(tmp_path / "index") as searcher:
        threshold = routing_threshold(best_scores(searcher, train))
        window = routing_window(train)
        whole = best_scores(searcher, [chatter, naming, *train])
        stretched = best_scores(searcher, [chatter, naming, *train], window)
    assert whole[0] >= threshold  # the whole text's everyday words alone reach the threshold
    assert stretched[0] < threshold <= stretched[1]  # a stretch must name the world, as a question does
    assert list(stretched[2:]) == list(whole[2:])  # the train questions, no longer than the window, score whole
