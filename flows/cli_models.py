"""`nkb edit` and `nkb export`: changing a model's facts, and taking a model away."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from flows.cli_common import config_from_options, config_options
from stages.configs import EditConfig, validation_problems
from warehouse import Warehouse


def cmd_edit(args) -> int:
    from stages.runner import dispatch
    try:
        config = config_from_options(EditConfig, args)
    except ValidationError as exc:
        raise SystemExit(f"error: {validation_problems(exc)[0].removeprefix('config: ')}") from None
    if config.edits:  # a wrong file is found before the model is loaded
        from stages.knowledge import read_edits
        read_edits(config.edits)
    result = dispatch("edit", Warehouse(args.home), config)
    v = result.value or {}
    if result.skipped:
        print(f"this edit was already made: model {result.run.checkpoint} (run {result.run.run_id})")
        return 0
    how = f"λ = {config.lam:g}" if config.lam else f"strength {config.strength:g}"
    print(f"edited model: {v['model']} (from {config.model}, which is unchanged); {how}, "
          f"{v['slots_edited']} slot(s) edited; the log is in {result.run.checkpoint}/nkb-model.json")
    if config.edits:
        print(f"  {v['edits']} edits: success {v['success']} %, generalisation (paraphrases) {v['generalization']} %, "
              f"locality (unedited questions unchanged) {v['locality']} %")
        return 0
    print(f"  old answer: {v['old_answer']!r}\n  new answer: {v['new_answer']!r}"
          f"{'  (the whole wanted answer)' if v['whole_answer'] else '  (not yet the whole wanted answer)'}")
    if not v["whole_answer"]:
        print("  a larger --strength edits harder, at the price of changing more unrelated answers")
    return 0


def cmd_export(args) -> int:
    from stages.export import export_model
    target = export_model(Warehouse(args.home, create=False), args.model, Path(args.folder), adapter=args.adapter)
    if args.adapter:
        print(f"exported {args.model} to {target}: the base and, in nkb/, its slots; load it with "
              "nkb_model.checkpoint.load_model (see its README.md)")
    else:
        print(f"exported {args.model} to {target}: a stock model, the slots merged into its feed-forward layers\n"
              f"  its README.md says how to load it (AutoModelForSeq2SeqLM or AutoModelForCausalLM) and prompt it")
    return 0


def add_commands(sub) -> None:
    ed = sub.add_parser("edit", help="edit facts in a model's NKB, saved as a new model version",
                        description="Knowledge surgery: at each step of the wanted answer, the slot most particular "
                                    "to the question (--slot) gets v += λ (e_wanted − e_predicted), with λ set by a "
                                    "relative strength (the edit adds a vector STRENGTH times as long as the model's "
                                    "residual stream at that step) or given as the paper's absolute λ. "
                                    "The result is a new model (the old one stays selectable by its name) with an "
                                    "edit log. --edits applies many edits and reports success, generalisation to "
                                    "paraphrases and locality.")
    config_options(ed, EditConfig)
    ed.set_defaults(func=cmd_edit)

    ex = sub.add_parser("export", help="write a model as a folder that stock transformers loads",
                        description="Write a warehouse model to a new folder that "
                                    "`AutoModelForSeq2SeqLM` (T5) or `AutoModelForCausalLM` (GPT-2, Llama-style) and "
                                    "`AutoTokenizer` load with no project code: its NKB slots merged into the "
                                    "model's feed-forward layers as extra neurons (same outputs), with a "
                                    "model card (README.md: prompt format, how it was built, scores).")
    ex.add_argument("model", help="the model's name (e.g. base+nkb.qa; `nkb runs` lists them) or folder")
    ex.add_argument("folder", help="the folder to write (must not exist, or be empty)")
    ex.add_argument("--adapter", action="store_true", help="instead write the base plus the slots apart (nkb/, "
                                                           "with the base's name and SHA-256), to swap slots")
    ex.set_defaults(func=cmd_export)
