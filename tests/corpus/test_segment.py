from corpus.segment import segment, sentences

TEXT = ('Ada Quint was born in Velmora. She met Dr. Smith in 1920! "Why?" she asked.\nCareer\n'
        "She worked at U.S. Steel. It was 3.5 km away.")


def test_sentences_respect_abbreviations_numbers_quotes_and_lines():
    assert [TEXT[a:b] for a, b in sentences(TEXT)] == [
        "Ada Quint was born in Velmora.", "She met Dr. Smith in 1920!", '"Why?" she asked.', "Career",
        "She worked at U.S. Steel.", "It was 3.5 km away."]


def test_segments_pack_whole_sentences_up_to_the_limit():
    assert list(segment(TEXT, max_words=10)) == [
        "Ada Quint was born in Velmora.", 'She met Dr. Smith in 1920! "Why?" she asked. Career',
        "She worked at U.S. Steel. It was 3.5 km away."]
    assert list(segment(TEXT, max_words=1000)) == [" ".join(TEXT[a:b] for a, b in sentences(TEXT))]


def test_overlong_sentence_is_cut_at_words():
    long = " ".join(f"w{i}" for i in range(25)) + "."
    parts = list(segment(long, max_words=10))
    assert [len(p.split()) for p in parts] == [10, 10, 5] and " ".join(parts) == long


def test_empty_text_has_no_segments():
    assert list(segment("  \n ")) == []
