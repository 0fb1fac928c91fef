"""The deployments' entrypoint (prefect.yaml: `flows/entrypoint.py:grpo`).

Prefect loads an entrypoint file as a script under a module name of its own, and the Ray workers
of the flow's part on Ray must import that part by its real module name; so the flows live in
`flows.grpo` and this file only hands Prefect the `grpo` flow from there.
"""
from flows.grpo import grpo

__all__ = ["grpo"]
