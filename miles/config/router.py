"""Settings of the router in front of the engines (Miles' flag names where Miles has them)."""
from __future__ import annotations

from dataclasses import dataclass

from miles.config.fields import flag


@dataclass(frozen=True)
class RouterConfig:
    """Router: worker selection, health checks, failover and admin access."""

    router_policy: str = flag("least-inflight", "how a worker is chosen per request",
                              choices=("least-inflight", "round-robin", "power-of-two"), aliases=("--policy",))
    rollout_health_check_interval: float = flag(5.0, "seconds between worker health checks", minimum=0.01)
    rollout_health_check_timeout: float = flag(5.0, "seconds before a health check counts as failed", minimum=0.01)
    miles_router_health_check_failure_threshold: int = flag(
        3, "consecutive failed checks before a worker is quarantined", minimum=1)
    router_readmit_successes: int = flag(2, "consecutive good checks before a quarantined worker is readmitted",
                                         minimum=1)
    disable_rollout_health_check: bool = flag(False, "turn the router's health checks off")
    router_max_retries: int = flag(2, "retries on another worker after a connection error, timeout or 5xx",
                                   minimum=0)
    router_retry_backoff: float = flag(0.05, "base of the jittered exponential backoff between retries (s)",
                                       minimum=0.0)
    router_request_timeout: float = flag(600.0, "seconds a proxied request may take", minimum=0.1)
    router_max_body_mb: float = flag(16.0, "largest request body the router forwards, in MiB (413 past it)",
                                     minimum=0.001)
    router_max_header_kb: float = flag(64.0, "largest request line + headers, in KiB (431 past it)", minimum=1.0)
    router_header_timeout: float = flag(10.0, "seconds a request's headers may take to arrive, and the "
                                                     "window over which its body must keep arriving at >= 16 KiB/s "
                                                     "(408 after)",
                                        minimum=0.1)
    router_admin_token: str | None = flag(None, "token required by /add_worker and /remove_worker "
                                                "(env MILES_ROUTER_ADMIN_TOKEN); required off loopback",
                                          secret=True)
