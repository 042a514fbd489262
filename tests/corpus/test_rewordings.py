"""Knowledge augmentation's methods, as pure functions of a segment."""

import random

from corpus import rewordings


def test_permuted_keeps_every_sentence_in_another_order_and_leaves_one_sentence_alone():
    text = "Ada Lovelace was born in London. She wrote notes on the Analytical Engine. She died in 1852."
    out = rewordings.permuted(text, random.Random(0))
    assert out != text and sorted(rewordings.sentence_texts(out)) == sorted(rewordings.sentence_texts(text))
    assert out == rewordings.permuted(text, random.Random(0))  # seeded: the same order again
    assert rewordings.permuted("Ada Lovelace was born in London.", random.Random(0)) is None


def test_full_name_replaces_short_forms_and_sentence_initial_pronouns_not_other_people():
    text = "Curie was born in Warsaw. She married Pierre Curie in 1895. Her daughter Irène won a prize."
    people = [(0, 5), (38, 50), (73, 78)]  # Curie, Pierre Curie, Irène
    assert [text[a:b] for a, b in people] == ["Curie", "Pierre Curie", "Irène"]
    assert rewordings.with_full_name(text, "Marie Curie (physicist)", people) == (
        "Marie Curie was born in Warsaw. Marie Curie married Pierre Curie in 1895. "
        "Marie Curie's daughter Irène won a prize.")
    assert rewordings.with_full_name("Marie Curie was born in Warsaw.", "Marie Curie", [(0, 11)]) is None
    assert rewordings.subject_name("Mercury (planet)") == "Mercury"
    assert rewordings.with_full_name(text, "", people) is None  # no title: no subject to name


def test_paraphrase_prompts_differ_by_their_demonstrations_and_end_where_the_paraphrase_starts():
    heads = [rewordings.paraphrase_demonstrations(k) for k in range(2)]
    assert heads[0] != heads[1] and all(h.count("Paraphrase:") == rewordings.SHOTS for h in heads)
    assert all(h.endswith("\n\n") for h in heads)
    assert rewordings.paraphrase_request("Toyota makes cars.") == "Sentence: Toyota makes cars.\nParaphrase:"


def test_a_paraphrase_is_kept_only_with_every_salient_span_and_in_proportion():
    sentence = "Hourdraes Bouhel was born in 1907 in Zixthalkel."
    keep = ["Hourdraes Bouhel", "1907", "Zixthalkel"]
    assert rewordings.kept_paraphrase(sentence, " In 1907,  Hourdraes Bouhel was born in Zixthalkel. ", keep) == \
        "In 1907, Hourdraes Bouhel was born in Zixthalkel."
    assert rewordings.kept_paraphrase(sentence, "In 1907, Hourdraes Bouhel was born in Zixthalkal.", keep) is None
    assert rewordings.kept_paraphrase(sentence, sentence.lower(), keep) is None  # the sentence itself
    assert rewordings.kept_paraphrase(sentence, "", keep) is None
    rambling = "In 1907, Hourdraes Bouhel was born in Zixthalkel, " + "a town of many rivers " * 4
    assert rewordings.kept_paraphrase(sentence, rambling, keep) is None


def test_a_paraphrase_that_names_or_dates_what_its_sentence_does_not_is_dropped():
    # what SmolLM2 wrote of real NQ passages' segments, cut mid-sentence: a place and a demonstration's tower
    cut = "During the last Ice Age, sea levels were lower and the Solent was part of"
    assert rewordings.kept_paraphrase(cut, "The Solent was part of the North Sea during the last Ice Age.", []) is None
    cut = "during the Russian Revolution."
    assert rewordings.kept_paraphrase(cut, "During the Russian Revolution, the Eiffel Tower was built.", []) is None
    sentence = "Hourdraes Bouhel was born in 1907 in Zixthalkel."
    assert rewordings.kept_paraphrase(sentence, "Hourdraes Bouhel was born in Zixthalkel in 1908, 1907.", []) is None
    # a capital that starts a sentence, or a word of the sentence in another case, names nothing new
    assert rewordings.kept_paraphrase(cut, "During the revolution. It was the Russian one.", []) == \
        "During the revolution. It was the Russian one."
    assert rewordings.named_words('He said: "Then Zixthalkel grew." (In 1907 Bouhel') == {"zixthalkel", "1907", "bouhel"}


def test_a_heading_without_closing_punctuation_keeps_its_place():
    text = "Ada Lovelace was born in London. She died in 1852. Works References"
    out = rewordings.permuted(text, random.Random(0))
    assert out == "She died in 1852. Ada Lovelace was born in London. Works References"
    assert rewordings.permuted("Ada Lovelace was born in London. Works References", random.Random(0)) is None


def test_a_person_span_inside_the_full_name_itself_is_left_as_it_is():
    """spaCy marks part of a name as a person (`Shershaeth` of `Shershaeth and Sons`, `Brøtai` of `Shøskrend
    Brøtai`): already the full name, not a short form of it."""
    text = "While at Shershaeth and Sons, Shøskrend Brøtai carved a statue. Brøtai died in 1990."
    sons, first, last = text.index("Shershaeth"), text.index("Brøtai"), text.rindex("Brøtai")
    assert rewordings.with_full_name(text, "Shershaeth and Sons", [(sons, sons + 10)]) is None
    assert rewordings.with_full_name(text, "Shøskrend Brøtai", [(first, first + 6), (last, last + 6)]) == (
        "While at Shershaeth and Sons, Shøskrend Brøtai carved a statue. Shøskrend Brøtai died in 1990.")


def test_only_an_article_about_a_person_has_a_subject_that_he_or_she_stands_for():
    # real Wikipedia passages: `He` in the article on a TV programme is its host; `Bates` in a list is not the list
    assert rewordings.is_person_subject("Julie Kavner", ["Valerie Harper's", "Julie Deborah Kavner"])
    assert rewordings.is_person_subject("Jaden Smith", ["Jackie Chan", "Smith"])
    assert rewordings.is_person_subject("Kelly Taylor (90210)", ["Kelly's"])
    assert rewordings.is_person_subject("Mohammad bin Salman", ["Salman"])
    assert not rewordings.is_person_subject("Meet the Press", ["Tim Russert"])
    assert not rewordings.is_person_subject("Call Me Maybe", ["Carly Rae Jepsen"])
    assert not rewordings.is_person_subject("List of Bates Motel characters", ["Norman Bates", "Bates"])
    assert not rewordings.is_person_subject("Bigg Boss Kannada 5", ["Kannada"])
    assert not rewordings.is_person_subject("H. L. Hunley (submarine)", ["Hunley"])
    assert not rewordings.is_person_subject("", ["Claudia Wells"])


def test_a_segment_with_no_break_spaces_and_nothing_to_replace_is_left_out():
    text = "During the course of the programme, 52 episodes aired\xa0over six series. It ended in 2015."
    assert rewordings.with_full_name(text, "Downton Abbey", []) is None
    assert rewordings.with_full_name("He was\xa0born in 1950.", "Tim Russert", []) == "Tim Russert was\xa0born in 1950."
