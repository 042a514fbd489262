"""Errors a user can act on (bad input, a missing upstream stage, a refused query): the command line prints
them in one line, and Prefect's run logs show them without a traceback; those logs also leave out Prefect's
routine lines, so that a pipeline's log is a list of its stages."""

from __future__ import annotations

import errno
import logging

import duckdb

from corpus.errors import LuceneIndexError
from warehouse import WarehouseError

# ValueError covers InputFileError, ReadOnlyError and pydantic's ValidationError.
USER_ERRORS = (ValueError, WarehouseError, LuceneIndexError, duckdb.Error)


def describe_error(exc: BaseException) -> str:
    """One line for an error a user can act on. A full disk reads the same whoever met it (DuckDB, Arrow, Python):
    what was being written was dropped, and nothing committed is lost."""
    text = str(exc) or type(exc).__name__
    if disk_full(exc):
        where = f" (writing {exc.filename})" if isinstance(exc, OSError) and exc.filename else ""
        return (f"the disk is full{where}: the unfinished work was dropped and the warehouse keeps its last "
                "committed state; free space and run the command again")
    if isinstance(exc, OSError) and exc.errno == errno.EROFS:
        return f"{exc.filename or 'the warehouse'} is on a read-only file system; give a writable --home"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return text


def disk_full(exc: BaseException) -> bool:
    """A full disk, whoever met it: Python and Arrow say ENOSPC, DuckDB and safetensors only in their text."""
    return isinstance(exc, OSError) and exc.errno == errno.ENOSPC or "No space left on device" in str(exc)


def is_user_error(exc: BaseException | None) -> bool:
    """Whether a run's log should show `exc` as one line rather than a traceback."""
    return isinstance(exc, USER_ERRORS) or disk_full(exc) or isinstance(exc, OSError) and exc.errno in (
        errno.EROFS, errno.EACCES, errno.EDQUOT, errno.ENOENT)


class WithoutTraceback(logging.Filter):
    """Drops the traceback from Prefect's "Encountered exception during execution: ..." when the exception is
    one of USER_ERRORS: the message already names the file, line and problem."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and is_user_error(record.exc_info[1]):
            record.exc_info = record.exc_text = None
        return True


class WithoutRoutineStates(logging.Filter):
    """Drops Prefect's "Beginning subflow run 'x' for flow 'y'" and "Finished in state Completed()": a stage flow
    logs one line of its own, named after what it ran (`stage_run_name`), so that a pipeline's log reads as a list
    of stages. Failed and crashed states are kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Beginning subflow run") or message == "Finished in state Completed()")


def tidy_run_logs() -> None:
    """Install the filters on Prefect's flow- and task-run loggers (once per process, after Prefect has set up
    its logging, which would drop a filter added before)."""
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logger = logging.getLogger(name)
        for kind in (WithoutTraceback, WithoutRoutineStates):
            if not any(isinstance(f, kind) for f in logger.filters):
                logger.addFilter(kind())
