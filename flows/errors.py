"""Errors a user can act on (bad input, a missing upstream stage, a refused query): the command line prints
them in one line, and Prefect's run logs show them without a traceback; those logs also leave out Prefect's
routine lines, so that a pipeline's log is a list of its stages."""

from __future__ import annotations

import logging

import duckdb

from corpus.errors import LuceneIndexError
from warehouse import WarehouseError

# ValueError covers InputFileError, ReadOnlyError and pydantic's ValidationError.
USER_ERRORS = (ValueError, WarehouseError, LuceneIndexError, duckdb.Error)


class WithoutTraceback(logging.Filter):
    """Drops the traceback from Prefect's "Encountered exception during execution: ..." when the exception is
    one of USER_ERRORS: the message already names the file, line and problem."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], USER_ERRORS):
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
