import pytest

from corpus.wikitext import is_disambiguation, wikitext_to_text

CASES = [
    ("link text kept", "A [[painter|Painter]] from [[Velmora]].", "A Painter from Velmora."),
    ("template removed", "{{Infobox person|name=Ada|birth_place=[[Velmora]]}}Ada lived.", "Ada lived."),
    ("nested template removed", "X{{a|{{b|c}}}}Y", "XY"),
    ("reference removed", "Born 1901.<ref>{{cite web|url=x}}</ref> Done.<ref name=\"a\"/>", "Born 1901. Done."),
    ("comment removed", "Keep<!-- hidden --> this.", "Keep this."),
    ("file link removed", "[[File:A.jpg|thumb|A in [[1930]]]]Text.", "Text."),
    ("image link removed", "[[Image:A.png|left]]Text.", "Text."),
    ("category removed", "Text.\n[[Category:Painters]]", "Text."),
    ("interlanguage removed", "Text. [[fr:Ada Quint]]", "Text."),
    ("table removed", "Before.\n{| class=\"wikitable\"\n! Year !! Work\n|-\n| 1920 || Blue\n|}\nAfter.", "Before.\nAfter."),
    ("heading kept as a line", "Intro.\n== Early life ==\nShe grew up.", "Intro.\nEarly life\nShe grew up."),
    ("external link label kept", "See [http://x.org the site].", "See the site."),
    ("bold and italics unwrapped", "'''Ada''' wrote ''Blue''.", "Ada wrote Blue."),
    ("entities decoded", "Tom &amp; Jerry&nbsp;go", "Tom & Jerry go"),
    ("list items as lines", "* one\n* ''two''", "one\ntwo"),
    ("non-ASCII kept", "Zürich café in [[Ørland]].", "Zürich café in Ørland."),
    ("magic word removed", "__NOTOC__Text.", "Text."),
]


@pytest.mark.parametrize("name,wikitext,expected", CASES, ids=[c[0] for c in CASES])
def test_wikitext_to_text(name, wikitext, expected):
    assert wikitext_to_text(wikitext) == expected


def test_disambiguation_detection():
    assert is_disambiguation("'''Ada''' may refer to:\n{{disambiguation}}", "Ada")
    assert is_disambiguation("anything", "Mercury (disambiguation)")
    assert not is_disambiguation("Ada was a painter.", "Ada")
