"""Several trainings of one setting (its seeds) against a reference row on the same questions: does the setting
lead, beyond one training's luck and the questions' draw?

    python -m bench.seeds --home real-nq/.nkb r6-qa07-seed0 r6-qa07-seed1 r6-qa07-seed2 [--shots 5] \
        [--against base] [--against-shots 5] [--against-documents 3] [--split validation]

Reads each model's newest evaluation asked so (`bench.levers`' or the report's) from the warehouse's `predictions`.
Prints, and records as `metrics` rows in `bench/results/seeds`:
- each training's EM with its 95 % bootstrap interval; whether its lead is outside both intervals as the project's
  documents say it (`outside_both`: its EM above the reference's interval, the reference's below its own), and
  whether the two intervals are apart altogether (`apart`, the stricter test); its lead over the reference with a
  paired 95 % interval (the same questions drawn for both); the questions it answers that the reference misses and
  the reverse, and their exact sign test;
- over the trainings: the mean EM and the mean lead over the reference, each with a 95 % bootstrap interval over the
  questions (`nkb_model.metrics.seeds_intervals`), and how many trainings lead outside both intervals.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", required=True, help="the warehouse whose evaluations asked the models")
    parser.add_argument("models", nargs="+", help="the trainings' model names (one setting, its seeds)")
    parser.add_argument("--shots", type=int, default=5, help="the trainings' answers asked with this many examples")
    parser.add_argument("--against", default="base", help="the reference model (the row the setting should beat)")
    parser.add_argument("--against-shots", type=int, default=None,
                        help="the reference's answers asked with this many examples (default: --shots)")
    parser.add_argument("--against-documents", type=int, default=0,
                        help="the reference asked with this many retrieved documents in its prompt (3: the rag row)")
    parser.add_argument("--split", default="validation", help="the questions' split")
    parser.add_argument("--results", default="bench/results/seeds", help="benchmark warehouse for the figures")
    args = parser.parse_args(argv)

    from warehouse import Warehouse, WarehouseError
    try:
        wh = Warehouse(args.home, create=False)  # a mistyped --home: no warehouse there, not a new empty one
        reference = verdicts(wh, args.against, args.shots if args.against_shots is None else args.against_shots,
                             args.split, args.against_documents)
        trainings = {m: verdicts(wh, m, args.shots, args.split) for m in args.models}
        result = compared(trainings, reference)
    except (ValueError, WarehouseError) as exc:
        parser.error(str(exc))
    result = {"against": args.against, "against_documents": args.against_documents, "shots": args.shots,
              "split": args.split, **result}

    from bench import record
    record(Warehouse(args.results), "seeds", flat(result), vars(args))
    print(json.dumps(result, indent=1))
    return 0


def verdicts(wh, model: str, shots: int, split: str, documents: int = 0) -> dict[str, bool]:
    """{question id: right} of `model`'s newest evaluation asked `shots`-shot (with `documents` retrieved ones in
    its prompt) on `split`; ValueError naming what is missing."""
    import pyarrow.compute as pc

    from stages.names import answers_name
    from stages.report import latest_evaluation
    name = answers_name(model, shots, documents)
    run = latest_evaluation(wh, name, split)
    if run is None:
        raise ValueError(f"{model}: no successful evaluation asked {shots}-shot on the {split} split (answers filed "
                         f"as `{name}`) in {wh.home}")
    table = wh.read("predictions", ["question_id", "exact_match"], pc.field("run_id") == run.run_id,
                    [f"{name}.{split}"])
    return dict(zip(table.column("question_id").to_pylist(), map(bool, table.column("exact_match").to_pylist())))


def compared(trainings: dict[str, dict[str, bool]], reference: dict[str, bool]) -> dict:
    """Each training against the reference, then their mean: see the module's docstring."""
    from nkb_model.metrics import bootstrap_interval, seeds_intervals, sign_test
    questions = sorted(reference)
    for model, answers in trainings.items():
        if set(answers) != set(reference):
            raise ValueError(f"{model} was asked {len(answers)} questions, the reference {len(reference)}: "
                             f"{len(set(answers) ^ set(reference))} differ; compare evaluations of the same split")
    ref = [reference[q] for q in questions]
    reference_em, ref_interval = 100 * sum(ref) / len(ref), bootstrap_interval([ref])
    rows, hits = [], []
    for model, answers in trainings.items():
        right = [answers[q] for q in questions]
        hits.append(right)
        em, interval = 100 * sum(right) / len(right), bootstrap_interval([right])
        gained = sum(a and not r for a, r in zip(right, ref))
        lost = sum(r and not a for a, r in zip(right, ref))
        rows.append({"model": model, "em": round(em, 2), "interval": rounded(interval),
                     "lead_interval": rounded(seeds_intervals([right], ref)["lead"]),
                     "gained": gained, "lost": lost, "sign_test_p": round(sign_test(gained, lost), 4),
                     **outside(em, interval, reference_em, ref_interval)})
    pooled = seeds_intervals(hits, ref)
    mean = 100 * sum(map(sum, hits)) / (len(hits) * len(questions))
    return {"questions": len(questions), "reference_em": round(reference_em, 2),
            "reference_interval": rounded(ref_interval), "trainings": rows,
            "outside_both": sum(r["outside_both"] for r in rows), "apart": sum(r["apart"] for r in rows),
            "mean_em": round(mean, 2), "mean_interval": rounded(pooled["mean"]),
            "mean_lead": round(mean - reference_em, 2), "lead_interval": rounded(pooled["lead"])}


def outside(em: float, interval, reference_em: float, reference_interval) -> dict[str, bool]:
    """`outside_both`: each EM beyond the other's interval; `apart`: the intervals disjoint. On the figures as
    printed (two decimals): a percentile's interpolation leaves 3.5000000000000004 where a touching end is 3.5."""
    (low, high), (ref_low, ref_high) = rounded(interval), rounded(reference_interval)
    em, reference_em = round(em, 2), round(reference_em, 2)
    return {"outside_both": (em > ref_high and reference_em < low) or (em < ref_low and reference_em > high),
            "apart": low > ref_high or high < ref_low}


def rounded(interval) -> list[float]:
    return [round(v, 2) for v in interval]


def flat(result: dict) -> dict:
    """The figures as `record` keeps them: each training's under its name, intervals as their two ends."""
    out = {}
    for key, value in result.items():
        if isinstance(value, list) and len(value) == 2 and all(isinstance(v, float) for v in value):
            out[f"{key}_low"], out[f"{key}_high"] = value
        elif key == "trainings":
            for row in value:
                out |= {f"{row['model']}.{k}": v for k, v in flat(row).items() if k != "model"}
        else:
            out[key] = value
    return out


if __name__ == "__main__":
    sys.exit(main())
