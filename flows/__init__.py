"""Entry points: Prefect flows that compose the tasks, and the `miles` command."""
