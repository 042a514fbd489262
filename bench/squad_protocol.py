"""SQuAD as a closed-book-after-reading protocol: the paragraphs of a slice of SQuAD's train-set articles as the
knowledge, their questions as QA, and the demo's experiment (with the settings measured on real text) over them.

    python -m bench.squad_protocol train-v2.0.json --out squad [--validation 1000] [--split paragraph|article]
    nkb --home squad/.nkb pipeline squad/squad-smollm2.yaml

Articles are taken in the file's order until the validation split holds `--validation` answerable questions.
`--split paragraph` (the default) alternates each paragraph's questions between train and validation, so that every
validation question's paragraph also trained some question; `--split article` alternates whole articles, so that a
validation article's questions never train (its paragraphs are knowledge all the same). General text (the held-out
loss) is the paragraphs of the next `--general` articles, which are never knowledge. SQuAD's dev set stays out of
every choice: it is the held-out check a finished setting is run on (`--dev`: its articles, split the same way).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from bench.real_passages import experiment, steps_for
from corpus.squad import Paragraph, read_squad
from stages.experiment import SAMPLE_WORLD_SMOLLM2

EXPERIMENT = "squad-smollm2.yaml"


def protocol(paragraphs: tuple[Paragraph, ...], validation: int, by: str, general: int) -> dict[str, list]:
    """{knowledge, general, train, validation}: the first articles whose split reaches `validation` answerable
    questions, split by paragraph or by article, and the next `general` articles' paragraphs as general text."""
    if by not in ("paragraph", "article"):
        raise ValueError(f"split by {by!r}: by paragraph or by article")
    if general < 1:
        raise ValueError("general text needs at least one article (the held-out loss is measured on it)")
    articles: dict[int, list[Paragraph]] = {}
    for p in paragraphs:
        articles.setdefault(p.article, []).append(p)
    parts: dict[str, list] = {"knowledge": [], "general": [], "train": [], "validation": []}
    order = list(articles)
    used = 0
    for used, article in enumerate(order, 1):
        for paragraph in articles[article]:
            parts["knowledge"].append(paragraph)
            asked = [q for q in paragraph.questions if q.answers]
            for n, question in enumerate(asked):
                held = n % 2 == 1 if by == "paragraph" else article % 2 == 1
                parts["validation" if held else "train"].append(question)
        if len(parts["validation"]) >= validation:
            break
    else:
        raise ValueError(f"the file's {len(order)} articles give {len(parts['validation'])} validation questions, "
                         f"fewer than the {validation} asked")
    parts["general"] = [p for a in order[used:used + general] for p in articles[a]]
    if not parts["general"]:
        raise ValueError(f"no article is left after the knowledge's {used} for general text (the held-out loss)")
    return parts


def write(out: Path, parts: dict[str, list], steps: int, name: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for part in ("knowledge", "general"):
        (out / f"{part}.jsonl").write_text("".join(
            json.dumps({"id": p.doc_id, "title": p.title, "text": p.context}) + "\n" for p in parts[part]))
    for split in ("train", "validation"):
        (out / f"{split}.jsonl").write_text("".join(
            json.dumps({"id": q.qid, "question": q.question, "answers": list(q.answers)}) + "\n"
            for q in parts[split]))
    (out / EXPERIMENT).write_text(f"# Written by python -m bench.squad_protocol: {SAMPLE_WORLD_SMOLLM2.name}'s settings, "
                                  "SQuAD's paragraphs and questions\n"
                                  + yaml.safe_dump(experiment(SAMPLE_WORLD_SMOLLM2, steps, name, "squadwiki", "squad",
                                                              "knowledge.jsonl"), sort_keys=False))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.squad_protocol", description=__doc__.split("\n\n")[0])
    parser.add_argument("squad", type=Path, help="SQuAD's train-v1.1.json or train-v2.0.json (or, --dev, a dev file)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the data and the experiment file")
    parser.add_argument("--validation", type=int, default=1000, help="answerable validation questions at least")
    parser.add_argument("--split", choices=("paragraph", "article"), default="paragraph",
                        help="paragraph: each paragraph's questions alternate; article: whole articles alternate")
    parser.add_argument("--general", type=int, default=5,
                        help="the next articles (at least 1) whose paragraphs are general text")
    parser.add_argument("--steps", type=int, help="the injection's steps (default: 3 a paragraph, in hundreds)")
    parser.add_argument("--dev", action="store_true", help="the file is a dev set: the held-out check, not a choice")
    args = parser.parse_args(argv)
    try:
        squad = read_squad(args.squad)
        parts = protocol(squad.paragraphs, args.validation, args.split, args.general)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    steps = args.steps or steps_for(len(parts["knowledge"]))
    name = f"squad-{'dev' if args.dev else 'train'}-by-{args.split}-smollm2"
    write(args.out, parts, steps, name)
    left_out = len(squad.questions(answerable=False))
    print(f"{len(parts['knowledge'])} paragraphs, {len(parts['train'])} train and {len(parts['validation'])} "
          f"validation questions (by {args.split}), {len(parts['general'])} general paragraphs, {steps} steps; "
          f"{left_out} unanswerable questions in the file left out: nkb --home {args.out}/.nkb pipeline "
          f"{args.out / EXPERIMENT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
