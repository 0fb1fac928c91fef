"""The router in front of the engines: Miles' endpoints, a raw-ASGI proxy with failover, health checks.

`start_router(config)` runs one in-process; `miles router` runs one as a process.
"""
from miles.router.app import Router
from miles.router.server import RouterHandle, start_router
from miles.router.stats import StatsSnapshot

__all__ = ["Router", "RouterHandle", "StatsSnapshot", "start_router"]
