"""What a run records, in its run dir: the journal (`metrics.jsonl`, one line per iteration), the
metric names and their namespaces, the stdout row and the per-rollout sample tables. Written by
the trainer; read by the trackers' delivery, the health watch, the dashboard and `miles doctor`."""
