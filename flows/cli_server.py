"""`nkb server` and `nkb schedule`: a local Prefect server with workers, and scheduled experiments."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from flows.cli_common import server_command


def refused(exc: Exception) -> int:
    """A server command's one-line refusal, and its exit status."""
    print(f"error: {exc}", file=sys.stderr)
    return 1


def cmd_server(args) -> int:
    from flows import server
    project = Path(args.project)
    if args.action == "up":
        started = time.perf_counter()
        if args.experiment:  # a wrong file refused before anything starts
            from stages.experiment import Experiment
            Experiment.load(args.experiment)
        try:
            state = server.up(project, port=args.port, home=args.home)
            if args.experiment:
                server.deploy_experiment(project, Path(args.experiment))
                print(f"run forms: {args.experiment}'s settings")
        except server.ServerError as exc:
            return refused(exc)
        print(f"\nReady in {time.perf_counter() - started:.1f} s. Open the UI at {state.url}\n"
              f"To use this server from a shell:\n  export PREFECT_API_URL={state.api_url}\n"
              f"Run the pipeline:   prefect deployment run pipeline/pipeline\n"
              f"Rerun one stage:    prefect deployment run inject/inject --param force=true\n"
              f"Stop everything:    {server_command('down', project)}")
        return 0
    if args.action == "down":
        try:
            server.down(project)
        except server.ServerError as exc:
            return refused(exc)
        return 0
    info = server.status(project)
    if args.format == "json":
        print(json.dumps(info, indent=1))
    elif not info["running"]:
        print(f"no server started from {info['project']} runs (`{server_command('up', project)}` starts one)")
    else:
        print(f"server at {info['url']} ({'healthy' if info['healthy'] else 'NOT answering'}); UI: {info['url']}")
        for name, p in info["processes"].items():
            print(f"  {name:<11} pid {p['pid']:<8} {'running' if p['running'] else 'STOPPED'}  log: {p['log']}")
    return 0 if info["running"] else 3


def cmd_deploy(args) -> int:
    from flows import server
    try:
        changed = server.deploy_experiment(Path(args.project), Path(args.experiment))
    except server.ServerError as exc:
        return refused(exc)
    print(f"the run forms of {len(changed)} deployments now hold {args.experiment}'s settings: the pipeline runs "
          f"that file, and each stage's form its settings ({', '.join(changed[1:])})")
    return 0


def cmd_schedule(args) -> int:
    from flows import server
    try:
        made = server.schedule(Path(args.project), Path(args.experiment), args.cron, args.timezone)
    except server.ServerError as exc:
        return refused(exc)
    print(f"scheduled {made['deployment']} ({made['slug']}) at cron {made['cron']!r} {made['timezone']}: each run "
          f"reads {made['experiment_file']} and redoes what changed since the last one")
    return 0


def add_commands(sub) -> None:
    sch = sub.add_parser("schedule", help="run an experiment on a schedule (e.g. a weekly knowledge refresh)",
                         description="Add a schedule to the running server's pipeline deployment that runs an "
                                     "experiment file. Point the file's knowledge path at the newest dump (e.g. a "
                                     "link your download job updates): each run reruns only what the new dump "
                                     "changes, and `nkb report` shows the refresh beside the report before. "
                                     "Scheduling the same experiment again replaces its schedule.")
    sch.add_argument("experiment", help="the experiment's YAML file")
    sch.add_argument("--cron", default="0 3 * * 1", help="when, as cron (default '0 3 * * 1': Mondays 03:00)")
    sch.add_argument("--timezone", default="UTC", help="the cron's time zone (default UTC)")
    sch.add_argument("--project", default=".", help="project directory whose server to use (default: .)")
    sch.set_defaults(func=cmd_schedule)

    dep = sub.add_parser("deploy", help="fill the running server's run forms with an experiment's settings",
                         description="Set the running server's deployments to an experiment: the pipeline's form "
                                     "runs the file, and each stage's form starts from that experiment's settings "
                                     "for it (its base+NKB row's for a model stage), so Run in the UI reruns your "
                                     "experiment's stage, not the demo's. `nkb server up --experiment FILE` does it "
                                     "as the server starts.")
    dep.add_argument("experiment", help="the experiment's YAML file")
    dep.add_argument("--project", default=".", help="project directory whose server to use (default: .)")
    dep.set_defaults(func=cmd_deploy)

    srv = sub.add_parser("server", help="start, stop or inspect a local Prefect server with workers",
                         description="up: start a Prefect server on 127.0.0.1, create the cpu and gpu work pools "
                                     "(gpu: one run at a time), deploy every stage and the pipeline, start one "
                                     "worker per pool. down: stop exactly what `up` started. status: what runs "
                                     "and where the UI is. The server serves the warehouse's own Prefect database "
                                     "(HOME/prefect), so the UI lists every flow run made for it, and `nkb` commands "
                                     "on it send their flow runs there while it is up; logs live in PROJECT/.prefect.")
    srv.add_argument("action", choices=["up", "down", "status"], help="what to do")
    srv.add_argument("--port", type=int, default=4200, help="server port on 127.0.0.1 (default 4200)")
    srv.add_argument("--project", default=".", help="project directory with prefect.yaml (default: .)")
    srv.add_argument("--format", choices=["text", "json"], default="text", help="status output format")
    srv.add_argument("--experiment", metavar="FILE", help="up: fill the run forms with this experiment's settings "
                     "(`nkb deploy FILE` later does the same); default: the demo's")
    srv.set_defaults(func=cmd_server)
