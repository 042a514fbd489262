"""`nkb`: the command line over the same stages and flows the Prefect deployments use. Each group of commands lives
in a module of its own (`cli_pipeline`, `cli_warehouse`, `cli_models`, `cli_server`); this one assembles them."""

from __future__ import annotations

import argparse
import os
import sys

from flows import cli_models, cli_pipeline, cli_server, cli_warehouse
from flows.cli_common import EPILOG
from flows.error_lines import USER_ERRORS, describe_error, disk_full


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nkb", description="Neural Knowledge Bank pipeline: stages, warehouse, SQL.",
                                     epilog=EPILOG)
    parser.add_argument("--home", help="warehouse directory (default: $NKB_HOME or ./.nkb)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (cli_pipeline, cli_warehouse, cli_models, cli_server):
        group.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        # The reader stopped early (`nkb sql ... | head`): not our error. Point stdout at /dev/null so that
        # the interpreter's final flush does not raise again, and exit as a process killed by SIGPIPE would.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except USER_ERRORS as exc:
        print(f"error: {describe_error(exc)}", file=sys.stderr)
        return 1
    except OSError as exc:  # the machine's: a full disk, a read-only mount, a missing permission
        print(f"error: {describe_error(exc)}", file=sys.stderr)
        return 1
    except Exception as exc:  # a full disk met by a library that raises its own type (safetensors)
        if not disk_full(exc):
            raise
        print(f"error: {describe_error(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        what = "the query was stopped" if args.command == "sql" else "the warehouse is unchanged by the unfinished stage"
        print(f"interrupted; {what}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
