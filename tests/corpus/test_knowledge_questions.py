"""Questions written from the knowledge by rule (`corpus.knowledge_questions`), as pure functions of a segment."""

from corpus.knowledge_questions import knowledge_questions, question_for


def ask(sentence: str, span: str, label: str) -> str | None:
    start = sentence.index(span)
    return question_for(sentence, start, start + len(span), label)


def test_the_label_chooses_the_question_word_and_a_place_or_date_takes_its_preposition():
    sentence = "Gustave Eiffel designed the tower that was completed in 1889 in Paris."
    assert ask(sentence, "Gustave Eiffel", "PERSON") == "who designed the tower that was completed in 1889 in paris"
    assert ask(sentence, "1889", "DATE") == "when gustave eiffel designed the tower that was completed in paris"
    assert ask(sentence, "Paris", "GPE") == "where gustave eiffel designed the tower that was completed in 1889"
    # a place with no place's preposition before it is not where something happens: asked by `what`
    assert ask("Vienna hosted the congress of 1815.", "Vienna", "GPE") == "what hosted the congress of 1815"
    assert ask("Lyon is the third city of France.", "France", "GPE") == "what lyon is the third city of"
    assert ask("Ada Lovelace is a poet from Lyon.", "Lyon", "GPE") == "where ada lovelace is a poet from"
    assert ask("The Danube crosses ten countries.", "ten", "CARDINAL") == "how many the danube crosses countries"
    # a preposition that is not a place's or a date's stays: `worked for` asks for an employer
    assert ask("Ada Lovelace worked for Babbage Press.", "Babbage Press", "ORG") == "what ada lovelace worked for"
    # the comma that followed a span mid-sentence goes with it, not left standing in a gap
    assert ask("Ada Lovelace, a native of Lyon, worked for Babbage Press.", "Lyon", "GPE") == \
        "what ada lovelace, a native of worked for babbage press"
    assert ask("Ada Lovelace composed Harmony, her best work.", "Harmony", "WORK_OF_ART") == \
        "what ada lovelace composed her best work"


def test_no_question_where_it_would_be_copied_or_name_nothing():
    assert ask("Paris is the capital of France, and Paris is large.", "Paris", "GPE") is None  # named again
    assert ask("He met Curie.", "Curie", "PERSON") is None  # `who he met`: too few words to name a fact
    assert ask("The Union's forces were slow.", "Union", "ORG") is None  # a possessive
    assert ask("Ada Lovelace was born in 1815.", "Ada Lovelace", "UNKNOWN_LABEL") is None


def test_each_span_asked_in_its_own_sentence_once_and_ambiguous_questions_left_out():
    texts = {"a#1": "Ada Lovelace was born in London. Ada Lovelace died in 1852.",
             "b#1": "Ada Lovelace was born in London.",  # the same question and answer: once
             "c#1": "Mary Shelley was born in London. Alan Turing was born in London."}

    def span(segment, text, label, nth=0):
        start = -1
        for _ in range(nth + 1):
            start = texts[segment].index(text, start + 1)
        return segment, start, start + len(text), label

    spans = [span("a#1", "Ada Lovelace", "PERSON"), span("a#1", "London", "GPE"), span("a#1", "1852", "DATE"),
             span("a#1", "Ada Lovelace", "PERSON", nth=1),
             span("b#1", "London", "GPE"), span("c#1", "Mary Shelley", "PERSON"),
             span("c#1", "Alan Turing", "PERSON"), ("missing#1", 0, 3, "PERSON")]
    rows = knowledge_questions(texts, spans)
    assert [(r["segment_id"], r["question"], r["answer"]) for r in rows] == [
        ("a#1", "where ada lovelace was born", "London"),
        ("a#1", "when ada lovelace died", "1852"),
        ("a#1", "who died in 1852", "Ada Lovelace")]  # `who was born in london` has three answers: left out
    assert all(r["label"] for r in rows)
