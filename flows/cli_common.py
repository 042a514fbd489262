"""What the `nkb` commands share: the environment flows run in, output files, how a command is called again, and
a command's options read from a config model (`--set key=value`, or an option per field)."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import secrets
import sys
import typing
from pathlib import Path

from pydantic import ValidationError

from flows.error_lines import disk_full
from stages.configs import is_list, set_value, validation_problems
from warehouse.sql import FORMATTERS

EPILOG = "The warehouse is ./.nkb unless --home or $NKB_HOME says otherwise."


def prepare_environment(home: Path) -> None:
    """Prefect state lives inside the warehouse home unless the user chose otherwise, and while `nkb server up`
    serves this warehouse's database, flow runs go to that server (its UI then lists them as they run)."""
    from flows.server import prefect_home, served
    prefect_home(home).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(prefect_home(home)))
    if "PREFECT_API_URL" not in os.environ and (url := served(home)):
        os.environ["PREFECT_API_URL"] = url
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # The temporary server that runs flows without a configured server can be slow to start on 2 cores.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


@contextlib.contextmanager
def local_flow_settings():
    """Flow runs in this process. Without a configured server they run under a temporary one that stops
    with the process, so Prefect's flow-run heartbeats (on by default since 3.8, for a server to tell a
    crashed run) have no one to tell; their thread also holds every flow up to a second at exit, ~50 s of
    a demo's 50 stage flows. They stay on wherever a server is configured."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, get_current_settings, temporary_settings
    if get_current_settings().api.url:
        yield
    else:
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            yield


def import_uninterrupted(*modules: str) -> None:
    """Import `modules` with Ctrl-C (and SIGTERM) held back until they are in, then delivered as usual: an import
    of torch cut in half leaves its C part registered and its Python part gone, and every later import of it fails
    with an error about something else ("could not parse dispatch key: MPS") in place of the "interrupted" line."""
    import importlib
    import signal
    held: list[int] = []  # a Python handler, so that whichever thread the signal reaches, the import finishes
    previous = {s: signal.signal(s, lambda signum, _: held.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for module in modules:
            importlib.import_module(module)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if held:
        os.kill(os.getpid(), held[0])  # delivered now, as it would have been


def _kind(field) -> tuple[str, list | None]:
    """How a config field's values look (`int`, `a,b,...`, `specific|top`), and its choices when it has a few."""
    annotation = field.annotation
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Union:
        inner = [a for a in args if a is not type(None)]
        annotation = inner[0] if len(inner) == 1 else annotation
        args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:  # a constrained type (Name): say what it holds
        annotation = args[0]
        args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return "|".join(map(str, args)), list(args)
    if is_list(annotation):
        return ("true|a,b,..." if bool in args else "a,b,..."), None  # every item, or those listed
    return getattr(annotation, "__name__", str(annotation)), None


def _shown_default(field) -> str:
    return "required" if field.is_required() else f"default {field.get_default(call_default_factory=True)!r}"


def _field_help(name: str, field) -> str:
    return f"  {name}={_kind(field)[0]}  ({_shown_default(field)})\n      {field.description or ''}"


def config_options(parser: argparse.ArgumentParser, config: type) -> None:
    """An option per field of `config` (`--strength 0.5`), its type, choices, default and help drawn from the field,
    its value read as `--set` reads one: a command's options are its config model's fields, declared once."""
    for name, field in config.model_fields.items():
        kind, choices = _kind(field)
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, required=field.is_required(), choices=choices,
                            metavar=None if choices else kind.upper(),
                            type=lambda text, f=field: set_value(text, f),
                            help=f"{field.description or ''} ({_shown_default(field)})")


def config_from_options(config: type, args):
    """`config` from the options `config_options` added (those not given keep the field's default)."""
    return config(**{name: getattr(args, name) for name in config.model_fields if getattr(args, name) is not None})


def experiment_epilog() -> str:
    import textwrap

    from stages.experiment import Experiment
    lines = ["experiment keys (YAML; paths relative to the file; '{sample_world}': the sample world's folder):"]
    for name, field in Experiment.model_fields.items():
        lines += textwrap.wrap(field.description or "", 110, initial_indent=f"  {name:<13} ",
                               subsequent_indent=" " * 16)
    return "\n".join(lines)


def config_epilog(config: type) -> str:
    return "\n".join(["config fields (set with --set key=value):"] +
                     [_field_help(name, field) for name, field in config.model_fields.items()])


def _set_value(fields: dict, key: str, value: str, command: str):
    """The value `--set key=value` gives a field (`stages.configs.set_value`: the experiments' rules)."""
    if key not in fields:
        raise SystemExit(f"error: `{command}` has no config field {key!r}; fields: {', '.join(fields)}")
    try:
        return set_value(value, fields[key])
    except ValueError as exc:
        raise SystemExit(f"error: --set {key}: {exc}") from None


def set_values(config: type, pairs: list[str], command: str) -> dict[str, typing.Any]:
    """The values `--set key=value` pairs give `config`'s fields. Errors name the field and `command`, whose --help
    lists them."""
    values: dict[str, typing.Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep:
            raise SystemExit(f"error: --set expects key=value, got {pair!r}")
        values[key] = _set_value(config.model_fields, key, value, command)
    return values


def parse_sets(config: type, pairs: list[str], command: str, over: dict[str, typing.Any] | None = None):
    """`config` from `--set key=value` pairs, over the values `over` (an experiment's) where given."""
    try:
        return config.model_validate((over or {}) | set_values(config, pairs, command))
    except ValidationError as exc:
        problems = "; ".join(validation_problems(exc))
        raise SystemExit(f"error: invalid config for `{command}`: {problems}\n(see `{command} --help`)") from None


def output_format(args) -> str:
    """--format if given, else the --output file's extension (.csv, .json), else an aligned table."""
    if args.format:
        return args.format
    suffix = Path(args.output or "").suffix.lstrip(".").lower()
    if suffix == "parquet" and "parquet" in getattr(args, "formats", ()):
        return "parquet"
    return suffix if suffix in FORMATTERS else "table"


def write_output(path: str, data: str | bytes | typing.Callable[[str], None]) -> None:
    """Write an output file the user named, creating its folder: text, bytes, or what `data(temporary path)`
    writes. Whole or not at all: written beside it under a name of its own, then renamed over it, so a full disk
    leaves neither an empty file nor a half-written one (nor spoils one that was there)."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = str(target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}.nkb-partial"))
        try:
            if callable(data):
                data(partial)
            else:
                Path(partial).write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
            os.replace(partial, target)
        finally:
            Path(partial).unlink(missing_ok=True)
    except OSError as exc:
        if disk_full(exc):
            raise
        raise ValueError(f"cannot write {path}: {exc.strerror or exc}") from None
    print(f"wrote {path}", file=sys.stderr)


def emit(text: str, output: str | None) -> None:
    """`text` into the file `output`, or on standard output; ended by one newline either way."""
    text = text if text.endswith("\n") else text + "\n"
    if output:
        write_output(output, text)
    else:
        sys.stdout.write(text)


def program() -> str:
    """How to call this command again: `nkb` when it is on PATH, else the path it was run by."""
    me = os.path.abspath(sys.argv[0])
    return "nkb" if shutil.which("nkb") == me or not os.path.exists(me) else os.path.relpath(me)


def server_command(action: str, project: Path) -> str:
    """`nkb server ACTION` for this project, as a command that works from any directory."""
    return f"{program()} server {action} --project {shlex.quote(str(project.resolve()))}"


def home_flag(args) -> str:
    return f" --home {shlex.quote(str(args.home))}" if args.home else ""
