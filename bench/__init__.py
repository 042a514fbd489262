"""Benchmarks: each prints JSON and records its figures in a warehouse under `bench/results/` (docs/testing.md)."""

from __future__ import annotations

import argparse


def model_bench_parser(doc: str, results: str) -> argparse.ArgumentParser:
    """The arguments of a benchmark that measures models a warehouse holds: --home, the models, --precision and
    --results (its own arguments are added after)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--home", required=True, help="the warehouse that holds the base and the models")
    parser.add_argument("models", nargs="+", help="model names in the warehouse (or model folders) to measure")
    parser.add_argument("--precision", default="bf16", choices=["auto", "bf16", "fp32"],
                        help="as the stages' precision setting")
    parser.add_argument("--results", default=results, help="benchmark warehouse for the figures")
    return parser


def warehouse_models(parser: argparse.ArgumentParser, home: str, names: list[str]):
    """(the warehouse at `home`, {name: model folder}); a mistyped --home or name ends the command with its error."""
    from stages.models import find_model
    from warehouse import Warehouse, WarehouseError
    try:
        wh = Warehouse(home, create=False)  # a mistyped --home: no warehouse there, not a new empty one
        return wh, {name: find_model(wh, name) for name in names}
    except (ValueError, WarehouseError) as exc:
        parser.error(str(exc))


def record(wh, name: str, figures: dict, config: dict) -> str:
    """Record a benchmark's numeric figures (its other entries, and flags, left out) as `metrics` rows
    `bench.<name>.<figure>` of a `bench-<name>` run (its underscores as hyphens, the stage names' style) in the
    warehouse `wh`; returns the run id."""
    from warehouse import run_stage

    def body(run):
        for figure, value in figures.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                run.metric(f"bench.{name}.{figure}", value)
    return run_stage(wh, f"bench-{name.replace('_', '-')}", config, "bench", body, force=True).run.run_id
