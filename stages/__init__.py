"""The stages: plain functions `stage(wh, config, force) -> StageResult` over the warehouse, one module per
family (data, training, evaluation, report, knowledge), with their configs, registry and runner."""
