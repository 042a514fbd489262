"""Prefect flows: one per stage, plus `pipeline`. They only wire: call the stage, log, publish an artifact.

No `from __future__ import annotations` here: Prefect reads the parameter types to validate
parameters and to draw the UI's run form.
"""

import functools
import os
import time
from typing import Optional

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows import stages
from flows.registry import STAGES, Stage
from flows.report_plot import report_markdown
from flows.configs import (AnalyzeConfig, BaseModelConfig, EvaluateConfig, FinetuneConfig, IndexConfig, InjectConfig,
                           ModelsConfig, ReportConfig, RetrieveConfig, SalientSpansConfig, SampleWorldConfig,
                           SurgeryConfig)
from warehouse import Warehouse, resolve_home


@task(name="ner-shard")
def ner_shard_task(job: stages.NerShard) -> int:
    return stages.ner_shard(job)


@flow(name="salient-spans-shards", description="NER shards of a salient-spans run, one task each.")
def ner_shards_flow(jobs: list[stages.NerShard]) -> list[int]:
    futures = ner_shard_task.map(jobs)
    return [future.result() for future in futures]


def dask_shard_mapper(address: str):
    """Runs NER shards as Prefect tasks on Dask: `address` is a scheduler (tcp://...), 'local' (a local
    cluster with one single-threaded worker process per core) or 'local:N' (N workers)."""
    from prefect_dask import DaskTaskRunner
    if address == "local" or address.startswith("local:"):
        workers = int(address.partition(":")[2] or os.cpu_count() or 1)
        runner = DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 1})
    else:
        runner = DaskTaskRunner(address=address)
    return lambda jobs: ner_shards_flow.with_options(task_runner=runner)(jobs) if jobs else []


def _stage_runner(stage: Stage, config):
    if stage.name == "salient-spans" and config.dask:
        return functools.partial(stage.run, map_shards=dask_shard_mapper(config.dask))
    return stage.run


def _stage_flow(stage: Stage):
    config_type = stage.config

    def run_stage_flow(config: config_type, home: Optional[str] = None, force: bool = False) -> dict:
        logger = get_run_logger()
        started = time.perf_counter()
        wh = Warehouse(home)
        result = _stage_runner(stage, config)(wh, config, force)
        row = stages.summarize(stage.name, result, time.perf_counter() - started)
        if result.skipped:
            logger.info("Skipped %s: its inputs are unchanged since run %s (finished %s). Set force=true to rerun.",
                        stage.name, result.run.run_id, result.run.finished_at)
        else:
            logger.info("%s wrote %s in %.1f s (run %s)", stage.name, result.run.outputs, row["seconds"],
                        result.run.run_id)
        create_table_artifact(key=f"{stage.name}-run", table=[row], description=f"{stage.name}: {stage.summary}")
        if stage.name == "report":
            create_markdown_artifact(key="nkb-report", markdown=report_markdown(wh),
                                     description="The paper's Table 3 on this warehouse, with loss curves and EM")
        return row

    run_stage_flow.__name__ = f"{stage.name.replace('-', '_')}_flow"
    run_stage_flow.__doc__ = stage.summary
    # persist_result: a pipeline that dispatched this flow to a worker reads the summary row back.
    return flow(name=stage.name, description=stage.summary, log_prints=True, persist_result=True)(run_stage_flow)


sample_world_flow = _stage_flow(STAGES["sample-world"])
ingest_flow = _stage_flow(STAGES["ingest"])
questions_flow = _stage_flow(STAGES["questions"])
generation_data_flow = _stage_flow(STAGES["generation-data"])
index_flow = _stage_flow(STAGES["index"])
retrieve_flow = _stage_flow(STAGES["retrieve"])
salient_spans_flow = _stage_flow(STAGES["salient-spans"])
base_model_flow = _stage_flow(STAGES["base-model"])
inject_flow = _stage_flow(STAGES["inject"])
finetune_flow = _stage_flow(STAGES["finetune"])
evaluate_flow = _stage_flow(STAGES["evaluate"])
report_flow = _stage_flow(STAGES["report"])
analyze_flow = _stage_flow(STAGES["analyze"])
surgery_flow = _stage_flow(STAGES["surgery"])
edit_flow = _stage_flow(STAGES["edit"])


def run_stage(name: str, config, home: Optional[str], force: bool, dispatch: bool = False) -> dict:
    """Run one stage's flow: in this process, or (dispatch, GPU-pool stages) through its deployment on
    the `gpu` work pool, waiting for it and failing if it fails."""
    stage = STAGES[name]
    if not (dispatch and stage.pool == "gpu"):
        return STAGE_FLOWS[name](config, home, force)
    from prefect.deployments import run_deployment
    # The worker runs elsewhere: hand it the warehouse as an absolute path, not "the default".
    parameters = {"config": config.model_dump(mode="json"), "home": str(resolve_home(home)), "force": force}
    flow_run = run_deployment(f"{name}/{name}", parameters=parameters, timeout=None)
    state = flow_run.state
    if state is None or not state.is_completed():
        raise RuntimeError(f"stage {name}: deployment run {flow_run.name!r} ended "
                           f"{state.name if state else 'without a state'}: {state.message if state else ''}")
    get_run_logger().info("%s ran on the %s pool as flow run %s", name, stage.pool, flow_run.name)
    return state.result()


@flow(name="table3", description="The paper's Table 3 on the warehouse's data: train, fine-tune and evaluate "
                                 "every model row, then report.", log_prints=True)
def table3(models: ModelsConfig = ModelsConfig(), home: Optional[str] = None, force: bool = False,
           dispatch: bool = False) -> list[dict]:
    """Base, larger base and random-init models; NKB and NKB-a injection; QA fine-tuning and evaluation of each
    row; the report with the knowledge probe and the no-forgetting check. dispatch: run these GPU stages
    through their deployments (workers on the `gpu` pool) instead of in this process."""
    def run(name: str, config) -> dict:
        return run_stage(name, config, home, force, dispatch)

    wanted, device = models.rows, models.device
    pretrain = BaseModelConfig(size=models.base_size, steps=models.pretrain_steps,
                               batch_size=models.pretrain_batch_size, lr=models.pretrain_lr,
                               lr_decay=models.pretrain_lr_decay, ssm_share=models.pretrain_ssm_share,
                               ssm_max_words=models.max_words, device=device)
    rows = [run("base-model", pretrain)]
    if "transformer" in wanted:
        rows.append(run("base-model", pretrain.model_copy(update={"name": "transformer", "steps": 0})))
    if "large" in wanted:
        large = {"name": "large", "size": models.large_size, "steps": models.large_steps or models.pretrain_steps}
        rows.append(run("base-model", pretrain.model_copy(update=large)))
    injection = InjectConfig(steps=models.inject_steps, batch_size=models.inject_batch_size, lr=models.inject_lr,
                             layers=models.inject_layers, slots=models.slots,
                             general_share=models.inject_general_share, device=device)
    if "base+nkb" in wanted:
        rows.append(run("inject", injection))
    if "base+nkb-a" in wanted:
        rows.append(run("inject", injection.model_copy(update={"variant": "nkb-a", "steps": models.nkb_a_steps,
                                                               "lr": models.nkb_a_lr})))
    evaluated = [name for name in ("transformer", "base", "base+nkb", "base+nkb-a", "large") if name in wanted]
    for name in evaluated:
        rows.append(run("finetune", FinetuneConfig(model=name, epochs=models.finetune_epochs, lr=models.finetune_lr,
                                                   answer_format=models.answer_format, device=device)))
        rows.append(run("evaluate", EvaluateConfig(model=f"{name}.qa", device=device)))
    for name in ("base", "base+nkb", "base+nkb-a"):  # does injection hurt general generation? (Table 4)
        if name in wanted:
            for task in models.generation_tasks:
                rows.append(run("finetune", FinetuneConfig(model=name, task=task, epochs=models.generation_epochs,
                                                           lr=models.finetune_lr, device=device)))
                rows.append(run("evaluate", EvaluateConfig(model=f"{name}.{task}", device=device)))
    for mode in ("kformer", "concat"):  # the base with retrieved documents, on the same fine-tuning budget
        if mode in wanted:
            rows.append(run("finetune", FinetuneConfig(model="base", name=f"base.{mode}", knowledge=mode,
                                                       epochs=models.finetune_epochs, lr=models.finetune_lr,
                                                       answer_format=models.answer_format, device=device)))
            rows.append(run("evaluate", EvaluateConfig(model=f"base.{mode}", device=device)))
    optional = {field: name if row in wanted else None
                for field, row, name in (("transformer", "transformer", "transformer"), ("nkb", "base+nkb", "base+nkb"),
                                         ("nkb_a", "base+nkb-a", "base+nkb-a"), ("large", "large", "large"),
                                         ("kformer", "kformer", "base.kformer"), ("concat", "concat", "base.concat"))}
    rows.append(run("report", ReportConfig(**optional, generation_tasks=models.generation_tasks, device=device)))
    return rows


@flow(name="pipeline", description="The whole pipeline on the sample world.", log_prints=True)
def pipeline(world: SampleWorldConfig = SampleWorldConfig(), home: Optional[str] = None, force: bool = False,
             train_models: bool = True, models: ModelsConfig = ModelsConfig(), dispatch: bool = False) -> list[dict]:
    """Generate the sample world, ingest its corpora, load its QA datasets, index the knowledge corpus,
    retrieve the top-3 documents per question, find their salient spans, and (with `train_models`)
    run the Table 3 flow, then analyse and edit base+NKB's slots. dispatch: GPU-pool stages run through their deployments (needs a server with
    a worker on the `gpu` pool, see `nkb server up`); otherwise everything runs in this process."""
    rows = [sample_world_flow(world, home, force)]
    ingests, question_sets = stages.sample_world_inputs(Warehouse(home))
    rows += [ingest_flow(config, home, force) for config in ingests]
    rows += [questions_flow(config, home, force) for config in question_sets]
    rows += [generation_data_flow(config, home, force) for config in stages.generation_inputs(Warehouse(home))]
    rows.append(index_flow(IndexConfig(), home, force))
    rows.append(retrieve_flow(RetrieveConfig(), home, force))
    rows.append(salient_spans_flow(SalientSpansConfig(max_words=models.max_words), home, force))
    if train_models:
        rows += table3(models, home, force, dispatch)
        if "base+nkb" in models.rows:  # what the slots hold, and editing them (the paper's sections 5 and 6)
            rows.append(run_stage("analyze", AnalyzeConfig(device=models.device), home, force, dispatch))
            rows.append(run_stage("surgery", SurgeryConfig(device=models.device), home, force, dispatch))
    create_table_artifact(key="pipeline-run", table=rows, description="Stages of this pipeline run")
    return rows


STAGE_FLOWS = {"sample-world": sample_world_flow, "ingest": ingest_flow, "questions": questions_flow,
               "generation-data": generation_data_flow,
               "index": index_flow, "retrieve": retrieve_flow, "salient-spans": salient_spans_flow,
               "base-model": base_model_flow, "inject": inject_flow, "finetune": finetune_flow,
               "evaluate": evaluate_flow, "report": report_flow, "analyze": analyze_flow, "surgery": surgery_flow,
               "edit": edit_flow}
