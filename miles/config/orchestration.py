"""Settings of the Prefect/Ray orchestration around the library."""
from __future__ import annotations

from dataclasses import dataclass

from miles.config.fields import flag


@dataclass(frozen=True)
class OrchestrationConfig:
    """Ray cluster, chunking and task retries."""

    ray_address: str | None = flag(None, "existing Ray cluster, HOST:PORT (default: the job's cluster inside "
                                                 "`ray job submit`, else start a local one)")
    ray_num_cpus: int | None = flag(None, "CPUs of the local Ray (default: all)", minimum=1)
    ray_object_store_mb: int = flag(256, "object store of the local Ray, MiB", minimum=64)
    chunk_size: int = flag(20, "rollout iterations per training task", minimum=1)
    task_retries: int = flag(2, "retries per task; a training chunk runs at most this + 1 times in all", minimum=0)
    task_retry_delay: float = flag(2.0, "seconds before the first retry (doubles each time)", minimum=0.0)
    task_timeout: float = flag(3600.0, "seconds a task may run", minimum=1.0)
    inject_fault: str | None = flag(None, "test hook: raise@ITER or kill@ITER fails the run once at rollout ITER; "
                                          "kill-engine[:N]@ITER SIGKILLs engine N (default 0), "
                                          "stop-engine[:N]@ITER SIGSTOPs it, abort-engine[:N]@ITER makes it abort every "
                                          "request of the rollout (an abort storm), kill-router@ITER SIGKILLs the "
                                          "router, all as rollout ITER starts; slow-rank:N:PHASE[:SECONDS]@ITER makes "
                                          "training rank N sleep SECONDS (default 1) at the end of PHASE (forward, "
                                          "backward, ...) in rollout ITER, a straggler; "
                                          "kill-rank[:N]@ITER SIGKILLs and stall-rank[:N]@ITER "
                                          "SIGSTOPs training rank N as it enters the weight "
                                          "gather of the push after rollout ITER; "
                                          "slow-engine-apply:N[:SECONDS]@ITER makes engine N "
                                          "sleep SECONDS (default 1) in its apply of every weight "
                                          "push from the one after rollout ITER on (embedded); "
                                          "a comma-separated list fires "
                                          "each once (raise@1,kill-engine:1@3), one fault per rollout")
    use_fault_tolerance: bool = flag(False, "supervise the engines and the router (both drivers): "
                                            "relaunch a dead or hung engine on its port, readmit it once it serves "
                                            "the current weights, re-send the requests it never answered; a dead "
                                            "router comes back on its port with every engine registered again")
    engine_max_restarts: int = flag(3, "relaunches per engine (and of the router) before it is left down "
                                       "(--use-fault-tolerance)",
                                    minimum=0)
    engine_health_interval: float = flag(1.0, "seconds between the supervisor's checks of each engine", minimum=0.05)
    engine_health_timeout: float = flag(2.0, "seconds an engine's /health may take before the check fails",
                                        minimum=0.05)
    engine_hung_checks: int = flag(3, "failed /health checks in a row of a live engine before it counts as hung "
                                      "and is killed", minimum=1)
    engine_restart_backoff: float = flag(1.0, "seconds before an engine's first relaunch (doubles per restart, "
                                              "at most 30 s)", minimum=0.0)
    engine_wait_timeout: float = flag(300.0, "seconds a rollout request waits for a healthy engine (the only "
                                             "engine relaunching) before the rollout fails", minimum=1.0)
