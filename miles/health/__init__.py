"""Health watch: the Miles page's "What to watch" red flags as detectors over the metric stream."""
from miles.health.detectors import DETECTORS, Rollout, RunFacts, judge
from miles.health.signals import RED, SIGNALS, WARNING, Verdict, metric_name
from miles.health.watch import (HEALTH_LOG, HealthReport, HealthWatch, RedFlagStop, read_health_log, replay,
                                rollouts_of, run_facts, stop_message)

__all__ = ["DETECTORS", "HEALTH_LOG", "RED", "SIGNALS", "WARNING", "HealthReport", "HealthWatch", "RedFlagStop",
           "Rollout", "RunFacts", "Verdict", "judge", "metric_name", "read_health_log", "replay", "rollouts_of",
           "run_facts", "stop_message"]
