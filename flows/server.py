"""`nkb server up | down | status`: a Prefect server on loopback with the `cpu` and `gpu` work pools, every
deployment of prefect.yaml, and one process worker per pool.

The server's database is the warehouse's own (`<home>/prefect`, the PREFECT_HOME every `nkb` command gives its
flow runs), so the UI lists every flow run made for that warehouse, `make demo`'s included; while the server is up,
`nkb` commands on that warehouse send their flow runs to it (`served`). The logs and `server.json`, which lists the
processes `up` started (pid and start time, so `down` never signals a process that merely reused a pid), live under
`<project>/.prefect/`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from flows.deployments import GPU_POOL_CONCURRENCY
from stages.registry import STAGES

POOLS = {"cpu": None, "gpu": GPU_POOL_CONCURRENCY}  # name -> concurrency limit
HOST = "127.0.0.1"


class ServerError(RuntimeError):
    pass


SERVED = "server-url"  # in a warehouse's prefect folder while a server `up` started serves it: the server's API URL


def prefect_home(home: str | os.PathLike | None) -> Path:
    """A warehouse's PREFECT_HOME: the database of every flow run made for it, by `nkb` in-process or on a server."""
    from warehouse import resolve_home
    return resolve_home(home) / "prefect"


def served(home: str | os.PathLike | None) -> str | None:
    """The API URL of the server `nkb server up` started on this warehouse's database, if it answers."""
    path = prefect_home(home) / SERVED
    url = path.read_text().strip() if path.is_file() else ""
    return url if url and healthy(url) else None


@dataclass
class ServerState:
    project: Path
    directory: Path  # state: logs, server.json
    port: int
    processes: dict[str, dict] = field(default_factory=dict)  # name -> {pid, created, log}
    home: str | None = None  # the warehouse whose database it serves

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def api_url(self) -> str:
        return self.url + "/api"

    def save(self) -> None:
        path = self.directory / "server.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"port": self.port, "processes": self.processes, "home": self.home}, indent=1))
        os.replace(tmp, path)

    @classmethod
    def load(cls, project: Path, directory: Path) -> "ServerState | None":
        path = directory / "server.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return cls(project, directory, data["port"], data["processes"], data.get("home"))

    def running(self, name: str) -> psutil.Process | None:
        """The process `up` started under this name, if it still runs (same pid *and* start time)."""
        info = self.processes.get(name)
        if not info:
            return None
        try:
            proc = psutil.Process(info["pid"])
            if abs(proc.create_time() - info["created"]) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
                return proc
        except psutil.Error:
            pass
        return None


def _locate(project: Path, directory: Path | None) -> tuple[Path, Path]:
    project = project.resolve()
    return project, (directory or project / ".prefect").resolve()


def server_environment(project: Path, directory: Path, port: int, home: str | None = None) -> dict[str, str]:
    """The environment of the server, the deploy command and the workers (and what a user exports to
    talk to this server from a shell)."""
    env = dict(os.environ)
    env.update({
        "PREFECT_HOME": str(prefect_home(home)),
        "PREFECT_API_URL": f"http://{HOST}:{port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_CLI_PROMPT": "false",
        "NKB_PROJECT_DIR": str(project),  # the deployments' pull step runs flows from here
    })
    env["NKB_HOME"] = str(prefect_home(home).parent)
    return env


def healthy(api_url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(api_url + "/health", timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


def port_free(port: int) -> bool:
    import socket
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
            return True
        except OSError:
            return False


def _prefect() -> str:
    return str(Path(sys.executable).with_name("prefect"))


def _start(state: ServerState, name: str, argv: list[str], env: dict[str, str]) -> psutil.Process:
    log = state.directory / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        # A session of its own: `down` stops the process group, so a worker's flow-run children go too.
        proc = subprocess.Popen(argv, cwd=state.project, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    ps = psutil.Process(proc.pid)
    state.processes[name] = {"pid": proc.pid, "created": ps.create_time(), "log": str(log)}
    state.save()
    return ps


def _tail(path: str, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _create_pools(api_url: str) -> None:
    """The pools, each with the process worker's job template, as `prefect work-pool create --type process` makes
    them. A pool created without one is given it by the first worker that connects, a write Prefect's SQLite refused
    now and then (`database is locked` in the server's log: docs/orchestration.md)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.workers.process import ProcessWorker
    template = ProcessWorker.get_default_base_job_template()
    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        for name, limit in POOLS.items():
            try:
                client.create_work_pool(WorkPoolCreate(name=name, type="process", base_job_template=template,
                                                       concurrency_limit=limit))
            except ObjectAlreadyExists:  # a template a user edited is kept
                kept = client.read_work_pool(name).base_job_template
                client.update_work_pool(name, WorkPoolUpdate(base_job_template=kept or template,
                                                             concurrency_limit=limit))


def _require_prefect_yaml(project: Path) -> None:
    """Refuse a project folder without prefect.yaml before anything starts: Prefect would find that out only when
    deploying, after the server had come up."""
    if (project / "prefect.yaml").is_file():
        return
    ours = Path(__file__).resolve().parents[1]  # the checkout this module runs from
    hint = f" (this installation's: --project {ours})" if (ours / "prefect.yaml").is_file() else ""
    raise ServerError(f"{project} has no prefect.yaml (the deployments to start): give --project the folder that "
                      f"holds it{hint}")


def up(project: Path, port: int = 4200, home: str | None = None, directory: Path | None = None,
       extra_env: dict[str, str] | None = None, log=print, timeout: float = 180) -> ServerState:
    """Start the server, create the pools, deploy everything, start the workers; return the state.

    directory: where state and logs go (default PROJECT/.prefect); extra_env: more settings for the
    server and workers (e.g. a faster scheduler loop in tests)."""
    project, directory = _locate(project, directory)
    _require_prefect_yaml(project)
    existing = ServerState.load(project, directory)
    if existing and existing.running("server"):
        raise ServerError(f"a server started from {project} already runs at {existing.url}; "
                          "`nkb server down` stops it")
    if existing:
        down(project, directory, log=lambda *_: None)  # leftovers of an earlier server that died
    if not port_free(port):
        raise ServerError(f"port {port} on {HOST} is taken; choose another with --port")
    directory.mkdir(parents=True, exist_ok=True)
    prefect_home(home).mkdir(parents=True, exist_ok=True)
    state = ServerState(project, directory, port, home=str(prefect_home(home).parent))
    env = server_environment(project, directory, port, home) | (extra_env or {})
    started = time.perf_counter()
    try:
        server = _start(state, "server", [_prefect(), "server", "start", "--host", HOST, "--port", str(port)], env)
        deadline = time.monotonic() + timeout
        while not healthy(state.api_url):
            if not server.is_running() or time.monotonic() > deadline:
                raise ServerError(f"the Prefect server did not come up; its log ({state.processes['server']['log']}) "
                                  f"ends:\n{_tail(state.processes['server']['log'])}")
            time.sleep(0.25)
        (prefect_home(home) / SERVED).write_text(state.api_url)
        log(f"server up at {state.url} in {time.perf_counter() - started:.1f} s, on {prefect_home(home)}")
        _create_pools(state.api_url)
        log("work pools: " + ", ".join(f"{n} (concurrency {lim or 'unlimited'})" for n, lim in POOLS.items()))
        deploy = subprocess.run([_prefect(), "--no-prompt", "deploy", "--all"], cwd=project, env=env,
                                capture_output=True, text=True)
        if deploy.returncode != 0:
            raise ServerError(f"`prefect deploy --all` failed (exit {deploy.returncode}):\n"
                              + "\n".join((deploy.stdout + deploy.stderr).splitlines()[-20:]))
        log(f"deployed {len(STAGES) + 1} deployments from {project / 'prefect.yaml'}")
        for pool in POOLS:
            _start(state, f"worker-{pool}", [_prefect(), "worker", "start", "--pool", pool, "--type", "process"], env)
        log(f"workers started for pools {', '.join(POOLS)}; all up in {time.perf_counter() - started:.1f} s")
    except BaseException:
        with contextlib.suppress(ServerError):  # nothing started yet: nothing to stop
            down(project, directory, log=lambda *_: None)
        raise
    return state


def down(project: Path, directory: Path | None = None, log=print, grace: float = 15) -> list[str]:
    """Stop exactly the processes `up` started (and their children); return their names."""
    project, directory = _locate(project, directory)
    state = ServerState.load(project, directory)
    if state is None:
        raise ServerError(f"no server was started from {project}; give the directory `nkb server up` ran in "
                          "with --project")
    stopped = []
    # Workers first, so that none picks up a run while the server goes away.
    for name in sorted(state.processes, key=lambda n: n == "server"):
        proc = state.running(name)
        if proc is None:
            continue
        group = [proc] + proc.children(recursive=True)
        for p in group:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(group, timeout=grace)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=5)
        stopped.append(name)
        log(f"stopped {name} (pid {proc.pid})")
    if state.home:
        marker = prefect_home(state.home) / SERVED
        if marker.is_file() and marker.read_text().strip() == state.api_url:  # not a later server's
            marker.unlink()
    (directory / "server.json").unlink(missing_ok=True)
    return stopped


def status(project: Path, directory: Path | None = None) -> dict:
    """What runs and where: {running, url, healthy, processes: {name: {pid, running, log}}}."""
    project, directory = _locate(project, directory)
    state = ServerState.load(project, directory)
    if state is None:
        return {"running": False, "project": str(project)}
    return {"running": state.running("server") is not None, "project": str(project), "url": state.url,
            "api_url": state.api_url, "healthy": healthy(state.api_url),
            "processes": {name: {"pid": info["pid"], "running": state.running(name) is not None, "log": info["log"]}
                          for name, info in state.processes.items()}}


def deploy_experiment(project: Path, experiment_file: Path, directory: Path | None = None) -> list[str]:
    """Fill the running server's run forms with an experiment's settings: the pipeline's `experiment_file`, and
    each stage's config as that experiment runs it (its main row's for a model stage). Returns the deployments
    changed. The server's deployments came with `nkb demo`'s settings (prefect.yaml); this replaces them."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import DeploymentUpdate
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.deployments import experiment_defaults
    experiment_file = experiment_file.resolve()
    defaults = experiment_defaults(experiment_file)  # a wrong file is refused before the server is touched
    info = status(project, directory)
    if not info["running"] or not info["healthy"]:
        raise ServerError(f"no server answering for {info['project']}; start one with `nkb server up`")
    with temporary_settings({PREFECT_API_URL: info["api_url"]}), get_client(sync_client=True) as client:
        pipeline = client.read_deployment_by_name("pipeline/pipeline")
        client.update_deployment(pipeline.id, DeploymentUpdate(
            parameters=dict(pipeline.parameters) | {"experiment_file": str(experiment_file)}))
        for stage, config in defaults.items():
            deployment = client.read_deployment_by_name(f"{stage}/{stage}")
            client.update_deployment(deployment.id, DeploymentUpdate(
                parameters=dict(deployment.parameters) | {"config": config}))
    return ["pipeline", *defaults]


def schedule(project: Path, experiment_file: Path, cron: str, timezone: str = "UTC",
             directory: Path | None = None) -> dict:
    """Schedule the `pipeline` deployment to run an experiment file (a knowledge refresh: the file names the newest
    dump, and each run redoes what changed). One schedule per experiment: scheduling it again replaces it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from stages.experiment import Experiment
    experiment_file = experiment_file.resolve()
    name = Experiment.load(experiment_file).name  # refuse a wrong file, cron or zone now, not at 3 a.m.
    try:
        when = CronSchedule(cron=cron, timezone=timezone)
    except ValueError as exc:
        message = exc.errors()[0]["msg"] if hasattr(exc, "errors") else str(exc)
        raise ServerError(f"cron {cron!r} / timezone {timezone!r}: {message.removeprefix('Value error, ')}") from None
    info = status(project, directory)
    if not info["running"] or not info["healthy"]:
        raise ServerError(f"no server answering for {info['project']}; start one with `nkb server up`")
    slug = f"experiment-{name}"
    with temporary_settings({PREFECT_API_URL: info["api_url"]}), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("pipeline/pipeline")
        for old in client.read_deployment_schedules(deployment.id):
            if old.slug == slug:
                client.delete_deployment_schedule(deployment.id, old.id)
        (created,) = client.create_deployment_schedules(
            deployment.id, [(when, True)], parameters={"experiment_file": str(experiment_file)}, slug=slug)
    return {"deployment": "pipeline/pipeline", "schedule_id": str(created.id), "slug": slug, "cron": cron,
            "timezone": timezone, "experiment_file": str(experiment_file)}
