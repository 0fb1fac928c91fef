"""Miles on Prefect: the library.

Five story files on top (`train`, `prepare`, `preflight`, `loop`, `trainer`) and a package per job:
run/ (the loop's support), record/ (what a run writes, `record.layout`), config/, serving/, cluster/,
tiny/, pretrained/, engines/, router/, rollout/, backends/, tracking/, health/, compare/, diagnose/,
dashboard/, profiling/, mlflow_ui/.
Nothing in this package imports Prefect; `flows/` and `tasks/` wrap it.
"""
__version__ = "0.1.0"
