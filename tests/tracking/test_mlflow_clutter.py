"""First-hour F3: MLflow's run page showed a "health (13)" section of flat zeros and `eval/arithmetic` beside
`eval/arithmetic-pass_at_1`, the same chart twice. The sink leaves them out; a red flag still shows."""
from __future__ import annotations

from miles.record.journal import JournalLine
from miles.tracking.sinks.base import Delivery
from miles.tracking.sinks.mlflow_sink import MlflowSink


def test_mlflow_charts_no_health_zeros_and_no_eval_twin(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    healthy = {"health/grad_norm": 0.0, "health/stall": 0.0}
    lines = [
        JournalLine(-1, 100.0, {"eval/step": 0.0, "eval/arith": 0.25, "eval/arith-pass_at_1": 0.25}),
        JournalLine(0, 101.0, {"rollout/step": 0.0, "rollout/raw_reward": 0.5, **healthy}),
        JournalLine(1, 102.0, {"rollout/step": 1.0, "rollout/raw_reward": 0.6, **healthy, "health/stall": 1.0,
                               # a reward that is not 0/1: its mean is no pass@1, both are charted
                               "eval/step": 1.0, "eval/chat": 0.4, "eval/chat-pass_at_1": 0.75}),
    ]
    sink = MlflowSink({}, uri, "e", run_name="r")
    sink.open()
    sink.deliver(Delivery(lines))
    sink.close()
    client = MlflowClient(tracking_uri=uri)
    keys = set(client.get_run(sink.run_id).data.metrics)
    assert keys == {"eval/arith-pass_at_1", "rollout/raw_reward", "health/stall", "eval/chat", "eval/chat-pass_at_1"}
    # the red flag is still a point at its rollout
    assert [(m.step, m.value) for m in client.get_metric_history(sink.run_id, "health/stall")] == [(1, 1.0)]
