"""A commit killed at any point (`kill -9`: no cleanup runs) leaves the old data or the new, registered, and never a
table that fails or lacks rows; and two runs that write one partition at once never lose one's rows unseen."""

import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from warehouse import Warehouse, WarehouseError, run_stage

OLD = {"k1": 20}
NEW = {"k1": 5, "k3": 7}

# A second run replaces partition k1, adds k3 and replaces a published folder, in a process of its own that kills
# itself (SIGKILL) at the commit's step number argv[2] (0: never).
SECOND_RUN = textwrap.dedent("""
    import os, signal, sys
    import warehouse.commit as commit
    from warehouse import Warehouse, run_stage
    steps, kill_at = [], int(sys.argv[2])

    def step(name):
        steps.append(name)
        print(name, flush=True)
        if len(steps) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    commit._on_step = step
    wh = Warehouse(sys.argv[1])

    def body(run):
        for corpus, n in {new}.items():
            run.write("documents", corpus, {{"doc_id": [f"{{corpus}}-new-{{i}}" for i in range(n)], "title": ["t"] * n,
                                             "text": ["new"] * n, "corpus": [corpus] * n}})
        run.publish_folder(wh.files_dir / "index", lambda d: (d / "version").write_text("new"))
    run_stage(wh, "ingest", {{"corpus": "k1", "second": True}}, "fp-second", body)
""").format(new=NEW)


def first_run(wh: Warehouse) -> None:
    def body(run):
        n = OLD["k1"]
        run.write("documents", "k1", {"doc_id": [f"k1-{i}" for i in range(n)], "title": ["t"] * n,
                                      "text": ["old"] * n, "corpus": ["k1"] * n})
        run.publish_folder(wh.files_dir / "index", lambda d: (d / "version").write_text("old"))
    run_stage(wh, "ingest", {"corpus": "k1"}, "fp-first", body)


def state(home) -> tuple[dict, str]:
    """(rows per corpus, the published folder's version) as a new process would read them; fails on a damaged or
    unregistered file."""
    wh = Warehouse(home)
    assert not wh.check_files(), wh.check_files()
    rows = wh.read("documents", ["corpus"]).column("corpus").value_counts().to_pylist()
    return {r["values"]: r["counts"] for r in rows}, (wh.files_dir / "index" / "version").read_text()


@pytest.mark.slow
def test_a_kill_at_every_step_of_a_commit_leaves_the_old_rows_or_the_new(tmp_path):
    template = tmp_path / "template"
    first_run(Warehouse(template))
    seen = []
    for kill_at in range(1, 50):
        home = tmp_path / f"kill-{kill_at}"
        shutil.copytree(template, home)
        out = subprocess.run([sys.executable, "-c", SECOND_RUN, str(home), str(kill_at)], capture_output=True,
                             text=True, timeout=120)
        reached = out.stdout.split("\n")[kill_at - 1] if out.returncode else "finished"
        after = state(home)
        assert after in ((OLD, "old"), (NEW, "new")), (reached, after, out.stderr[-2000:])
        seen.append((reached, after == (NEW, "new")))
        if out.returncode == 0:
            break
        assert out.returncode == -9, out.stderr[-2000:]
        # The run can be made again, whole, after the kill.
        again = subprocess.run([sys.executable, "-c", SECOND_RUN, str(home), "0"], capture_output=True, text=True,
                               timeout=120)
        assert again.returncode == 0, again.stderr[-2000:]
        assert state(home) == (NEW, "new")
    print("\n".join(f"killed after {step!r}: {'new' if new else 'old'} rows" for step, new in seen))
    # Every rename of the commit was a kill point, and both outcomes occurred: before the database commit, the
    # old; from it on, the new.
    assert [new for _, new in seen] == sorted(new for _, new in seen) and seen[0][1] is False
    assert any(step.startswith("renamed") for step, _ in seen) and seen[-1] == ("finished", True)


def test_two_runs_writing_one_partition_at_once_never_lose_one_without_a_word(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    started, first_may_commit = threading.Event(), threading.Event()

    def slow(run):  # starts first, commits last
        started.set()
        first_may_commit.wait(30)
        run.write("documents", "k2", {"doc_id": ["a"], "title": ["t"], "text": ["first"], "corpus": ["k2"]})

    errors = []

    def first():
        try:
            run_stage(Warehouse(wh.home), "ingest", {"corpus": "k2", "file": "a"}, "fp-a", slow)
        except WarehouseError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=first)
    thread.start()
    started.wait(30)
    time.sleep(0.05)
    run_stage(wh, "ingest", {"corpus": "k2", "file": "b"}, "fp-b",
              lambda run: run.write("documents", "k2", {"doc_id": ["b"], "title": ["t"], "text": ["second"],
                                                        "corpus": ["k2"]}))
    first_may_commit.set()
    thread.join(60)
    assert len(errors) == 1 and "documents/k2 was committed by run ingest-" in errors[0], errors
    assert "after this run started" in errors[0]
    assert Warehouse(wh.home).read("documents").column("text").to_pylist() == ["second"]
    failed = [r for r in __import__("warehouse").list_runs(Warehouse(wh.home)) if r.status == "failed"]
    assert len(failed) == 1 and "two runs wrote it at once" in failed[0].error
    # Run after the other, not beside it, the same stage replaces the partition as always.
    run_stage(wh, "ingest", {"corpus": "k2", "file": "a"}, "fp-a", slow)
    assert Warehouse(wh.home).read("documents").column("text").to_pylist() == ["first"]
    assert os.listdir(wh.home / ".commits") == []
