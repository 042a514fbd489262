"""Prefect flows: one per stage, `table3` and `pipeline`. They only wire: run the stage, log, publish artifacts.

Every stage flow is made from the stage registry; the module exposes each as `<stage>_flow` (e.g.
`ingest_flow`), the entrypoints of `prefect.yaml`. No `from __future__ import annotations` here: Prefect
reads the parameter types to validate parameters and to draw the UI's run form.
"""

import os
import time
from typing import Optional

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.deployments import flow_attribute
from flows.errors import quiet_user_errors
from stages.configs import (AnalyzeConfig, EvaluateConfig, IndexConfig, ModelsConfig, ReportConfig, RetrieveConfig,
                            SampleWorldConfig, SurgeryConfig)
from stages.data import NerShard, generation_inputs, ner_shard, sample_world_inputs
from stages.registry import STAGES, Stage
from stages.runner import run_stage, summarize
from warehouse import Warehouse, resolve_home


@task(name="ner-shard")
def ner_shard_task(job: NerShard) -> int:
    return ner_shard(job)


@flow(name="salient-spans-shards", description="NER shards of a salient-spans run, one task each.")
def ner_shards_flow(jobs: list[NerShard]) -> list[int]:
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


def _stage_flow(stage: Stage):
    config_type = stage.config

    def run_stage_flow(config: config_type, home: Optional[str] = None, force: bool = False) -> dict:
        quiet_user_errors()
        logger = get_run_logger()
        started = time.perf_counter()
        wh = Warehouse(home)
        dask = getattr(config, "dask", None)
        options = {"map_shards": dask_shard_mapper(dask)} if dask else {}
        result = run_stage(stage.name, wh, config, force, **options)
        row = summarize(stage.name, result, time.perf_counter() - started)
        if result.skipped:
            logger.info("Skipped %s: its inputs are unchanged since run %s (finished %s). Set force=true to rerun.",
                        stage.name, result.run.run_id, result.run.finished_at)
        else:
            logger.info("%s wrote %s in %.1f s (run %s)", stage.name, result.run.outputs, row["seconds"],
                        result.run.run_id)
        create_table_artifact(key=f"{stage.name}-run", table=[row], description=f"{stage.name}: {stage.summary}")
        if stage.name == "report":
            from stages.report_plot import report_markdown
            create_markdown_artifact(key="nkb-report", markdown=report_markdown(wh),
                                     description="The paper's Table 3 on this warehouse, with loss curves and EM")
        return row

    run_stage_flow.__name__ = flow_attribute(stage.name)
    run_stage_flow.__doc__ = stage.summary
    # persist_result: a pipeline that dispatched this flow to a worker reads the summary row back.
    return flow(name=stage.name, description=stage.summary, log_prints=True, persist_result=True)(run_stage_flow)


STAGE_FLOWS = {name: _stage_flow(stage) for name, stage in STAGES.items()}
globals().update({flow_attribute(name): stage_flow for name, stage_flow in STAGE_FLOWS.items()})


def run(name: str, config, home: Optional[str], force: bool, dispatch: bool = False) -> dict:
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
    row; the report with the knowledge probe and the no-forgetting check. dispatch: run the GPU stages
    through their deployments (workers on the `gpu` pool) instead of in this process."""
    quiet_user_errors()
    wanted = models.rows

    def go(name: str, config) -> dict:
        if models.device != "auto" and "device" in type(config).model_fields:
            config = config.model_copy(update={"device": models.device})
        return run(name, config, home, force, dispatch)

    rows = [go("pretraining-data", models.pretraining)]
    if models.base.ssm_share:
        rows.append(go("salient-spans", models.spans.model_copy(update={"corpus": models.pretraining.corpus,
                                                                         "source": "pretraining"})))
    rows.append(go("base-model", models.base))
    if "transformer" in wanted:
        rows.append(go("base-model", models.base.model_copy(update={"name": "transformer", "steps": 0})))
    if "large" in wanted:
        large = {"name": "large", "size": models.large_size, "steps": models.large_steps or models.base.steps}
        rows.append(go("base-model", models.base.model_copy(update=large)))
    if "base+nkb" in wanted:
        rows.append(go("inject", models.inject))
    if "base+nkb-a" in wanted:
        rows.append(go("inject", models.inject.model_copy(update={"variant": "nkb-a", "steps": models.nkb_a_steps,
                                                                  "lr": models.nkb_a_lr})))
    qa = models.finetune.model_copy(update={"name": None, "task": None, "knowledge": "none"})
    for name in ("transformer", "base", "base+nkb", "base+nkb-a", "large"):
        if name in wanted:
            rows.append(go("finetune", qa.model_copy(update={"model": name})))
            rows.append(go("evaluate", EvaluateConfig(model=f"{name}.qa")))
    for name in ("base", "base+nkb", "base+nkb-a"):  # does injection hurt general generation? (Table 4)
        if name in wanted:
            for task_name in models.generation_tasks:
                rows.append(go("finetune", qa.model_copy(update={"model": name, "task": task_name, "answer_format": "plain",
                                                                 "epochs": models.generation_epochs})))
                rows.append(go("evaluate", EvaluateConfig(model=f"{name}.{task_name}")))
    for mode in ("kformer", "concat"):  # the base with retrieved documents, on the same fine-tuning budget
        if mode in wanted:
            rows.append(go("finetune", qa.model_copy(update={"model": "base", "name": f"base.{mode}", "knowledge": mode})))
            rows.append(go("evaluate", EvaluateConfig(model=f"base.{mode}")))
    optional = {field: name if row in wanted else None
                for field, row, name in (("transformer", "transformer", "transformer"), ("nkb", "base+nkb", "base+nkb"),
                                         ("nkb_a", "base+nkb-a", "base+nkb-a"), ("large", "large", "large"),
                                         ("kformer", "kformer", "base.kformer"), ("concat", "concat", "base.concat"))}
    rows.append(go("report", ReportConfig(**optional, generation_tasks=models.generation_tasks)))
    return rows


@flow(name="pipeline", description="The whole pipeline on the sample world.", log_prints=True)
def pipeline(world: SampleWorldConfig = SampleWorldConfig(), home: Optional[str] = None, force: bool = False,
             train_models: bool = True, models: ModelsConfig = ModelsConfig(), dispatch: bool = False) -> list[dict]:
    """Generate the sample world, ingest its corpora, load its QA datasets, index the knowledge corpus,
    retrieve the top-3 documents per question, find their salient spans, and (with `train_models`) run the
    Table 3 flow, then analyse and edit base+NKB's slots. dispatch: GPU-pool stages run through their
    deployments (needs a server with a worker on the `gpu` pool, see `nkb server up`); otherwise everything
    runs in this process."""
    quiet_user_errors()
    rows = [run("sample-world", world, home, force)]
    ingests, question_sets = sample_world_inputs(Warehouse(home))
    rows += [run("ingest", config, home, force) for config in ingests]
    rows += [run("questions", config, home, force) for config in question_sets]
    rows += [run("generation-data", config, home, force) for config in generation_inputs(Warehouse(home))]
    rows.append(run("index", IndexConfig(), home, force))
    rows.append(run("retrieve", RetrieveConfig(), home, force))
    rows.append(run("salient-spans", models.spans, home, force))
    if train_models:
        rows += table3(models, home, force, dispatch)
        if "base+nkb" in models.rows:  # what the slots hold, and editing them (the paper's sections 5 and 6)
            device = {"device": models.device}
            rows.append(run("analyze", AnalyzeConfig(**device), home, force, dispatch))
            rows.append(run("surgery", SurgeryConfig(**device), home, force, dispatch))
    create_table_artifact(key="pipeline-run", table=rows, description="Stages of this pipeline run")
    return rows
