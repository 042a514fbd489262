"""What a pipeline would do, before it does it: each stage run in order, whether it runs or is skipped and why, and
how long it should take on this machine.

Each stage function is called under `reads.planning()`: it declares its run as it would (its config, what it reads),
and the declaration is compared with the warehouse's records instead of running. A run whose inputs an earlier run
of the plan rewrites runs too: its reads name the runs (their ids and inputs fingerprints) and the models that
earlier run replaces. The time is the last such run's here, scaled by its length (steps or epochs); a stage never run
here has no estimate, unless `calibrate` asks for one where the stage can be timed on made-up text
(`stages.calibrate`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from stages import reads
from stages.configs import StageConfig
from stages.registry import STAGES, model_of, run_subject
from warehouse import RunRecord, Warehouse, list_runs

LENGTHS = ("steps", "epochs")  # what a run's time is proportional to, when two runs of a stage differ in it


@dataclass
class Step:
    """One run of the plan."""
    stage: str
    subject: str             # what it is for: "base+nkb from base, 4000 steps", "corpus wiki"
    action: str              # "run", "skip", or "fails" (it cannot start: `why` says what is missing)
    why: str
    seconds: float | None = None  # estimated, for a run
    basis: str = ""          # what the estimate comes from


@dataclass
class Rewritten:
    """What the runs planned so far replace: the earlier runs (ids, inputs fingerprints) and models (names) whose
    output they rewrite, each with the stage that rewrites it."""
    marks: dict[str, str] = field(default_factory=dict)

    def add(self, stage: str, previous: list[RunRecord], model: str | None) -> None:
        for run in previous:
            self.marks.setdefault(run.run_id, stage)
            self.marks.setdefault(run.inputs_fingerprint, stage)
        if model:
            self.marks.setdefault(model, stage)

    def read_by(self, lineage: list[str]) -> str | None:
        """The stage that rewrites something a run reads (a lineage part: `partition:fingerprint`, a run id, a model
        folder's name, `model:scores`), or None."""
        for part in lineage:
            for piece in (part, part.rsplit(":", 1)[-1], part.split(":", 1)[0]):
                if piece in self.marks:
                    return self.marks[piece]
        return None


def plan_steps(wh: Warehouse, plan: list[tuple[str, StageConfig]], force: bool = False,
               calibrate: bool = False) -> list[Step]:
    """The steps of `plan` (stage, config) on this warehouse; nothing is run or written. `calibrate`: a run of a
    stage never run here is timed by a short calibration on made-up text (`stages.calibrate`), where its stage
    has one."""
    rewritten, steps = Rewritten(), []
    succeeded = functools.cache(lambda stage: [r for r in list_runs(wh, stage) if r.status == "success"])
    for name, config in plan:
        try:
            with reads.planning():
                STAGES[name].entry(wh, config, force)
            raise RuntimeError(f"stage {name} declared no run")  # every stage runs through reads.Declared
        except reads.Planned as planned:
            step = _step(planned, rewritten, succeeded, force)
        except (ValueError, FileNotFoundError, LookupError) as exc:  # what it reads is not there (yet)
            subject = run_subject(name, config.model_dump())
            earlier = next((s.stage for s in steps if s.action == "run"), None)
            step = (Step(name, subject, "run", f"after {earlier} (what it reads is not written yet)")
                    if earlier else Step(name, subject, "fails", str(exc)))
            if step.action == "run":
                rewritten.add(name, [], model_of(name, config.model_dump()))
        if step.action == "run":
            step.seconds, step.basis = estimate(succeeded(name), name, config.model_dump())
            if step.seconds is None and calibrate:
                from stages.calibrate import calibrated
                step.seconds, step.basis = calibrated(name, config, plan)
        steps.append(step)
    return steps


def _step(planned: reads.Planned, rewritten: Rewritten, succeeded, force: bool) -> Step:
    declared = planned.declared
    stage, recorded = declared.stage, declared.recorded
    subject = run_subject(stage, recorded)
    upstream = rewritten.read_by(declared.lineage)
    if planned.reused is not None and upstream is None:
        return Step(stage, subject, "skip", f"unchanged since run {planned.reused.run_id}")
    previous = [r for r in succeeded(stage) if _key(stage, r.config) == _key(stage, recorded)]
    rewritten.add(stage, previous, model_of(stage, recorded))
    if force:
        why = "forced"
    elif upstream:
        why = f"reads what {upstream} rewrites"
    elif not previous:
        why = "not run here yet"
    else:
        why = changed_settings(previous[0].config, declared.config) or "its input files or the stage's rules changed"
    return Step(stage, subject, "run", why)


def _key(stage: str, config: dict) -> str:
    """What a run is for, its length aside: runs of one key replace each other's output."""
    return run_subject(stage, {k: v for k, v in config.items() if k not in LENGTHS})


def changed_settings(before: dict, config: StageConfig) -> str:
    """The settings that decide a stage's output and differ from an earlier run's: "steps 3000 → 4000"."""
    now = config.identity()
    changed = [f"{key} {before.get(key)!r} → {value!r}" for key, value in now.items()
               if key in before and before[key] != value]
    return ", ".join(changed).replace("'", "")


def estimate(succeeded: list[RunRecord], stage: str, config: dict) -> tuple[float | None, str]:
    """Seconds a run of `stage` with `config` should take here, from the stage's successful runs (newest first): the
    latest of the same key (else of the stage), scaled by its length, and what the estimate comes from; (None, "")
    when the stage never ran here."""
    runs = [r for r in succeeded if r.seconds]
    same = [r for r in runs if _key(stage, r.config) == _key(stage, config)]
    if not (same or runs):
        return None, ""
    run = (same or runs)[0]
    for length in LENGTHS:
        before, now = run.config.get(length), config.get(length)
        if before and now and before != now:
            return run.seconds * now / before, f"run {run.run_id}: {run.seconds:.0f} s for {before} {length}"
    return run.seconds, f"run {run.run_id}"
