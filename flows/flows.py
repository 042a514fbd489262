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
from flows.configs import (BaseModelConfig, EvaluateConfig, FinetuneConfig, IndexConfig, InjectConfig, ModelsConfig,
                           ReportConfig, RetrieveConfig, SalientSpansConfig, SampleWorldConfig)
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


@flow(name="table3", description="The paper's Table 3 on the warehouse's data: train, fine-tune and evaluate "
                                 "every model row, then report.", log_prints=True)
def table3(models: ModelsConfig = ModelsConfig(), home: Optional[str] = None, force: bool = False) -> list[dict]:
    """Base, larger base and random-init models; NKB and NKB-a injection; QA fine-tuning and evaluation of each
    row; the report with the knowledge probe and the no-forgetting check."""
    device = models.device
    pretrain = BaseModelConfig(size=models.base_size, steps=models.pretrain_steps,
                               batch_size=models.pretrain_batch_size, device=device)
    rows = [base_model_flow(pretrain, home, force),
            base_model_flow(pretrain.model_copy(update={"name": "transformer", "steps": 0}), home, force)]
    if models.large_size:
        rows.append(base_model_flow(pretrain.model_copy(update={"name": "large", "size": models.large_size}),
                                    home, force))
    injection = InjectConfig(steps=models.inject_steps, batch_size=models.inject_batch_size, lr=models.inject_lr,
                             slots=models.slots, device=device)
    rows += [inject_flow(injection.model_copy(update={"variant": v}), home, force) for v in ("nkb", "nkb-a")]
    for name in ["transformer", "base", "base+nkb", "base+nkb-a"] + (["large"] if models.large_size else []):
        rows.append(finetune_flow(FinetuneConfig(model=name, epochs=models.finetune_epochs, lr=models.finetune_lr,
                                                 device=device), home, force))
        rows.append(evaluate_flow(EvaluateConfig(model=f"{name}.qa", device=device), home, force))
    rows.append(report_flow(ReportConfig(large="large" if models.large_size else None, device=device), home, force))
    return rows


@flow(name="pipeline", description="The whole pipeline on the sample world.", log_prints=True)
def pipeline(world: SampleWorldConfig = SampleWorldConfig(), home: Optional[str] = None, force: bool = False,
             train_models: bool = True, models: ModelsConfig = ModelsConfig()) -> list[dict]:
    """Generate the sample world, ingest its corpora, load its QA datasets, index the knowledge corpus,
    retrieve the top-3 documents per question, find their salient spans, and (with `train_models`)
    run the Table 3 flow."""
    rows = [sample_world_flow(world, home, force)]
    ingests, question_sets = stages.sample_world_inputs(Warehouse(home))
    rows += [ingest_flow(config, home, force) for config in ingests]
    rows += [questions_flow(config, home, force) for config in question_sets]
    rows.append(index_flow(IndexConfig(), home, force))
    rows.append(retrieve_flow(RetrieveConfig(), home, force))
    rows.append(salient_spans_flow(SalientSpansConfig(max_words=models.max_words), home, force))
    if train_models:
        rows += table3(models, home, force)
    create_table_artifact(key="pipeline-run", table=rows, description="Stages of this pipeline run")
    return rows


STAGE_FLOWS = {"sample-world": sample_world_flow, "ingest": ingest_flow, "questions": questions_flow,
               "index": index_flow, "retrieve": retrieve_flow, "salient-spans": salient_spans_flow,
               "base-model": base_model_flow, "inject": inject_flow, "finetune": finetune_flow,
               "evaluate": evaluate_flow, "report": report_flow}
