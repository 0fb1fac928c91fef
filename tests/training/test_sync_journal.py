"""The synchronous iteration writes what it wrote before the rollout source (issue 51), bit for bit:
the journal's lines (keys in order, every value but times), the metrics handed to the loop, the
timeline's spans and the weight pushes of three iterations on fakes
(tests/support/fake_training.py).

`golden/sync_iteration.json` was recorded from the trainer before the change (commit c8a8d5a, where
`_iteration` branched on async itself); `MILES_RECORD_GOLDEN=1` records it again, for a change that
means to alter the journal (say so in its commit)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from miles.prepare import prepare_config
from miles.record.journal import JOURNAL_NAME
from miles.record.timeline import TIMELINE_NAME, read_spans
from tests.support.fake_training import GENERATE, fake_trainer

ASYNC_ONLY = ("rollout/staleness/", "rollout/mixed_version_ratio", "rollout/buffer_size",
              "rollout/max_weight_staleness", "rollout/reward_by_staleness/")
GOLDEN = Path(__file__).parent / "golden" / "sync_iteration.json"
FLAGS = ["--num-rollout", "3", "--custom-generate-function-path", GENERATE,
         "--log-samples-interval", "2", "--actor-num-gpus-per-node", "2"]


def timeless(row: dict) -> dict:
    """`row` with its times (perf/*, time) blanked: the keys and their order stay."""
    return {k: None if k == "time" or k.startswith("perf/") else v for k, v in row.items()}


def observed(config) -> dict:
    trainer = fake_trainer(config)
    try:
        results = [trainer.run_iteration(r) for r in range(3)]
    finally:
        trainer.close()
    run_dir = Path(config.train.run_dir)
    journal = [json.loads(line) for line in (run_dir / JOURNAL_NAME).read_text().splitlines()]
    return {"journal": [timeless(row) for row in journal],
            "results": [timeless(r.metrics) for r in results],
            "spans": [[s.lane, s.name, s.rollout_id] for s in read_spans(run_dir / TIMELINE_NAME)],
            "pushes": [list(p) for p in trainer.sync.pushes]}


def test_the_synchronous_iteration_writes_what_it_wrote_before(small_config, base_model):
    got = observed(prepare_config(small_config(*FLAGS)))
    if os.environ.get("MILES_RECORD_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert got["pushes"] == want["pushes"] == [[1, None], [2, None], [3, None]]
    assert got["spans"] == want["spans"]
    for mine, theirs in zip(got["journal"], want["journal"], strict=True):
        assert list(mine) == list(theirs)  # the same keys in the same order
        assert mine == theirs
    assert got["results"] == want["results"]


def test_staleness_zero_through_the_producer_writes_the_synchronous_lines(small_config, base_model,
                                                                          tmp_path):
    sync = observed(prepare_config(small_config(*FLAGS, "--run-dir", str(tmp_path / "sync"))))
    k0_config = small_config(*FLAGS, "--fully-async", "--run-dir", str(tmp_path / "k0"))
    k0 = observed(prepare_config(k0_config))
    assert k0["pushes"] == [[v, "in_place"] for v in (1, 2, 3)]  # a push pauses the engines
    assert k0["spans"] == sync["spans"]
    for a, s in zip(k0["journal"], sync["journal"], strict=True):
        kept = {k: v for k, v in a.items() if k in s}
        assert list(kept) == list(s) and kept == s  # the synchronous keys, in order, and values
        extra = [k for k in a if k not in s and not k.startswith("perf/")]
        assert "rollout/buffer_size" in extra and all(k.startswith(ASYNC_ONLY) for k in extra)
        assert a["rollout/staleness/max"] == 0 and a["rollout/max_weight_staleness"] == 0
