"""Prefect flows: one per stage, and `pipeline`. They only wire: run the stage, log, publish artifacts.

Every stage flow is made from the stage registry; the module exposes each as `<stage>_flow` (e.g.
`ingest_flow`), the entrypoints of `prefect.yaml`. No `from __future__ import annotations` here: Prefect
reads the parameter types to validate parameters and to draw the UI's run form.
"""

import os
import time
from pathlib import Path
from typing import Optional

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.deployments import flow_attribute
from flows.error_lines import tidy_run_logs
from stages.data import ingest_part, ner_shard
from stages.experiment import Experiment, ExperimentError
from stages.inputs import require_shots, world_dir
from stages.registry import STAGES, Stage, run_subject
from stages.runner import dispatch, picked, require_devices, summarize
from warehouse import Warehouse, resolve_home


# The work a stage spreads over Dask, one Prefect task a shard: NER over segments, cleaning a corpus's file.
SHARD_TASKS = {work.__name__: task(name=work.__name__.replace("_", "-"))(work) for work in (ner_shard, ingest_part)}


@flow(name="stage-shards", description="A stage's shards (NER shards, a corpus's files), one task each.")
def shards_flow(work: str, jobs: list) -> list[int]:
    futures = SHARD_TASKS[work].map(jobs)
    return [future.result() for future in futures]


def dask_shard_mapper(address: str):
    """`map_shards(work, jobs)` running each job as a Prefect task on Dask: `address` is a scheduler (tcp://...),
    'local' (a local cluster with one single-threaded worker process per core) or 'local:N' (N workers)."""
    from prefect_dask import DaskTaskRunner
    if address == "local" or address.startswith("local:"):
        workers = int(address.partition(":")[2] or os.cpu_count() or 1)
        runner = DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 1})
    else:
        runner = DaskTaskRunner(address=address)
    return lambda work, jobs: shards_flow.with_options(task_runner=runner)(work.__name__, jobs) if jobs else []


HOME_HELP = "home: The warehouse directory; default `$NKB_HOME`, else `.nkb` in the project directory."
FORCE_HELP = "force: Rerun even when the inputs are unchanged (a stage is skipped when they are)."


def _stage_flow(stage: Stage):
    config_type = stage.config

    def run_stage_flow(config: config_type, home: Optional[str] = None, force: bool = False) -> dict:
        tidy_run_logs()
        logger = get_run_logger()
        started = time.perf_counter()
        wh = Warehouse(home)
        dask = getattr(config, "dask", None)
        options = {"map_shards": dask_shard_mapper(dask)} if dask else {}
        result = dispatch(stage.name, wh, config, force, **options)
        row = summarize(stage.name, result, time.perf_counter() - started)
        if result.skipped:
            logger.info("skipped: inputs unchanged since run %s (force=true reruns it)", result.run.run_id)
        else:
            written = ", ".join(f"{k}={v}" for k, v in result.run.outputs.items()) or "nothing"
            logger.info("wrote %s in %.1f s (run %s)", written, row["seconds"], result.run.run_id)
        create_table_artifact(key=f"{stage.name}-run", table=[row], description=f"{stage.name}: {stage.summary}")
        if stage.name == "report":
            from stages.report_plot import report_markdown
            create_markdown_artifact(key="nkb-report", markdown=report_markdown(wh),
                                     description="The paper's Table 3 on this warehouse, with loss curves and EM")
        return row

    run_stage_flow.__name__ = flow_attribute(stage.name)
    # Prefect reads the Args section for the run form's field descriptions.
    run_stage_flow.__doc__ = f"""{stage.summary}

    Args:
        config: The stage's settings (`nkb run {stage.name} --help` describes each).
        {HOME_HELP}
        {FORCE_HELP}
    """
    # persist_result: a pipeline that dispatched this flow to a worker reads the summary row back.
    return flow(name=stage.name, description=stage.summary, log_prints=True, persist_result=True,
                flow_run_name=lambda: stage_run_name(stage.name))(run_stage_flow)


def stage_run_name(stage: str) -> str:
    """A stage flow run's name: the stage and what it is for ("finetune base+nkb.qa from base+nkb, 30 epochs"),
    in place of Prefect's random one, so that logs and the UI's run list say what each run did."""
    from prefect.runtime import flow_run
    config = flow_run.parameters.get("config")
    config = config.model_dump() if hasattr(config, "model_dump") else dict(config or {})
    return " ".join([stage, run_subject(stage, config)]).strip()


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


def load_experiment(experiment: Optional[Experiment], experiment_file: Optional[str]) -> Experiment:
    """The experiment a pipeline run was given: a file, which wins over the inline one (the form always holds one:
    `nkb demo`'s), or inline (relative paths against the working directory)."""
    if experiment_file:
        return Experiment.load(experiment_file)
    if experiment is None:
        raise ExperimentError("give the pipeline an experiment or an experiment_file")
    return experiment.relative_to(Path.cwd())


@flow(name="pipeline", description="An experiment end to end: its data, base, NKB injection, fine-tuning, "
                                   "evaluation, report, analysis and surgery; unchanged stages are skipped.",
      log_prints=True)
def pipeline(experiment: Optional[Experiment] = None, experiment_file: Optional[str] = None,
             home: Optional[str] = None, force: bool = False, train_models: bool = True,
             dispatch: bool = False, only: Optional[list[str]] = None, start: Optional[str] = None) -> list[dict]:
    """Run an experiment's plan: ingest its corpora, load its QA and generation files, index the knowledge corpus,
    retrieve the top documents per question, find their salient spans, and (with `train_models`) build or bring in
    the base, inject the NKB, fine-tune and evaluate every row, report, analyse and edit the slots.

    Args:
        experiment: The experiment: its files, base model, rows and stage settings (default: `nkb demo`'s, SmolLM2 on
            the sample world).
        experiment_file: An experiment's YAML file on the worker's machine; when given, it is used instead.
        home: The warehouse directory; default `$NKB_HOME`, else `.nkb` in the project directory.
        force: Rerun every stage even when its inputs are unchanged.
        train_models: Also build the models, fine-tune, evaluate and report; off: the data stages only.
        dispatch: Run GPU-pool stages through their deployments (needs a worker on the `gpu` pool: `nkb server up`).
        only: Rerun only these stages (every run of each: `evaluate` evaluates every row), with the experiment's
            settings, forced; the others are not run.
        start: Rerun this stage and every one after it, forced; the ones before are not run.
    """
    tidy_run_logs()
    world = world_dir(Warehouse(home))
    chosen = load_experiment(experiment, experiment_file).with_world(world)
    chosen.require_files(world)
    plan = picked(chosen.plan(train_models), only, start)
    force = force or bool(only or start)  # what a user names to rerun reruns
    require_devices(plan, frozenset({"gpu"}) if dispatch else frozenset())
    first_model = next((i for i, (name, _) in enumerate(plan) if STAGES[name].pool == "gpu"), None)
    rows = []
    for i, (name, config) in enumerate(plan):
        if i == first_model:  # the data stages have loaded the questions by now
            require_shots(Warehouse(home), plan[i:])
        rows.append(run(name, config, home, force, dispatch))
    create_table_artifact(key="pipeline-run", table=rows, description=f"Stages of experiment {chosen.name}")
    return rows
