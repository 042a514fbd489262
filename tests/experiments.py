"""The sample world's experiment made tiny, for tests that run a whole plan: a few people, a few steps each."""

from stages.experiment import SAMPLE_WORLD, Experiment

TINY_SETS = [
    "sample_world={people: 10, background_people: 30}",
    "pretrain={size: tiny, steps: 3, batch_size: 8, ssm_share: 0.5, ssm_batch_size: 8, vocab_size: 800, seq_len: 64}",
    "large={size: tiny}",
    "stages.inject.steps=3", "stages.inject.batch_size=8", "stages.nkb-a.steps=2",
    "stages.finetune={epochs: 1, answer_format: plain}", "stages.generation.epochs=1",
    "device=cpu",
]


def tiny_experiment(*sets: str) -> Experiment:
    """The tiny sample-world experiment, changed by more `--set` pairs."""
    return Experiment.load(SAMPLE_WORLD, TINY_SETS + list(sets))
