"""Issue 54: the ranks' phase marks settled into waits (`miles.backends.rank_phases.settle_waits`),
as a barrier at each mark would have shown them, without one. Hand-made spans of two ranks whose
collectives started when the last rank arrived."""
from miles.backends.rank_phases import ARRIVE, COMPUTE, WAIT, RankSpans, settle_waits
from miles.run.stragglers import RankCoords


def spans(rank: int, recorded, offset: float = 0.0) -> RankSpans:
    return RankSpans(RankCoords(0, rank), [(p, k, b + offset, e + offset) for p, k, b, e in recorded],
                     clock_offset=offset)


def mark(phase: str, at: float):
    return (phase, ARRIVE, at, at)


# rank 1's forward is 1.5 s late; rank 0's backward began at 1.0 and was held in its first
# collective until 2.5, then worked 0.6 s; both reach the gradient reduction at 3.1 (rank 0 just
# before), and the reduction ends at 3.3 on both
FAST = [("forward", COMPUTE, 0.0, 1.0), mark("forward", 1.0), ("backward", COMPUTE, 1.0, 3.1),
        mark("backward", 3.1), mark("grad_reduce", 3.1), ("grad_reduce", COMPUTE, 3.1, 3.3)]
SLOW = [("forward", COMPUTE, 0.0, 2.5), mark("forward", 2.5), ("backward", COMPUTE, 2.5, 3.1),
        mark("backward", 3.1), mark("grad_reduce", 3.1), ("grad_reduce", COMPUTE, 3.1, 3.3)]


def test_the_early_rank_waits_and_its_next_span_is_its_own_work():
    fast, slow = spans(0, FAST), spans(1, SLOW)
    settle_waits([fast, slow])
    assert fast.spans[:3] == [("forward", COMPUTE, 0.0, 1.0), ("forward", WAIT, 1.0, 2.5),
                              ("backward", COMPUTE, 2.5, 3.1)]
    assert fast.seconds() == {"forward": 1.0, "backward": 3.1 - 2.5, "grad_reduce": 3.3 - 3.1}
    assert fast.seconds(WAIT) == {"forward": 1.5}
    assert slow.spans == [s for s in SLOW if s[1] != ARRIVE]  # the last to arrive waits for nobody
    assert all(kind != ARRIVE for r in (fast, slow) for _, kind, _, _ in r.spans)


def test_a_mark_reached_while_held_counts_from_when_the_rank_went_on():
    # rank 0 marks backward at 1.0 and the reduction at 1.0001; rank 1 reaches both at 1.5: rank 0
    # waited 0.5 s once, not twice
    fast = spans(0, [mark("backward", 1.0), mark("grad_reduce", 1.0001),
                     ("grad_reduce", COMPUTE, 1.0001, 1.6)])
    slow = spans(1, [mark("backward", 1.5), mark("grad_reduce", 1.5001),
                     ("grad_reduce", COMPUTE, 1.5001, 1.6)])
    settle_waits([fast, slow])
    waits = [s for s in fast.spans if s[1] == WAIT]
    assert [w[0] for w in waits] == ["backward", "grad_reduce"]
    assert waits[0][2:] == (1.0, 1.5)
    assert abs((waits[1][3] - waits[1][2]) - 0.0001) < 1e-9
    assert sum(e - b for _, _, b, e in waits) < 0.5 + 1e-3


def test_ranks_on_other_clocks_settle_on_rank_0s():
    # rank 1's clock runs 40 s ahead: the same waits, drawn on each rank's own clock
    fast, slow = spans(0, FAST), spans(1, SLOW, offset=40.0)
    settle_waits([fast, slow])
    assert fast.seconds(WAIT) == {"forward": 1.5}
    assert slow.seconds(WAIT) == {}
    assert slow.spans[0] == ("forward", COMPUTE, 40.0, 42.5)


def test_ranks_that_disagree_on_a_mark_are_settled_up_to_it():
    fast = spans(0, [mark("forward", 1.0), ("backward", COMPUTE, 1.0, 2.0), mark("backward", 2.0)])
    slow = spans(1, [mark("forward", 1.5), ("backward", COMPUTE, 1.5, 2.0), mark("grad_reduce", 2.0)])
    settle_waits([fast, slow])
    assert fast.spans == [("forward", WAIT, 1.0, 1.5), ("backward", COMPUTE, 1.5, 2.0)]
    assert slow.spans == [("backward", COMPUTE, 1.5, 2.0)]


def test_a_span_that_ended_before_the_collective_started_keeps_no_time():
    # the rank went on after its mark into a span with no collective that ended before the
    # last rank arrived: its time there counts as waiting (the mark promised a collective next)
    fast = spans(0, [mark("log_probs", 1.0), ("forward", COMPUTE, 1.0, 1.2),
                     ("backward", COMPUTE, 1.2, 2.5)])
    slow = spans(1, [mark("log_probs", 2.0), ("forward", COMPUTE, 2.0, 2.2),
                     ("backward", COMPUTE, 2.2, 2.5)])
    settle_waits([fast, slow])
    assert fast.spans == [("log_probs", WAIT, 1.0, 2.0), ("forward", COMPUTE, 1.2, 1.2),
                          ("backward", COMPUTE, 2.0, 2.5)]
