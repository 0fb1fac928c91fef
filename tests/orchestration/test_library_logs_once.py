"""A `miles.*` log record inside a task reaches the terminal once: through the task's run logger (which
also sends it to the Prefect UI), not a second time through the root logger's console handler."""
from __future__ import annotations

import logging



def test_a_library_record_goes_to_the_run_logger_only(monkeypatch):
    import tasks.logs as logs

    seen = []

    class RunLogger:
        def log(self, level, message):
            seen.append(("run", message))

    class Root(logging.Handler):
        def emit(self, record):
            seen.append(("root", record.getMessage()))

    monkeypatch.setattr(logs, "get_run_logger", lambda: RunLogger())
    root = Root()
    logging.getLogger().addHandler(root)
    try:
        with logs.library_logs_to_prefect():
            logging.getLogger("miles.backends.group").info("attached to 1 existing training actors")
        assert seen == [("run", "miles.backends.group: attached to 1 existing training actors")]
        assert logging.getLogger("miles").propagate is True  # restored after the task
    finally:
        logging.getLogger().removeHandler(root)
