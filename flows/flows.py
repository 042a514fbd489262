"""Prefect flows: one per stage, plus `pipeline`. They only wire: call the stage, log, publish an artifact.

No `from __future__ import annotations` here: Prefect reads the parameter types to validate
parameters and to draw the UI's run form.
"""

import time
from typing import Optional

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from flows import stages
from flows.registry import STAGES, Stage
from flows.configs import IndexConfig, RetrieveConfig, SalientSpansConfig, SampleWorldConfig
from warehouse import StageResult, Warehouse


def _stage_flow(stage: Stage):
    config_type = stage.config

    def run_stage_flow(config: config_type, home: Optional[str] = None, force: bool = False) -> dict:
        logger = get_run_logger()
        started = time.perf_counter()
        result = stage.run(Warehouse(home), config, force)
        row = stages.summarize(stage.name, result, time.perf_counter() - started)
        if result.skipped:
            logger.info("Skipped %s: its inputs are unchanged since run %s (finished %s). Set force=true to rerun.",
                        stage.name, result.run.run_id, result.run.finished_at)
        else:
            logger.info("%s wrote %s in %.1f s (run %s)", stage.name, result.run.outputs, row["seconds"],
                        result.run.run_id)
        create_table_artifact(key=f"{stage.name}-run", table=[row], description=f"{stage.name}: {stage.summary}")
        return row

    run_stage_flow.__name__ = f"{stage.name.replace('-', '_')}_flow"
    run_stage_flow.__doc__ = stage.summary
    return flow(name=stage.name, description=stage.summary, log_prints=True)(run_stage_flow)


sample_world_flow = _stage_flow(STAGES["sample-world"])
ingest_flow = _stage_flow(STAGES["ingest"])
questions_flow = _stage_flow(STAGES["questions"])
index_flow = _stage_flow(STAGES["index"])
retrieve_flow = _stage_flow(STAGES["retrieve"])
salient_spans_flow = _stage_flow(STAGES["salient-spans"])
base_model_flow = _stage_flow(STAGES["base-model"])
inject_flow = _stage_flow(STAGES["inject"])
finetune_flow = _stage_flow(STAGES["finetune"])
evaluate_flow = _stage_flow(STAGES["evaluate"])
report_flow = _stage_flow(STAGES["report"])


@flow(name="pipeline", description="The whole pipeline on the sample world.", log_prints=True)
def pipeline(world: SampleWorldConfig = SampleWorldConfig(), home: Optional[str] = None,
             force: bool = False) -> list[dict]:
    """Generate the sample world, ingest its corpora, load its QA datasets, index the knowledge corpus,
    retrieve the top-3 documents per question and find their salient spans (later stages follow)."""
    rows = [sample_world_flow(world, home, force)]
    ingests, question_sets = stages.sample_world_inputs(Warehouse(home))
    rows += [ingest_flow(config, home, force) for config in ingests]
    rows += [questions_flow(config, home, force) for config in question_sets]
    rows.append(index_flow(IndexConfig(), home, force))
    rows.append(retrieve_flow(RetrieveConfig(), home, force))
    rows.append(salient_spans_flow(SalientSpansConfig(), home, force))
    create_table_artifact(key="pipeline-run", table=rows, description="Stages of this pipeline run")
    return rows


STAGE_FLOWS = {"sample-world": sample_world_flow, "ingest": ingest_flow, "questions": questions_flow,
               "index": index_flow, "retrieve": retrieve_flow, "salient-spans": salient_spans_flow,
               "base-model": base_model_flow, "inject": inject_flow, "finetune": finetune_flow,
               "evaluate": evaluate_flow, "report": report_flow}
