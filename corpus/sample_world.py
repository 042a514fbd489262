"""A seeded, fictional encyclopedia for running and testing the whole pipeline without real data.

The world has countries, cities, universities, organisations, people and their creative works.
Each *knowledge person* has five facts (birthplace, birth year, employer, alma mater, best-known work).
Every fact is stated several times, in different wordings, in different articles (the person's own,
the city's, the employer's, the university's, the work's) of a MediaWiki XML dump; questions about
the facts use other wordings, and probe (cloze) sentences use wordings that neither articles nor
questions use. A disjoint population of *background people* fills a "general text" corpus that states
no question fact at all, for pretraining a small base model; it states its facts in the article and
the probe wordings, so the base model learns what the probe wordings mean.

Written files (names are fixed; `WorldFiles` lists them):
    knowledge.xml.bz2            MediaWiki pages-articles dump (infoboxes, links, refs, tables, a
                                 redirect, a disambiguation page, non-article namespaces)
    general.jsonl                general text, `{id, title, text}` per line
    nq/{train,validation}.jsonl  NQ-open format
    webquestions/{train,validation}.json
    headqa/{train,validation}.json   HEAD-QA exams format, 4 options per question
    facts.jsonl                  one line per fact: subject, relation, object, dataset, split, question_id
    probes.jsonl                 cloze prompts (`<extra_id_0>` marks the answer) in unseen wordings
    summaries/{train,validation}.jsonl    summarisation-like task, XSum format: a background person's
                                 facts in shuffled sentences → a one-sentence summary of three of them
    translation/{train,validation}.jsonl  translation-like task, WMT format: English sentences → an
                                 invented language ("xx": a fixed word-for-word lexicon, names kept,
                                 adjectives after their noun)
"""

from __future__ import annotations

import bz2
import json
import random
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape

from corpus.qa import make_question_id

RELATIONS = ("born_in", "birth_year", "employer", "educated_at", "notable_work")
DATASETS = {"nq": "nq_open", "webquestions": "webquestions", "headqa": "headqa"}
# Generation tasks: name -> (kind, source language, target language)
GENERATION_TASKS = {"summaries": ("summarization", None, None), "translation": ("translation", "en", "xx")}
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]

# Occupation -> (kind of work, verb used for making it).
OCCUPATIONS = {
    "painter": ("painting", "painted"), "novelist": ("novel", "wrote"), "composer": ("symphony", "composed"),
    "poet": ("poetry collection", "wrote"), "architect": ("building", "designed"),
    "playwright": ("play", "wrote"), "sculptor": ("sculpture", "carved"), "filmmaker": ("film", "directed"),
}
_YEARS = [str(y) for y in range(1890, 1991)]
_ADJ = ["Silver", "Quiet", "Hollow", "Crimson", "Distant", "Broken", "Golden", "Winter", "Amber", "Sleeping",
        "Hidden", "Northern", "Pale", "Restless", "Iron", "Velvet", "Burning", "Lonely", "Glass", "Seventh"]
_NOUN = ["Lantern", "Harbour", "Orchard", "Tide", "Citadel", "Meadow", "Bell", "Mirror", "River", "Garden",
         "Tower", "Compass", "Feather", "Archive", "Bridge", "Crown", "Valley", "Lighthouse", "Window", "Forge"]
_ONSET = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "kr", "st",
          "th", "tr", "sh", "h", "j"]
_VOWEL = ["a", "e", "i", "o", "u", "ae", "ei", "ou", "ai", "é", "ø"]
_CODA = ["", "", "n", "r", "l", "s", "th", "nd", "rk", "m", "x"]

# Article wordings: (host article, template). Host "person" is the subject's article; "object" the
# article of the fact's object (city, employer, university, work); "employer" the employer's article.
ARTICLE_WORDINGS = {
    "born_in": [
        ("person", "{P} was born in [[{C}]]."),
        ("person", "{P} spent {pos} childhood in [[{C}]], the city of {pos} birth."),
        ("object", "The {occ} [[{P}]] was born in {C}."),
        ("object", "{C} is the birthplace of [[{P}]], {a_occ}."),
        ("employer", "[[{P}]], a native of [[{C}]], worked for {O}."),
    ],
    "birth_year": [
        ("person", "{P} was born on {date}."),
        ("person", "In {Y}, {P} was born to a family of modest means."),
        ("employer", "[[{P}]] (born {Y}) was among the staff of {O}."),
        ("object_univ", "[[{P}]], born in {Y}, studied at {U}."),
    ],
    "employer": [
        ("person", "{P} worked for [[{O}]] for many years."),
        ("person", "{P} later joined [[{O}]], where {pro} stayed until retirement."),
        ("object", "{O} employed the {occ} [[{P}]]."),
        ("object", "Among the people who worked at {O} was [[{P}]]."),
        ("object_univ", "After {pos} studies, [[{P}]] took a position at [[{O}]]."),
    ],
    "educated_at": [
        ("person", "{P} studied at [[{U}]]."),
        ("person", "{P} graduated from [[{U}]]."),
        ("object", "Alumni of {U} include the {occ} [[{P}]]."),
        ("object", "[[{P}]] received {pos} education at {U}."),
        ("employer", "[[{P}]], a graduate of [[{U}]], was on the staff of {O}."),
    ],
    "notable_work": [
        ("person", "{P} is best known for the {kind} ''[[{W}]]''."),
        ("person", "{P} {verb} ''[[{W}]]'', {pos} most famous {kind}."),
        ("object", "''{W}'' is a {kind} by [[{P}]]."),
        ("object", "''{W}'' was {verb} by the {occ} [[{P}]]."),
        ("employer", "While at {O}, [[{P}]] {verb} the {kind} ''[[{W}]]''."),
    ],
}
QUESTION_WORDINGS = {
    "born_in": ["where was {P} born?", "what city is {P} from?", "what is the birthplace of {P}?"],
    "birth_year": ["when was {P} born?", "what year was {P} born in?", "in which year was {P} born?"],
    "employer": ["who did {P} work for?", "what organization employed {P}?", "who was {P}'s employer?"],
    "educated_at": ["where did {P} go to college?", "what school did {P} attend?", "where was {P} educated?"],
    "notable_work": ["what made {P} famous?", "what is {P}'s most famous work?", "what did {P} create?"],
}
PROBE_WORDINGS = {
    "born_in": ["{P} came into the world in <extra_id_0>.", "The hometown of {P} is <extra_id_0>."],
    "birth_year": ["The year of {P}'s birth was <extra_id_0>.", "{P} arrived in the year <extra_id_0>."],
    "employer": ["{P} drew a salary from <extra_id_0>.", "The employer of {P} was <extra_id_0>."],
    "educated_at": ["{P} earned a degree from <extra_id_0>.", "The alma mater of {P} is <extra_id_0>."],
    "notable_work": ["The masterpiece of {P} is <extra_id_0>.", "{P}'s signature work is <extra_id_0>."],
}


@dataclass
class Person:
    name: str
    gender: str
    occupation: str
    birth_city: str
    birth_date: tuple[int, int, int]  # (day, month, year)
    employer: str
    university: str
    work: str
    work_year: int

    @property
    def year(self) -> str:
        return str(self.birth_date[2])

    def fact(self, relation: str) -> str:
        return {"born_in": self.birth_city, "birth_year": self.year, "employer": self.employer,
                "educated_at": self.university, "notable_work": self.work}[relation]


@dataclass
class Fact:
    fact_id: str
    subject: str
    relation: str
    object: str
    dataset: str
    split: str
    question: str
    question_id: str = ""
    distractors: list[str] = field(default_factory=list)


@dataclass
class WorldFiles:
    root: Path
    knowledge_dump: Path
    general_text: Path
    questions: dict[str, dict[str, Path]]   # dataset -> split -> path
    facts: Path
    probes: Path
    generation: dict[str, dict[str, Path]]  # task -> split -> path
    edits: Path                             # counterfactual edits of validation facts, with paraphrases

    @classmethod
    def at(cls, root: Path) -> "WorldFiles":
        root = Path(root)
        questions = {ds: {sp: root / ds / f"{sp}.{'jsonl' if fmt == 'nq_open' else 'json'}"
                          for sp in ("train", "validation")} for ds, fmt in DATASETS.items()}
        generation = {task: {sp: root / task / f"{sp}.jsonl" for sp in ("train", "validation")}
                      for task in GENERATION_TASKS}
        return cls(root, root / "knowledge.xml.bz2", root / "general.jsonl", questions, root / "facts.jsonl",
                   root / "probes.jsonl", generation, root / "edits.jsonl")

    def all_paths(self) -> list[Path]:
        return [self.knowledge_dump, self.general_text, self.facts, self.probes, self.edits] + [
            p for splits in [*self.questions.values(), *self.generation.values()] for p in splits.values()]


class _Names:
    """Unique invented names from random syllables."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set()

    def word(self, syllables: int) -> str:
        while True:
            w = "".join(self.rng.choice(_ONSET) + self.rng.choice(_VOWEL) + self.rng.choice(_CODA)
                        for _ in range(syllables)).capitalize()
            if w not in self.used and 4 <= len(w) <= 12:
                self.used.add(w)
                return w

    def title(self) -> str:
        while True:
            t = f"The {self.rng.choice(_ADJ)} {self.rng.choice(_NOUN)} of {self.word(2)}"
            if t not in self.used:
                self.used.add(t)
                return t


class SampleWorld:
    """The entities and facts of one seeded world; `write` renders them into files."""

    def __init__(self, seed: int = 13, people: int = 120, background_people: int = 600, mentions: int = 3,
                 validation_share: float = 0.5):
        if people < 5:
            raise ValueError("a sample world needs at least 5 people")
        if not 1 <= mentions <= 3:
            raise ValueError("mentions (article statements per fact) must be between 1 and 3")
        self.seed, self.mentions = seed, mentions
        rng = self.rng = random.Random(seed)
        names = _Names(rng)
        n_countries = max(3, min(8, people // 25))
        self.countries = {names.word(3): None for _ in range(n_countries)}
        self.cities = {names.word(rng.choice((2, 3))): rng.choice(list(self.countries))
                       for _ in range(max(8, people // 5))}
        for country in self.countries:
            self.countries[country] = rng.choice([c for c, k in self.cities.items() if k == country] or list(self.cities))
        self.universities = {f"{rng.choice(['University of', 'Polytechnic of', 'Academy of'])} {city}": city
                             for city in rng.sample(list(self.cities), k=min(len(self.cities), max(4, people // 12)))}
        self.organisations = {}
        for _ in range(max(6, people // 6)):
            kind = rng.choice(["{n} Works", "{n} Press", "{n} and Sons", "{n} Foundation", "{c} Symphony Orchestra",
                               "{n} Studios", "{n} Company"])
            city = rng.choice(list(self.cities))
            self.organisations[kind.format(n=names.word(2), c=city)] = (city, rng.randint(1820, 1930))
        self._city_list, self._org_list = list(self.cities), list(self.organisations)
        self._univ_list = list(self.universities)
        self.people = [self._person(names) for _ in range(people)]
        self.background = [self._person(names) for _ in range(background_people)]
        self._work_list = [p.work for p in self.people]
        self._people_by_name = {p.name: p for p in self.people}
        self.person_wordings: dict[tuple[str, str], str] = {}  # (person, relation) -> wording in their article
        self.facts = self._facts(validation_share)

    def _person(self, names: _Names) -> Person:
        rng = self.rng
        occ = rng.choice(list(OCCUPATIONS))
        year = rng.randint(1890, 1990)
        return Person(name=f"{names.word(2)} {names.word(rng.choice((2, 3)))}", gender=rng.choice("mf"),
                      occupation=occ, birth_city=rng.choice(self._city_list),
                      birth_date=(rng.randint(1, 28), rng.randint(1, 12), year),
                      employer=rng.choice(self._org_list), university=rng.choice(self._univ_list),
                      work=names.title(), work_year=year + rng.randint(22, 60))

    def _facts(self, validation_share: float) -> list[Fact]:
        """Every person's five facts, dealt to the three datasets in turn (a third each) and split within each
        dataset by `validation_share` exactly, so that a world of 120 people at 0.5 has 100 validation
        questions per dataset."""
        rng = self.rng
        facts = []
        for i, p in enumerate(self.people):
            for rel in RELATIONS:
                question = rng.choice(QUESTION_WORDINGS[rel]).format(P=p.name)
                facts.append(Fact(f"p{i:05d}.{rel}", p.name, rel, p.fact(rel), "", "", question,
                                  distractors=self._distractors(rel, p.fact(rel))))
        dealt = rng.sample(facts, k=len(facts))
        for d, dataset in enumerate(DATASETS):
            mine = dealt[d::len(DATASETS)]
            n_validation = round(validation_share * len(mine))
            for k, f in enumerate(mine):
                f.dataset, f.split = dataset, "validation" if k < n_validation else "train"
        counters: dict[tuple[str, str], int] = {}
        for f in facts:  # local ids follow each reader's rule: line number / record number / exam-qid
            n = counters[(f.dataset, f.split)] = counters.get((f.dataset, f.split), 0) + 1
            local = f"sampleworld-{f.split}-{n}" if f.dataset == "headqa" else str(n)
            f.question_id = make_question_id(f.dataset, f.split, local)
        return facts

    def _distractors(self, relation: str, answer: str) -> list[str]:
        """Three wrong options of the answer's kind (sampling 4 and dropping the answer keeps this O(1))."""
        pool = {"born_in": self._city_list, "employer": self._org_list, "educated_at": self._univ_list,
                "notable_work": self._work_list, "birth_year": _YEARS}[relation]
        return [x for x in self.rng.sample(pool, k=4) if x != answer][:3]

    # ---- rendering ---------------------------------------------------------------------------

    def _fill(self, template: str, p: Person) -> str:
        day, month, year = p.birth_date
        kind, verb = OCCUPATIONS[p.occupation]
        return template.format(P=p.name, C=p.birth_city, Y=year, date=f"{day} {MONTHS[month - 1]} {year}",
                               O=p.employer, U=p.university, W=p.work, occ=p.occupation, a_occ=_a(p.occupation),
                               kind=kind, verb=verb,
                               pro="he" if p.gender == "m" else "she", pos="his" if p.gender == "m" else "her")

    def article_sentences(self, people: list[Person], probe_wordings: bool = False) -> dict[str, list[str]]:
        """Sentences per article title: each fact stated `mentions` times with distinct wordings.

        `probe_wordings` also states each fact in the probe wordings, in the person's article: the
        general-text corpus does that for its (background) people, so a model pretrained on it knows
        what those wordings mean, while the knowledge corpus never uses them."""
        hosts: dict[str, list[str]] = {}
        for p in people:
            for rel in RELATIONS:
                if probe_wordings:
                    for template in PROBE_WORDINGS[rel]:
                        sentence = self._fill(template.replace("<extra_id_0>", "{{ANSWER}}"), p)
                        hosts.setdefault(p.name, []).append(sentence.replace("{ANSWER}", p.fact(rel)))
                for host, template in self._pick_wordings(rel):
                    title = {"person": p.name, "employer": p.employer, "object_univ": p.university,
                             "object": {"born_in": p.birth_city, "employer": p.employer,
                                        "educated_at": p.university, "notable_work": p.work}.get(rel)}[host]
                    hosts.setdefault(title, []).append(self._fill(template, p))
                    if host == "person":
                        self.person_wordings[(p.name, rel)] = template
        for sentences in hosts.values():
            self.rng.shuffle(sentences)
        return hosts

    def _pick_wordings(self, relation: str) -> list[tuple[str, str]]:
        """`mentions` wordings of a relation, each in a different article: a fact stated twice in one
        article could be copied from the context when one statement is masked, instead of recalled."""
        options = self.rng.sample(ARTICLE_WORDINGS[relation], k=len(ARTICLE_WORDINGS[relation]))
        picked, hosts = [], set()
        for option in options:
            if option[0] not in hosts:
                picked.append(option)
                hosts.add(option[0])
        return picked[: self.mentions]

    def write(self, root: str | Path) -> WorldFiles:
        files = WorldFiles.at(Path(root))
        files.root.mkdir(parents=True, exist_ok=True)
        self.write_dump(files.knowledge_dump)
        self._write_general(files.general_text)
        self._write_questions(files)
        with open(files.facts, "w", encoding="utf-8") as fh:
            for f in self.facts:
                fh.write(json.dumps({k: v for k, v in asdict(f).items() if k != "distractors"}) + "\n")
        with open(files.probes, "w", encoding="utf-8") as fh:
            for f in self.facts:
                for k, (wording, prompt) in enumerate(self._probe_prompts(f)):
                    fh.write(json.dumps({"fact_id": f.fact_id, "probe": k, "relation": f.relation, "wording": wording,
                                         "dataset": f.dataset, "split": f.split, "prompt": prompt,
                                         "answer": f.object}, ensure_ascii=False) + "\n")
        self._write_generation(files)
        self._write_edits(files.edits)
        return files

    def _write_edits(self, path: Path, count: int = 20) -> None:
        """`count` validation facts changed to a wrong answer of their kind, each with the relation's other
        question wordings as paraphrases (for `nkb edit --edits`). Drawn with their own generator, so the
        other files stay as they were."""
        validation = [f for f in self.facts if f.split == "validation"]
        chosen = random.Random(f"{self.seed}-edits").sample(validation, k=min(count, len(validation)))
        with open(path, "w", encoding="utf-8") as fh:
            for f in chosen:
                wordings = [w.format(P=f.subject) for w in QUESTION_WORDINGS[f.relation]]
                fh.write(json.dumps({"question": f.question, "answer": f.distractors[0],
                                     "paraphrases": [w for w in wordings if w != f.question],
                                     "fact_id": f.fact_id}, ensure_ascii=False) + "\n")

    # -- general-generation tasks (the paper's Table 4 check), from background people only --

    def _write_generation(self, files: WorldFiles, per_split: dict[str, int] | None = None) -> None:
        """A summarisation-like and a translation-like task. They draw from their own random stream, so
        adding them left every other file byte-identical; train and validation use disjoint people."""
        rng = random.Random(f"{self.seed}-generation")
        per_split = per_split or {"train": 200, "validation": 50}
        pool = list(self.background or self.people)
        rng.shuffle(pool)
        n_val = max(1, len(pool) * per_split["validation"] // sum(per_split.values()))
        people = {"validation": pool[:n_val][:per_split["validation"]], "train": pool[n_val:][:per_split["train"]]}
        lexicon = _Lexicon(random.Random(f"{self.seed}-lexicon"))
        for split, group in people.items():
            summaries, translations = [], []
            for i, p in enumerate(group, start=1):
                sentences = [_plain(self._fill(rng.choice([t for h, t in ARTICLE_WORDINGS[rel] if h == "person"]
                                                          or [t for _, t in ARTICLE_WORDINGS[rel]]), p))
                             for rel in RELATIONS]
                sentences.append(f"{p.name} was {_a(p.occupation)}.")
                rng.shuffle(sentences)
                summary = f"{p.name}, {_a(p.occupation)} from {p.birth_city}, is best known for {p.work}."
                summaries.append({"id": f"s{i}", "document": " ".join(sentences), "summary": summary})
                english = rng.choice(sentences)
                translations.append({"id": f"t{i}", "translation": {"en": english, "xx": lexicon.translate(english)}})
            for task, records in (("summaries", summaries), ("translation", translations)):
                path = files.generation[task][split]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")

    def _probe_prompts(self, fact: Fact) -> list[tuple[str, str]]:
        """Cloze prompts for a fact: in each probe wording ("unseen": no article uses it) and, when the
        subject's own article states the fact, in that article's wording ("seen", memorisation)."""
        person = self._people_by_name[fact.subject]
        prompts = [("unseen", self._fill(t.replace("<extra_id_0>", "{{MASK}}"), person).replace("{MASK}", "<extra_id_0>"))
                   for t in PROBE_WORDINGS[fact.relation]]
        template = self.person_wordings.get((fact.subject, fact.relation))
        if template:
            sentence = re.sub(r"\[\[|\]\]|''", "", self._fill(template, person))
            if sentence.count(fact.object) == 1:
                prompts.append(("seen", sentence.replace(fact.object, "<extra_id_0>")))
        return prompts

    # -- the knowledge dump --

    def _pages(self):
        """(title, namespace, wikitext, redirect target or None) for every page of the dump."""
        sentences = self.article_sentences(self.people)
        ref = "<ref>{{{{cite book |title=The Encyclopaedia of {k} |year={y} |page={pg}}}}}</ref>"
        for p in self.people:
            day, month, year = p.birth_date
            country = self.cities[p.birth_city]
            infobox = (f"{{{{Infobox person\n| name = {p.name}\n| birth_date = {{{{birth date|{year}|{month}|{day}}}}}\n"
                       f"| birth_place = [[{p.birth_city}]], [[{country}]]\n| occupation = {p.occupation}\n"
                       f"| employer = [[{p.employer}]]\n| alma_mater = [[{p.university}]]\n}}}}\n")
            body = " ".join(sentences.pop(p.name, []))
            cite = ref.format(k=country, y=self.rng.randint(1950, 2020), pg=self.rng.randint(1, 900))
            text = (f"{infobox}'''{p.name}''' is {_a(p.occupation)} from [[{country}]].{cite} {body}\n"
                    f"<!-- please add a photograph -->\n== Works ==\n{{| class=\"wikitable\"\n! Year !! Title\n|-\n"
                    f"| {p.work_year} || ''{p.work}''\n|}}\n== References ==\n<references />\n"
                    f"[[Category:{country} {p.occupation}s]]\n")
            yield p.name, 0, text, None
        for title in list(sentences):  # cities, organisations, universities, works
            intro = self._intro(title)
            lines = sentences.pop(title)
            text = f"'''{title}''' {intro}\n== Notable people ==\n" + "\n".join(f"* {s}" for s in lines)
            yield title, 0, text + "\n[[Category:Sample world]]\n", None
        for country, capital in self.countries.items():
            cities = [c for c, k in self.cities.items() if k == country]
            table = "\n".join(f"|-\n| [[{c}]] || {self.rng.randint(5, 900) * 1000}" for c in cities)
            text = (f"'''{country}''' is a country whose capital is [[{capital}]].\n== Cities ==\n"
                    f"{{| class=\"wikitable sortable\"\n! City !! Population\n{table}\n|}}\n")
            yield country, 0, text, None
        first = self.people[0]
        yield first.name.split()[0], 0, (f"'''{first.name.split()[0]}''' may refer to:\n* [[{first.name}]], "
                                         f"{_a(first.occupation)}\n* {first.name.split()[0]} River\n{{{{disambiguation}}}}\n"), None
        yield f"{first.birth_city} City", 0, f"#REDIRECT [[{first.birth_city}]]", first.birth_city
        yield "Category:Sample world", 14, "Articles about the sample world.", None
        yield "Template:Infobox person", 10, "{{{name}}} was born {{{birth_date}}}.", None

    def _intro(self, title: str) -> str:
        if title in self.cities:
            return f"is a city in [[{self.cities[title]}]]."
        if title in self.organisations:
            city, year = self.organisations[title]
            return f"is an organisation founded in {year} and based in [[{city}]]."
        if title in self.universities:
            return f"is a university in [[{self.universities[title]}]]."
        return "is a creative work."

    def write_dump(self, path: Path) -> None:
        with bz2.open(path, "wt", encoding="utf-8") as out:
            out.write('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" version="0.11" xml:lang="en">\n'
                      "  <siteinfo>\n    <sitename>Sample World</sitename>\n    <namespaces>\n"
                      '      <namespace key="0" case="first-letter" />\n'
                      '      <namespace key="10" case="first-letter">Template</namespace>\n'
                      '      <namespace key="14" case="first-letter">Category</namespace>\n'
                      "    </namespaces>\n  </siteinfo>\n")
            for page_id, (title, ns, text, redirect) in enumerate(self._pages(), start=1):
                redirect_tag = f'    <redirect title="{escape(redirect, {chr(34): "&quot;"})}" />\n' if redirect else ""
                out.write(f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{ns}</ns>\n    <id>{page_id}</id>\n"
                          f"{redirect_tag}    <revision>\n      <id>{100000 + page_id}</id>\n"
                          f"      <timestamp>2026-01-01T00:00:00Z</timestamp>\n"
                          f"      <contributor><username>SampleWorld</username><id>1</id></contributor>\n"
                          f'      <model>wikitext</model>\n      <format>text/x-wiki</format>\n'
                          f'      <text bytes="{len(text.encode())}" xml:space="preserve">{escape(text)}</text>\n'
                          f"    </revision>\n  </page>\n")
            out.write("</mediawiki>\n")

    # -- general text: background people only, so it states no question fact --

    def _write_general(self, path: Path) -> None:
        from corpus.wikitext import wikitext_to_text
        sentences = self.article_sentences(self.background, probe_wordings=True)
        places = [*self.cities, *self.organisations, *self.universities]
        for title in places:  # every place gets an article, with or without background people
            sentences.setdefault(title, [])
        with open(path, "w", encoding="utf-8") as fh:
            for i, (title, lines) in enumerate(sorted(sentences.items()), start=1):
                parts = [f"{title} {self._intro(title)}"] if title in places else []
                text = wikitext_to_text("\n".join(parts + [" ".join(lines)]))
                fh.write(json.dumps({"id": f"g{i}", "title": title, "text": text}, ensure_ascii=False) + "\n")

    # -- questions in three dataset formats --

    def _write_questions(self, files: WorldFiles) -> None:
        for dataset, splits in files.questions.items():
            for split, path in splits.items():
                path.parent.mkdir(parents=True, exist_ok=True)
                facts = [f for f in self.facts if f.dataset == dataset and f.split == split]
                if dataset == "nq":
                    with open(path, "w", encoding="utf-8") as fh:
                        for f in facts:
                            answers = [f.object] + ([f"{f.object}, {self.cities[f.object]}"] if f.relation == "born_in" else [])
                            fh.write(json.dumps({"question": f.question, "answer": answers}, ensure_ascii=False) + "\n")
                elif dataset == "webquestions":
                    records = [{"url": "http://www.freebase.com/view/en/" + f.subject.lower().replace(" ", "_"),
                                "targetValue": f"(list (description {_webq_value(f.object)}))",
                                "utterance": f.question} for f in facts]
                    path.write_text(json.dumps(records, ensure_ascii=False, indent=1), encoding="utf-8")
                else:
                    questions = []
                    for qid, f in enumerate(facts, start=1):
                        options = [f.object] + f.distractors
                        self.rng.shuffle(options)
                        questions.append({"qid": qid, "qtext": f.question[0].upper() + f.question[1:],
                                          "ra": options.index(f.object) + 1,
                                          "answers": [{"aid": k + 1, "atext": o} for k, o in enumerate(options)]})
                    exam = {"name": f"sampleworld-{split}", "category": "sampleworld", "year": "2026",
                            "questions": questions}
                    data = {"version": "1.0", "language": "en", "exams": {exam["name"]: exam}}
                    path.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")


class _Lexicon:
    """The invented target language: each lower-case English word has a fixed invented word; capitalised
    words and numbers (names, places, titles, years) stay; an adjective-like word (one of the title
    adjectives) follows its noun, so the task is not only word-for-word."""

    def __init__(self, rng: random.Random):
        self.names, self.words = _Names(rng), {}

    def word(self, english: str) -> str:
        if english not in self.words:
            self.words[english] = self.names.word(1 + min(3, len(english) // 3)).lower()
        return self.words[english]

    def translate(self, sentence: str) -> str:
        tokens = re.findall(r"[\w'’-]+|[^\w\s]", sentence)
        out = [t if (t[0].isupper() or t[0].isdigit() or not t[0].isalnum()) else self.word(t.lower()) for t in tokens]
        for k in range(len(tokens) - 1):  # "modest means" → "means modest"
            if tokens[k].lower() in _MOVABLE and tokens[k + 1][0].isalpha() and tokens[k + 1][0].islower():
                out[k], out[k + 1] = out[k + 1], out[k]
        return re.sub(r"\s+([^\w\s])", r"\1", " ".join(out))


_MOVABLE = {"modest", "many", "later", "native"}


def _plain(wikitext_sentence: str) -> str:
    return re.sub(r"\[\[|\]\]|''", "", wikitext_sentence)


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _webq_value(answer: str) -> str:
    """WebQuestions writes single words bare and anything with spaces, quotes or parentheses as a quoted string,
    with no escapes: a quote inside it stays as it is (the official files' own way)."""
    if " " in answer or '"' in answer or "(" in answer or ")" in answer:
        return f'"{answer}"'
    return answer


def generate(root: str | Path, seed: int = 13, people: int = 120, background_people: int = 600,
             mentions: int = 3, validation_share: float = 0.5) -> WorldFiles:
    """Generate a sample world into `root` (see the module docstring for the files)."""
    world = SampleWorld(seed=seed, people=people, background_people=background_people, mentions=mentions,
                        validation_share=validation_share)
    return world.write(root)
