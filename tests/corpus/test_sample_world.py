import bz2
import json
import re

from corpus.documents import read_documents
from corpus.qa import read_questions
from corpus.sample_world import DATASETS, PROBE_WORDINGS, QUESTION_WORDINGS, WorldFiles, generate
from corpus.sample_world_sizes import split_sizes


def load_facts(files: WorldFiles) -> list[dict]:
    return [json.loads(line) for line in open(files.facts, encoding="utf-8")]


def test_same_seed_same_bytes(tmp_path):
    a = generate(tmp_path / "a", seed=3, people=10, background_people=5)
    b = generate(tmp_path / "b", seed=3, people=10, background_people=5)
    c = generate(tmp_path / "c", seed=4, people=10, background_people=5)
    for pa_, pb, pc in zip(a.all_paths(), b.all_paths(), c.all_paths()):
        assert pa_.read_bytes() == pb.read_bytes(), pa_.name
    assert a.facts.read_bytes() != c.facts.read_bytes()


def test_every_fact_is_stated_in_at_least_two_articles(world_dir):
    files = WorldFiles.at(world_dir)
    docs = list(read_documents(files.knowledge_dump))
    for fact in load_facts(files):
        stating = [d.title for d in docs if fact["subject"] in d.text and fact["object"] in d.text]
        assert len(stating) >= 2, (fact, stating)


def test_dump_exercises_the_cleaner(world_dir):
    with bz2.open(WorldFiles.at(world_dir).knowledge_dump, "rt", encoding="utf-8") as fh:
        xml = fh.read()
    for marker in ("{{Infobox person", "&lt;ref&gt;", '{| class="wikitable"', "<redirect title=", "{{disambiguation}}",
                   "<ns>14</ns>", "<ns>10</ns>", "&lt;!--", "[[Category:"):
        assert marker in xml, marker
    assert re.search(r"[^\x00-\x7f]", xml), "expected non-ASCII names"


def test_question_and_probe_wordings_never_occur_in_articles(world_dir):
    files = WorldFiles.at(world_dir)
    corpus = "\n".join(d.text.lower() for d in read_documents(files.knowledge_dump))
    for wordings in list(QUESTION_WORDINGS.values()) + list(PROBE_WORDINGS.values()):
        for template in wordings:
            for piece in template.replace("<extra_id_0>", "{P}").split("{P}"):
                piece = piece.strip(" ?.").lower()
                if len(piece) > 8:
                    assert piece not in corpus, piece


def test_general_text_states_no_question_fact(world_dir):
    files = WorldFiles.at(world_dir)
    general = files.general_text.read_text(encoding="utf-8")
    subjects = {f["subject"] for f in load_facts(files)}
    assert general and not [s for s in subjects if s in general]


def test_question_files_go_through_the_readers_and_match_the_facts(world_dir):
    files = WorldFiles.at(world_dir)
    facts = load_facts(files)
    for dataset, splits in files.questions.items():
        for split, path in splits.items():
            questions = list(read_questions(path, DATASETS[dataset]))
            expected = [f for f in facts if f["dataset"] == dataset and f["split"] == split]
            assert [f"{dataset}/{split}/{q.local_id}" for q in questions] == [f["question_id"] for f in expected]
            assert [q.answers[0] for q in questions] == [f["object"] for f in expected]
            assert [q.question.lower() for q in questions] == [f["question"].lower() for f in expected]


def test_probes_mask_the_answer(world_dir):
    files = WorldFiles.at(world_dir)
    probes = [json.loads(line) for line in open(files.probes, encoding="utf-8")]
    assert len([p for p in probes if p["wording"] == "unseen"]) == 2 * len(load_facts(files))
    for p in probes:
        assert p["prompt"].count("<extra_id_0>") == 1 and p["answer"] not in p["prompt"]
    # "seen" prompts are sentences of the knowledge corpus with the answer masked
    corpus = "\n".join(d.text for d in read_documents(files.knowledge_dump))
    seen = [p for p in probes if p["wording"] == "seen"]
    assert len(seen) == len(load_facts(files))
    assert all(p["prompt"].replace("<extra_id_0>", p["answer"]) in corpus for p in seen)


def test_splits_have_both_train_and_validation(world_dir):
    splits = {(f["dataset"], f["split"]) for f in load_facts(WorldFiles.at(world_dir))}
    assert splits == {(d, s) for d in DATASETS for s in ("train", "validation")}


def test_no_article_states_a_fact_twice(world_dir):
    """Masking one statement of a fact must not leave another statement of it in the same article."""
    from corpus.segment import sentences
    files = WorldFiles.at(world_dir)
    docs = list(read_documents(files.knowledge_dump))
    facts = load_facts(files)
    names = {f["object"] for f in facts}
    for fact in facts:
        # "Reinkrem" inside "Polytechnic of Reinkrem" names another entity, not the birthplace.
        longer = sorted((n for n in names if fact["object"] in n and n != fact["object"]), key=len, reverse=True)
        for d in docs:
            if d.title == fact["object"]:
                continue  # an article about the object names it everywhere; that is not this fact
            stating = []
            for a, b in sentences(d.text):
                sentence = d.text[a:b]
                for other in longer:
                    sentence = sentence.replace(other, "")
                if fact["subject"] in sentence and fact["object"] in sentence:
                    stating.append(sentence)
            assert len(stating) <= 1, (fact["fact_id"], d.title, stating)


def test_each_dataset_gets_a_third_of_the_facts_split_by_the_validation_share(tmp_path):
    files = generate(tmp_path, seed=5, people=12, background_people=2, validation_share=0.25)
    counts: dict[tuple[str, str], int] = {}
    for f in load_facts(files):
        counts[(f["dataset"], f["split"])] = counts.get((f["dataset"], f["split"]), 0) + 1
    # 12 people x 5 facts = 20 per dataset, a quarter of them for validation
    assert counts == {(d, s): 5 if s == "validation" else 15 for d in DATASETS for s in ("train", "validation")}


def test_the_size_of_each_split_is_known_from_the_settings_before_the_world_is_written(tmp_path):
    """What an experiment checks its shots against before the sample-world stage has run."""
    for people, share in ((7, 0.5), (13, 0.3)):  # 35 and 65 facts: the datasets' shares differ by one
        files = generate(tmp_path / f"w{people}", seed=2, people=people, background_people=0, validation_share=share)
        written = {(d, s): sum(1 for _ in read_questions(path, DATASETS[d]))
                   for d, splits in files.questions.items() for s, path in splits.items()}
        assert split_sizes(people, share) == written


def test_edits_change_validation_facts_to_a_wrong_answer_of_their_kind(world_dir):
    from corpus.sample_world import SampleWorld
    files = WorldFiles.at(world_dir)
    facts = {f["fact_id"]: f for f in load_facts(files)}
    distractors = {f.fact_id: f.distractors for f in SampleWorld(seed=7, people=30, background_people=20).facts}
    edits = [json.loads(line) for line in open(files.edits, encoding="utf-8")]
    assert len(edits) == 20 and len({e["fact_id"] for e in edits}) == 20
    for e in edits:
        fact = facts[e["fact_id"]]
        assert fact["split"] == "validation" and e["question"] == fact["question"]
        assert e["answer"] != fact["object"] and e["answer"] in distractors[e["fact_id"]]
        wordings = [w.format(P=fact["subject"]) for w in QUESTION_WORDINGS[fact["relation"]]]
        assert e["question"] not in e["paraphrases"] and set(e["paraphrases"]) == set(wordings) - {e["question"]}
