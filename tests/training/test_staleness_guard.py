"""--staleness-guard: the controller tightens the producer's bound one version per iteration whose
mismatch KL, ESS or clip fraction crosses its bound, down to 0 and never back up; a resume keeps the
tightened bound (read back from the journal)."""
from miles.config import parse_config
from miles.record.journal import JournalLine
from miles.run.staleness_guard import TIGHTENED, StalenessGuard, resumed_bound

FLAGS = ["--max-weight-staleness", "2", "--use-tis", "--staleness-guard", "--staleness-guard-max-mismatch-kl",
         "0.01", "--staleness-guard-min-ess", "0.8", "--staleness-guard-max-clipfrac", "0.3"]
CALM = {"train/mismatch_kl": 0.001, "train/ess": 0.99, "train/pg_clipfrac": 0.01}


class Producer:
    def __init__(self, k):
        self.max_staleness = k

    def set_max_staleness(self, k):
        self.max_staleness = k


def test_each_crossed_bound_tightens_by_one_down_to_synchronous(capsys):
    config = parse_config(FLAGS)
    guard, producer = StalenessGuard(config.train), Producer(2)
    assert guard.observe(0, CALM, producer) == {TIGHTENED: 0.0, "rollout/max_weight_staleness": 2.0}
    out = guard.observe(1, {**CALM, "train/mismatch_kl": 0.2, "train/ess": 0.5}, producer)
    assert out[TIGHTENED] == 1.0 and producer.max_staleness == 1
    assert out["rollout/staleness_guard/reason_mismatch_kl"] == 1.0 and out["rollout/staleness_guard/reason_ess"] == 1.0
    assert "tightened to 1" in capsys.readouterr().out
    guard.observe(2, {**CALM, "train/pg_clipfrac": 0.5}, producer)
    assert producer.max_staleness == 0 and "(synchronous)" in capsys.readouterr().out
    out = guard.observe(3, {**CALM, "train/pg_clipfrac": 0.5}, producer)
    assert producer.max_staleness == 0 and out[TIGHTENED] == 0.0  # already synchronous
    guard.observe(4, CALM, producer)
    assert producer.max_staleness == 0  # never loosened


def test_a_resume_keeps_the_tightened_bound():
    config = parse_config(FLAGS)
    journal = [JournalLine(0, 0.0, {"rollout/max_weight_staleness": 2.0}),
               JournalLine(1, 0.0, {"rollout/max_weight_staleness": 1.0}),
               JournalLine(2, 0.0, {"rollout/max_weight_staleness": 0.0})]
    assert resumed_bound(config.train, journal, 1) == 1  # rollout 2 is redone: its tightening is not kept
    assert resumed_bound(config.train, journal, 2) == 0
    unguarded = parse_config(["--max-weight-staleness", "2", "--use-tis"])
    assert resumed_bound(unguarded.train, journal, 2) == 2
