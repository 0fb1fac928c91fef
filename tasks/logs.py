"""Send what the library says (warnings, `miles.*` log records) to the task run's Prefect logs,
so the Prefect UI shows what the terminal shows; `print` is captured by `log_prints`."""
from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager
from typing import Iterator

from prefect import get_run_logger


class _ToRunLogger(logging.Handler):
    def __init__(self, run_logger):
        super().__init__(logging.INFO)
        self.run_logger = run_logger

    def emit(self, record: logging.LogRecord) -> None:
        self.run_logger.log(record.levelno, f"{record.name}: {record.getMessage()}")


@contextmanager
def library_logs_to_prefect() -> Iterator[None]:
    run_logger = get_run_logger()
    handler = _ToRunLogger(run_logger)
    library = logging.getLogger("miles")
    library.addHandler(handler)
    # the run logger prints the record on the console itself (and sends it to the API); propagating it
    # to the root's console handler as well printed every library line twice in the terminal
    previous_propagate, library.propagate = library.propagate, False
    previous_level = library.level
    if library.getEffectiveLevel() > logging.INFO:
        library.setLevel(logging.INFO)

    def show(message, category, filename, lineno, file=None, line=None):
        run_logger.warning(f"{category.__name__}: {message} ({filename}:{lineno})")

    with warnings.catch_warnings():
        warnings.showwarning = show
        try:
            yield
        finally:
            library.removeHandler(handler)
            library.propagate = previous_propagate
            library.setLevel(previous_level)
