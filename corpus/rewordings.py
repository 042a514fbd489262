"""Knowledge augmentation: more than one wording of each fact, so that a model trained on them can answer questions
about it (Allen-Zhu & Li, *Physics of Language Models 3.1*: facts stored in one wording are tied to the words
before them; several paraphrases, permuted sentences and the full name in every sentence make them extractable).

Three methods, each a pure function of a segment here (the LM that writes paraphrases is run by the augment stage):
- `permute`: the segment's sentences in another order;
- `full_name`: the subject's full name (its article's title) in place of sentence-initial pronouns and of short
  forms of it (a PERSON entity whose words are some of the title's), in articles about a person
  (`is_person_subject`);
- `paraphrase`: each sentence reworded by an instruct LM, prompted few-shot (`paraphrase_demonstrations`), kept only
  if it keeps every salient span of the sentence word for word and names nothing the sentence does not
  (`kept_paraphrase`): a small LM often drops or misspells a name, and a fact with another name is a wrong fact; it
  also finishes a segment cut mid-sentence with a place or a date of its own, or one of the demonstrations'.
"""

from __future__ import annotations

import random
import re
from typing import Iterable

from corpus.segment import sentences

METHODS = ("permute", "full_name", "paraphrase")

# Demonstrations of a rewording that keeps every name, place and date (written for this project). Paraphrase k of a
# sentence is prompted with its own three of them, so that greedy decoding gives each paraphrase its own wording.
DEMONSTRATIONS = (
    ("Marie Curie was born in Warsaw in 1867.", "In 1867, Marie Curie was born in the city of Warsaw."),
    ("The Danube flows through ten countries before it reaches the Black Sea.",
     "Before reaching the Black Sea, the Danube passes through ten countries."),
    ("Ada Lovelace is best known for her notes on the Analytical Engine.",
     "The notes on the Analytical Engine are what Ada Lovelace is chiefly remembered for."),
    ("Toyota was founded by Kiichiro Toyoda in 1937.", "In 1937, Kiichiro Toyoda founded the company Toyota."),
    ("Alan Turing studied mathematics at King's College, Cambridge.",
     "King's College, Cambridge is where Alan Turing studied mathematics."),
    ("The Eiffel Tower was completed in 1889 for the World's Fair in Paris.",
     "For the 1889 World's Fair in Paris, the Eiffel Tower was finished."),
)
SHOTS = 3
_PRONOUN = re.compile(r"^(?:(He|She)|(His|Her))\b")
_WORD = re.compile(r"\w+")
_SENTENCE_END = re.compile(r"(?:^|[.!?:])[\s\"'“‘(\[]*$")  # what may stand before a sentence's first word


def sentence_texts(text: str) -> list[str]:
    return [text[a:b] for a, b in sentences(text)]


def permuted(text: str, rng: random.Random) -> str | None:
    """The segment's sentences in another order, or None for a segment of fewer than two. A piece without closing
    punctuation (a heading such as `References`) keeps its place: moved, it would run into the next sentence."""
    parts = sentence_texts(text)
    movable = [i for i, part in enumerate(parts) if part.rstrip("\"')]").endswith((".", "!", "?"))]
    if len(movable) < 2:
        return None
    order = list(movable)
    while order == movable:
        rng.shuffle(order)
    placed = dict(zip(movable, order))
    return " ".join(parts[placed.get(i, i)] for i in range(len(parts)))


_DISAMBIGUATION = re.compile(r"\s*\(([^)]*)\)\s*$")  # `Mercury (planet)`


def subject_name(title: str) -> str:
    """An article's subject as its text names it: its title without a disambiguation (`Mercury (planet)`)."""
    return _DISAMBIGUATION.sub("", title).strip()


# Lower-case words a person's name may hold; any other (`of`, `in`, `the`) makes a title something else's.
_NAME_PARTICLES = {"al", "bin", "da", "de", "del", "der", "di", "du", "ibn", "la", "le", "van", "von", "y"}
# Disambiguations of articles named after a person that are about something else: `H. L. Hunley (submarine)`.
_THINGS = {"album", "band", "book", "company", "film", "game", "magazine", "musical", "novel", "play", "series",
           "ship", "song", "submarine"}


def is_person_subject(title: str, people: Iterable[str]) -> bool:
    """Whether an article is about a person: its subject's name is capitalised word by word and holds no digit, its
    title no disambiguation of a thing (`(film)`), and NER takes some name in the article for a PERSON whose words
    are some of the subject's (`Smith` in the article on Jaden Smith) or all of them and more (`Julie Deborah
    Kavner`). Only then do he/she and a short name stand for the subject: in real Wikipedia, `He` in the article on
    `Meet the Press` is its host, and `Bates` in `List of Bates Motel characters` is not the list."""
    name = subject_name(title)
    words, disambiguation = name.split(), _DISAMBIGUATION.search(title)
    told = set(re.findall(r"\w+", disambiguation.group(1))) if disambiguation else set()  # `(submarine)`
    if not words or told & _THINGS or any(ch.isdigit() for ch in name) or not all(
            w[0].isupper() or w in _NAME_PARTICLES for w in words):
        return False
    mine = set(words)
    for person in people:
        theirs = {w.removesuffix("'s").strip(",.;:") for w in person.split()} - {""}
        if theirs and (theirs <= mine or mine <= theirs):
            return True
    return False


def with_full_name(text: str, title: str, people: Iterable[tuple[int, int]]) -> str | None:
    """The segment with its subject's full name in place of sentence-initial he/she (his/her: the name's) and of
    the `people` spans (character offsets of PERSON entities) that are short forms of it; None if nothing changed."""
    name = subject_name(title)
    if not name:  # a document without a title names no subject
        return None
    words = set(name.split())
    out, last = [], 0
    for start, end in sorted(people):
        found = set(text[start:end].split())
        beside = text[:start].split()[-1:] + text[end:].split()[:1]
        within = any(w.strip(",.;:") in words for w in beside)  # NER took part of the full name (or of a cut one)
        if found and found < words and not within:  # `Curie` in an article on Marie Curie; not another person
            out += [text[last:start], name]
            last = end
    out.append(text[last:])
    replaced = " ".join(_PRONOUN.sub(lambda m: name if m.group(1) else f"{name}'s", s)
                        for s in sentence_texts("".join(out)))
    # against the text rejoined the same way: `str.split` would also break at the no-break spaces Wikipedia has
    return replaced if replaced != " ".join(sentence_texts(text)) else None


def paraphrase_demonstrations(k: int) -> str:
    """The head of paraphrase `k`'s few-shot prompt: its own demonstrations (`paraphrase_request` follows)."""
    shown = [DEMONSTRATIONS[(k * SHOTS + j) % len(DEMONSTRATIONS)] for j in range(SHOTS)]
    return "".join(f"Sentence: {a}\nParaphrase: {b}\n\n" for a, b in shown)


def paraphrase_request(sentence: str) -> str:
    """The end of a few-shot paraphrase prompt: the sentence; the model writes its paraphrase as the rest of the
    line."""
    return f"Sentence: {sentence}\nParaphrase:"


def named_words(text: str) -> set[str]:
    """The words of `text` that name or count something: capitalised ones that do not start a sentence, and any
    with a digit; lower-cased."""
    return {m.group().lower() for m in _WORD.finditer(text)
            if any(c.isdigit() for c in m.group()) or (m.group()[0].isupper()
                                                       and not _SENTENCE_END.search(text, 0, m.start()))}


def kept_paraphrase(sentence: str, written: str, keep: Iterable[str]) -> str | None:
    """The paraphrase `written` for `sentence`, or None if it must be dropped: empty, the sentence itself, a
    salient span of `keep` missing word for word, a name or number the sentence does not hold (in any case: a
    paraphrase may start a sentence with its `during`), or out of proportion (under half or over twice its
    words)."""
    written = " ".join(written.split())
    n, m = len(sentence.split()), len(written.split())
    if not written or written.lower() == " ".join(sentence.split()).lower():
        return None
    if m < n / 2 or m > 2 * n + 4 or any(span not in written for span in keep):
        return None
    if not named_words(written) <= {w.lower() for w in _WORD.findall(sentence)}:
        return None
    return written
