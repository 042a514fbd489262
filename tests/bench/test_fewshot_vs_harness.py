"""bench.fewshot_vs_harness's harness side: lm-evaluation-harness's own nq_open task, pointed at local files."""

import json
from pathlib import Path

import pytest
import yaml

lm_eval = pytest.importorskip("lm_eval")

from bench.fewshot_vs_harness import harness_task  # noqa: E402


def test_the_harness_task_is_the_installed_nq_open_one_on_local_files(tmp_path):
    installed = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks/nq_open/nq_open.yaml").read_text())
    train = [{"question": "who wrote hamlet", "answer": ["Shakespeare"]}]
    asked = [{"question": "capital of france", "answer": ["Paris", "paris"]}]
    harness_task(tmp_path, "mine", train, asked)
    task = yaml.safe_load((tmp_path / "mine.yaml").read_text())
    kept = ("doc_to_text", "doc_to_target", "description", "fewshot_delimiter", "generation_kwargs", "filter_list",
            "target_delimiter", "metric_list")
    assert {k: task[k] for k in kept} == {k: installed[k] for k in kept}
    assert (task["task"], task["dataset_path"]) == ("mine", "json")
    assert task.get("fewshot_config") == installed.get("fewshot_config")  # its own sampler: the default
    files = task["dataset_kwargs"]["data_files"]
    assert [json.loads(line) for line in Path(files["train"]).read_text().splitlines()] == train
    assert [json.loads(line) for line in Path(files["validation"]).read_text().splitlines()] == asked
