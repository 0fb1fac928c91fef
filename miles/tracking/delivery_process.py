"""The trainer's handle on its delivery process, `miles replay-spool RUN_DIR --follow`: a fresh
interpreter (not a fork of a trainer with torch threads and Ray) in its own session, so a
terminal's Ctrl-C reaches only the trainer. The state files are all that passes between them; the
environment carries WANDB_API_KEY and the secrets to scrub, never the command line."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from miles.config.secrets import SCRUB_SECRETS_ENV
from miles.tracking.state import DELIVERY_LOG_PATH

log = logging.getLogger("miles.tracking")
CLOSE_GRACE_S = 60.0  # past the retry timeout, for the final uploads and finishing the tracker runs


class DeliveryProcess:
    def __init__(self, run_dir: Path, session: str, retry_interval: float, secrets: tuple[str, ...],
                 wandb_key: str | None, mlflow_uri: str | None = None):
        self.run_dir = Path(run_dir).resolve()
        root = str(Path(__file__).resolve().parents[2])  # the child runs this same `miles`, whatever its cwd
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        env[SCRUB_SECRETS_ENV] = json.dumps(list(secrets))
        # A wandb service inherited from the parent would outlive this process and keep its run id
        # "in use", so the next delivery process of a resumed run could never reopen that run.
        env.pop("WANDB_SERVICE", None)
        if wandb_key:
            env["WANDB_API_KEY"] = wandb_key
        if mlflow_uri:  # the server this run was given: the only one the delivery process talks to
            env["MLFLOW_TRACKING_URI"] = mlflow_uri  # (in its environment: a URI may carry a password)
        with (self.run_dir / DELIVERY_LOG_PATH).open("ab") as output:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "miles.tracking.cli", str(self.run_dir), "--follow", "--session", session,
                 "--retry-interval", str(retry_interval)],
                stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.reported = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def check(self, closing: bool = False) -> bool:
        """Whether it still runs; a stop the trainer did not ask for (any exit before its close, a
        failed one during it) is reported once. Training goes on regardless."""
        code = self.proc.poll()
        if code is not None and (code != 0 or not closing) and not self.reported:
            self.reported = True
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            log.warning("tracking: the delivery process stopped (%s)%s; training goes on, the recorded points "
                        "stay spooled in the journal for the next run of this run dir or `miles replay-spool %s` "
                        "(its log: %s)", how, " while finishing" if closing else "", self.run_dir,
                        self.run_dir / DELIVERY_LOG_PATH)
        return code is None

    def wait(self, timeout: float) -> None:
        """Wait for it to finish after the trainer's close; stop it past `timeout` + CLOSE_GRACE_S."""
        try:
            self.proc.wait(timeout + CLOSE_GRACE_S)
        except subprocess.TimeoutExpired:
            log.warning("tracking: the delivery process did not finish within %.0fs; stopping it (what it did "
                        "not deliver stays spooled for `miles replay-spool %s`)", timeout + CLOSE_GRACE_S,
                        self.run_dir)
            self.reported = True
            self.proc.kill()
            self.proc.wait()
        self.check(closing=True)
