"""The stdout row shape, the metric-key mapping, the journal's resume cut and the delivery side's
view of it (complete lines, as they are appended)."""
from __future__ import annotations

import pytest

from miles.record.journal import Journal, JournalFollower, JournalLine, read_journal
from miles.record.names import map_metrics, metric_key, step_key
from miles.record.row import format_eval, format_row, progress

PAGE_METRICS = {"train/loss": 0.412, "rollout/raw_reward": 0.61, "train/kl_loss": 0.018, "perf/rollout_time": 18.4,
                "perf/train_time": 22.1, "perf/update_weights_time": 2.1, "perf/step_time": 42.6,
                "train/grad_norm": 0.93, "train/lr": 1e-6}


def test_row_matches_the_page():
    assert format_row(12, 3000, PAGE_METRICS, show_kl=True).splitlines() == [
        "[trainer] iter 12 (13/3000)     | loss=0.412 reward=0.61 kl=0.018",  # padded to "iter 2999 (3000/3000)"
        "                                | rollout=18.4s train=22.1s p2p=2.1s  (total 42.6s)",
        "                                | grad_norm=0.93 lr=1.0e-06",
    ]


def test_the_bar_column_stays_put_as_the_ids_grow():
    """First-hour N17: the `|` moved right as the iteration number grew (52 -> 53 -> 56)."""
    columns = {format_row(i, 100, {}, show_kl=False).splitlines()[0].index("|") for i in (0, 9, 10, 99)}
    assert len(columns) == 1


def test_the_last_row_counts_every_rollout_done():
    # rollout ids start at 0: the last of 60 is rollout 59, and its row says all 60 are done
    assert format_row(59, 60, PAGE_METRICS, show_kl=False).startswith("[trainer] iter 59 (60/60) | ")


def test_the_row_says_how_long_the_run_has_taken_and_about_how_long_is_left():
    lines = [JournalLine(-1, 100.0, {"eval/arithmetic": 0.2}),  # the base eval, before rollout 0
             *(JournalLine(i, 104.0 + 4 * i, {"perf/step_time": 4.0}) for i in range(3))]
    elapsed, left = progress(lines, 60, now=113.0)
    assert (elapsed, left) == (13.0, 57 * 4.0)
    second = format_row(2, 60, PAGE_METRICS, show_kl=False, elapsed=elapsed, left=left).splitlines()[1]
    assert second.endswith("(total 42.6s; training 13s, ~3m48s left)")
    # a journal that starts with a rollout: its start is that line's time less its step; the last row: 0s left
    assert progress(lines[1:], 3, now=113.0) == (13.0, 0.0)
    assert progress([], 3, now=1.0) == (None, None)


def test_the_estimate_left_is_paced_by_measured_steps_not_the_start_up():
    """First-hour N17: the first row said ~2m39s left of 65 s: its one step (1.6 s) loaded the weights and
    warmed the caches, and it was the pace for the 99 rollouts after it; chunk boundaries (N15) made the
    estimate jump up as they went by."""
    warm_up, pace, boundary = 1.6, 0.15, 1.8
    first = [JournalLine(0, 10.0, {"perf/step_time": warm_up})]
    assert progress(first, 100, now=10.0)[1] is None  # nothing measured past the start-up yet: no guess
    steps = [warm_up] + [pace] * 19 + [boundary] + [pace] * 5  # rollout 20 starts the second chunk
    lines = [JournalLine(i, 10.0 + i, {"perf/step_time": t}) for i, t in enumerate(steps)]
    assert progress(lines[:2], 100, now=11.0)[1] == 98 * pace
    assert progress(lines, 100, now=40.0)[1] == (100 - len(steps)) * pace  # the boundary's step is passed over


def test_row_without_kl_loss_and_with_missing_metrics():
    first, second, third = format_row(3, 10, {"train/loss": 0.5}, show_kl=False).splitlines()
    assert first == "[trainer] iter 3 (4/10)  | loss=0.500 reward=n/a"
    assert "rollout=n/a" in second and third.endswith("grad_norm=n/a lr=n/a")


def test_small_values_are_readable_and_zero_stays_zero():
    first, _, third = format_row(0, 3, {"train/loss": -4.7e-09, "rollout/raw_reward": 0.0, "train/kl_loss": 0.0004,
                                        "train/grad_norm": 0.0, "train/lr": 1e-6}, show_kl=True).splitlines()
    assert first == "[trainer] iter 0 (1/3) | loss=-4.7e-09 reward=0.00 kl=4.0e-04"
    assert third.endswith("grad_norm=0.00 lr=1.0e-06")


def test_printed_eval_uses_the_names_the_trackers_store():
    line = format_eval("base eval", {"eval/arithmetic": 0.2291, "eval/arithmetic-pass@1": 0.23})
    assert line == "[trainer] base eval eval/arithmetic=0.229 eval/arithmetic-pass_at_1=0.230"


@pytest.mark.parametrize("name, key", [
    ("passrate/pass@4", "passrate/pass_at_4"), ("eval/gsm8k/pass@16", "eval/gsm8k/pass_at_16"),
    ("train/loss", "train/loss"), ("perf/tok(s)", "perf/tok_s_"), ("rollout/zero_std/count_0", "rollout/zero_std/count_0"),
])
def test_metric_key_mapping(name, key):
    assert metric_key(name) == key and metric_key(key) == key


def test_mapping_collision_is_an_error():
    with pytest.raises(ValueError, match="pass@4"):
        map_metrics({"passrate/pass@4": 1.0, "passrate/pass_at_4": 2.0})


def test_step_axes():
    assert step_key("train/loss") == "train/step" and step_key("eval/arith") == "eval/step"
    assert {step_key(k) for k in ("rollout/x", "perf/x", "multi_turn/x", "passrate/x")} == {"rollout/step"}


def test_journal_keeps_the_first_line_of_a_redone_rollout(tmp_path):
    journal = Journal(tmp_path)
    for rid in range(3):
        assert journal.append(JournalLine(rid, 1000.0 + rid, {"train/loss": rid / 10}))
    # redone after a crash: the journal (and every tracker) keeps the first line, the redo is kept aside
    assert not journal.append(JournalLine(1, 2000.0, {"train/loss": 9.0}))
    assert [(ln.rollout_id, ln.metrics["train/loss"]) for ln in read_journal(journal.path)] == [
        (0, 0.0), (1, 0.1), (2, 0.2)]
    assert [ln.metrics["train/loss"] for ln in read_journal(journal.redone_path)] == [9.0]
    with journal.path.open("a") as f:
        f.write('{"rollout_id": 3, "ti')  # a writer killed mid-line
    reopened = Journal(tmp_path)  # the torn line is cut, so the next line starts clean
    assert reopened.append(JournalLine(3, 3000.0, {"train/loss": 0.3}))
    assert [ln.rollout_id for ln in read_journal(journal.path)] == [0, 1, 2, 3]


def test_follower_reads_complete_lines_as_they_are_appended(tmp_path):
    journal = Journal(tmp_path)
    follower = JournalFollower(journal.path)
    assert follower.read() == []  # no journal yet
    for rid in range(2):
        journal.append(JournalLine(rid, 1000.0 + rid, {"train/loss": rid / 10}))
    assert [ln.rollout_id for ln in follower.read()] == [0, 1]
    with journal.path.open("a") as f:
        f.write('{"rollout_id": 2, "ti')  # a line still being written
    assert [ln.rollout_id for ln in follower.read()] == [0, 1]
    with journal.path.open("a") as f:
        f.write('me": 3000.0, "train/loss": 3.0}\n')
    assert [ln.rollout_id for ln in follower.read()] == [0, 1, 2]
