"""Miles on Prefect: the library (config, engines, router, rollout, backends, tracking).

Nothing in this package imports Prefect; `flows/` and `tasks/` wrap it.
"""
__version__ = "0.1.0"
