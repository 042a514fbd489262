"""Against a real Prefect server on loopback: `nkb server up` (deploy, pools, workers), stage deployments
run by workers, the pipeline dispatching GPU-pool stages with `run_deployment`, the schedule, the UI."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows import server
from flows.deployments import config_defaults, demo_defaults
from stages.registry import STAGES
from tests.experiments import tiny_experiment
from warehouse import Warehouse, list_runs, query

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SMALL_WORLD = {"people": 10, "background_people": 10}
EXAMPLE = ROOT / "experiments" / "example.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    directory = tmp_path_factory.mktemp("prefect-server")
    home = tmp_path_factory.mktemp("warehouse")
    started = time.perf_counter()
    # A fast scheduler loop so that the schedule test need not wait a minute.
    state = server.up(ROOT, port=free_port(), home=str(home), directory=directory, log=lambda *_: None,
                      extra_env={"PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2"})
    state.seconds_to_start = time.perf_counter() - started
    yield state, home
    stopped = server.down(ROOT, directory, log=lambda *_: None)
    assert set(stopped) == {"server", "worker-cpu", "worker-gpu"}
    assert not server.healthy(state.api_url)


@pytest.fixture
def client(running):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings
    state, _ = running
    with temporary_settings({PREFECT_API_URL: state.api_url}), get_client(sync_client=True) as c:
        yield c


def run_deployment_here(running, name: str, parameters: dict, timeout: float = 300):
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings
    state, _ = running
    with temporary_settings({PREFECT_API_URL: state.api_url}):
        return run_deployment(name, parameters=parameters, timeout=timeout)


def test_status_reports_the_server_and_workers(running):
    state, _ = running
    info = server.status(ROOT, state.directory)
    assert info["running"] and info["healthy"] and info["url"] == state.url
    assert {n: p["running"] for n, p in info["processes"].items()} == {"server": True, "worker-cpu": True,
                                                                       "worker-gpu": True}


def test_up_refuses_a_second_server_in_the_same_place(running):
    state, _ = running
    with pytest.raises(server.ServerError, match="already runs"):
        server.up(ROOT, port=free_port(), directory=state.directory, log=lambda *_: None)


def test_pools_have_the_process_workers_job_template(client):
    # as `prefect work-pool create --type process` makes them: a pool without one gets it from the first worker to
    # connect, a write the server's SQLite refused now and then
    from prefect.workers.process import ProcessWorker
    for name in server.POOLS:
        assert client.read_work_pool(name).base_job_template == ProcessWorker.get_default_base_job_template()


def test_every_deployment_is_deployed_with_the_demos_settings(client):
    deployed = {d.name: d for d in client.read_deployments()}
    demo = demo_defaults()
    assert set(deployed) == set(STAGES) | {"pipeline"}
    for stage in STAGES.values():
        d = deployed[stage.name]
        assert d.work_pool_name == stage.pool and d.enforce_parameter_schema
        assert d.parameters["config"] == json.loads(json.dumps(demo.get(stage.name) or config_defaults(stage.config)))
    gpu = client.read_work_pool("gpu")
    assert gpu.concurrency_limit == 1 and gpu.type == "process"


def test_parameters_that_do_not_fit_the_config_are_rejected(client):
    deployment = client.read_deployment_by_name("sample-world/sample-world")
    with pytest.raises(Exception, match="people|validation|schema"):
        client.create_flow_run_from_deployment(deployment.id, parameters={"config": {"people": "many"}})


def test_a_worker_runs_a_triggered_stage_and_it_writes_the_warehouse(running):
    _, home = running
    flow_run = run_deployment_here(running, "sample-world/sample-world", {"config": SMALL_WORLD})
    assert flow_run.state.is_completed(), flow_run.state
    # home was not passed: the worker found the warehouse through NKB_HOME, set by `nkb server up`.
    runs = list_runs(Warehouse(home), stage="sample-world")
    assert runs and runs[0].status == "success" and runs[0].config["people"] == 10


def test_pipeline_dispatches_gpu_stages_to_the_gpu_pool(running, client):
    _, home = running
    experiment = tiny_experiment("rows=[base]", "generation=", "pretrain.batch_size=4", "pretrain.steps=2",
                                 "sample_world.background_people=10").model_dump(mode="json")
    flow_run = run_deployment_here(running, "pipeline/pipeline", {"experiment": experiment, "dispatch": True,
                                                                   "home": str(home)},
                                   timeout=600)
    assert flow_run.state.is_completed(), flow_run.state
    # Every GPU stage ran as a flow run of its own deployment, on the gpu pool, started from within the
    # pipeline (run_deployment links it to a task run of the calling flow).
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName
    dispatched = client.read_flow_runs(deployment_filter=DeploymentFilter(
        name=DeploymentFilterName(any_=[n for n, s in STAGES.items() if s.pool == "gpu"])))
    names = sorted(client.read_deployment(r.deployment_id).name for r in dispatched)
    assert names == ["base-model", "evaluate", "finetune", "report"]
    assert all(r.work_pool_name == "gpu" and r.state.is_completed() and r.parent_task_run_id for r in dispatched)
    assert all(r.parameters["home"] == str(home) for r in dispatched)
    report = query(Warehouse(home), "SELECT model, dataset FROM report").to_pylist()
    assert {r["model"] for r in report} == {"base"}


def test_the_schedule_creates_upcoming_runs(client):
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, FlowRunFilter, \
        FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType
    deployment = client.read_deployment_by_name("pipeline/pipeline")
    (schedule,) = client.read_deployment_schedules(deployment.id)
    assert not schedule.active  # inactive until a user turns it on
    client.update_deployment_schedule(deployment.id, schedule.id, active=True)
    try:
        deadline = time.monotonic() + 60
        scheduled = []
        while not scheduled and time.monotonic() < deadline:
            time.sleep(1)
            scheduled = client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])),
                flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
                    type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))))
        assert scheduled, "the scheduler created no run within 60 s"
        assert all(r.expected_start_time.hour == 3 and r.expected_start_time.minute == 0 for r in scheduled)
    finally:
        client.update_deployment_schedule(deployment.id, schedule.id, active=False)
        for r in client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])),
                                       flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
                                           type=FlowRunFilterStateType(any_=[StateType.SCHEDULED])))):
            client.delete_flow_run(r.id)


def test_an_experiment_file_is_scheduled_as_a_refresh(running, client, tmp_path):
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, FlowRunFilter, \
        FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType
    state, _ = running
    experiment = tmp_path / "mine.yaml"
    experiment.write_text(EXAMPLE.read_text())
    with pytest.raises(server.ServerError, match="cron 'every monday'"):
        server.schedule(ROOT, experiment, "every monday", directory=state.directory)
    server.schedule(ROOT, experiment, "0 3 * * 1", directory=state.directory)
    made = server.schedule(ROOT, experiment, "30 4 * * 1", directory=state.directory)  # replaces the first
    deployment = client.read_deployment_by_name("pipeline/pipeline")
    mine = [s for s in client.read_deployment_schedules(deployment.id) if s.slug == made["slug"]]
    assert len(mine) == 1 and mine[0].active and mine[0].parameters == {"experiment_file": str(experiment)}
    scheduled_runs = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED])))
    try:
        deadline, scheduled = time.monotonic() + 60, []
        while not scheduled and time.monotonic() < deadline:
            time.sleep(1)
            scheduled = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(
                any_=[deployment.id])), flow_run_filter=scheduled_runs)
        assert scheduled, "the scheduler created no run within 60 s"
        assert all(r.parameters["experiment_file"] == str(experiment) and r.expected_start_time.weekday() == 0
                   and (r.expected_start_time.hour, r.expected_start_time.minute) == (4, 30) for r in scheduled)
    finally:
        client.delete_deployment_schedule(deployment.id, mine[0].id)
        for r in client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])),
                                       flow_run_filter=scheduled_runs):
            client.delete_flow_run(r.id)


def ingest_from_a_shell(home: Path, folder: Path, corpus: str) -> None:
    """`nkb --home HOME run ingest` from a shell with no Prefect setting: a flow run named `ingest corpus CORPUS`."""
    knowledge = folder / f"{corpus}.jsonl"
    knowledge.write_text('{"id": "a", "title": "A", "text": "Ada."}\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}  # a user's plain shell
    done = subprocess.run([sys.executable, "-m", "flows.cli", "--home", str(home), "run", "ingest", "--set",
                           f"path={knowledge}", "--set", f"corpus={corpus}"], env=env, capture_output=True, text=True,
                          timeout=300, cwd=folder)
    assert done.returncode == 0, done.stderr


def test_a_command_on_the_served_warehouse_sends_its_flow_run_to_the_server(running, client, tmp_path):
    """Issue 102: the server serves the warehouse's own Prefect database, and `nkb` on that warehouse, with nothing
    configured, runs its flows on it: the UI lists what the terminal ran."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    state, home = running
    ingest_from_a_shell(home, tmp_path, "uitest")
    runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["ingest corpus uitest"])))
    assert len(runs) == 1 and runs[0].state.is_completed()
    assert server.served(home) == state.api_url and (home / "prefect" / "prefect.db").exists()


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def rendered(url: str, shot: Path) -> str:
    """The page as headless Chromium renders it (its DOM), with a screenshot of it."""
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
              "--virtual-time-budget=20000", "--window-size=1400,1000"]
    shot.unlink(missing_ok=True)
    subprocess.run(common + [f"--screenshot={shot}", url], capture_output=True, timeout=120)
    dom = subprocess.run(common + ["--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    shot.with_suffix(".html").write_text(dom)
    assert shot.exists() and shot.stat().st_size > 10_000
    return dom


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")
def test_the_ui_lists_our_deployments_the_runs_and_the_report_in_a_real_browser(running, tmp_path):
    state, home = running
    artifacts = ROOT / "tests" / "artifacts"
    artifacts.mkdir(exist_ok=True)
    dom = rendered(state.url + "/deployments", artifacts / "prefect-ui-deployments.png")
    names = sorted(STAGES) + ["pipeline"]
    assert f"{len(names)} Deployments" in dom
    for name in sorted(names)[:10]:  # the first page, A to Z, 10 per page
        assert f">{name}<" in dom, f"the deployments page does not show {name!r}"
    # a flow run a plain shell's `nkb` makes on the served warehouse, in the Runs page, and the table artifact it
    # published (the report's plot and table are artifacts of the same kind) in the Artifacts page
    ingest_from_a_shell(home, tmp_path, "uibrowser")
    dom = rendered(state.url + "/runs", artifacts / "prefect-ui-runs.png")
    assert "ingest corpus uibrowser" in dom
    dom = rendered(state.url + "/artifacts", artifacts / "prefect-ui-artifacts.png")
    assert "ingest-run" in dom


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")
def test_after_a_tiny_pipeline_the_ui_lists_its_runs_and_opens_its_report_in_a_real_browser(running, tmp_path):
    """Issue 102: a whole (tiny) pipeline run from a shell on the served warehouse: its flow runs in the Runs page,
    and the report artifact opens on its own page with the report's rows."""
    import yaml

    from stages.experiment import SAMPLE_WORLD, apply_sets
    from tests.experiments import TINY_SETS
    state, home = running
    experiment = tmp_path / "tiny.yaml"
    experiment.write_text(yaml.safe_dump(apply_sets(yaml.safe_load(open(SAMPLE_WORLD)), TINY_SETS)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}  # a user's plain shell
    done = subprocess.run([sys.executable, "-m", "flows.cli", "--home", str(home), "pipeline", str(experiment)],
                          env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    artifacts = ROOT / "tests" / "artifacts"
    artifacts.mkdir(exist_ok=True)
    dom = rendered(state.url + "/runs", artifacts / "prefect-ui-pipeline-runs.png")
    for name in ("report", "evaluate base+nkb.qa, on validation", "inject base+nkb from base, 3 steps"):
        assert f"{name}<" in dom, f"the Runs page does not list the flow run {name!r}"
    from urllib.request import Request, urlopen
    asked = {"artifacts": {"key": {"any_": ["nkb-report"]}}, "sort": "CREATED_DESC", "limit": 1}  # the newest
    with urlopen(Request(f"{state.api_url}/artifacts/filter", json.dumps(asked).encode(),
                         {"Content-Type": "application/json"}), timeout=30) as answer:
        latest = json.loads(answer.read())[0]
    dom = rendered(f"{state.url}/artifacts/artifact/{latest['id']}", artifacts / "prefect-ui-report.png")
    assert "NKB report (validation" in dom and "base+NKB" in dom, "the report artifact's page lacks its table"


def test_an_experiments_deployments_hold_its_settings_in_their_run_forms(running, client):
    """`nkb deploy FILE`: Run in the UI reruns the user's experiment and its stages, not the demo's."""
    state, _ = running
    experiment = ROOT / "experiments" / "your-data" / "experiment.yaml"
    changed = server.deploy_experiment(ROOT, experiment, directory=state.directory)
    assert changed[0] == "pipeline" and "inject" in changed and "evaluate" in changed
    assert client.read_deployment_by_name("pipeline/pipeline").parameters["experiment_file"] == str(experiment)
    inject = client.read_deployment_by_name("inject/inject").parameters["config"]
    assert inject["steps"] == 150 and inject["corpus"] == "passages" and inject["qa_share"] == 0.7
    assert client.read_deployment_by_name("evaluate/evaluate").parameters["config"]["model"] == "base+nkb"
