"""Continuous batching, driven in process on the real model runner: a request that arrives while others
decode joins their batch at the next step, leaves it the step it finishes, and samples exactly the tokens
it samples alone; weight swaps wait for the running batch to empty.

Arrivals are made deterministic by submitting the next request from the sink of a running one (the sink
runs on the scheduler thread, between two steps), so no test depends on timing.
"""
from __future__ import annotations

from concurrent.futures import Future

from miles.engines.metrics import EngineMetrics
from miles.engines.scheduler import EngineRequest, FinishEvent, Scheduler
from miles.engines.sglang_request import SamplingParams
from tests.support.in_process_engine import TIMEOUT_S, Tracked, alone, params, prompt


def test_a_request_arriving_mid_decode_joins_the_running_batch(scheduler, runner):
    before = scheduler.stats()
    long_p, short_p = params(40, seed=7), params(5, seed=11)
    long_ids, short_ids = prompt(runner, "what is 12+13? 12+13="), prompt(runner, "3+4=")
    long_len_when_short_done: list[int] = []
    short = Tracked(scheduler, "short", short_ids, short_p)
    short.done.add_done_callback(lambda _: long_len_when_short_done.append(len(long.tokens)))
    long = Tracked(scheduler, "long", long_ids, long_p).on_token(3, short.submit).submit()
    long_result, short_result = long.result(), short.result()
    after = scheduler.stats()

    # the short one was served while the long one decoded: it did not wait for that batch to end
    assert long_len_when_short_done and long_len_when_short_done[0] < 40
    assert long_result.finish_reason.type == short_result.finish_reason.type == "length"
    assert len(long_result.output_ids) == 40 and len(short_result.output_ids) == 5
    assert after.num_joined_running - before.num_joined_running == 1
    assert after.num_batches - before.num_batches == 2  # two prefill groups, one running batch
    assert after.max_batch_size_seen >= 2
    # the long one's decode steps: 39 after its prefill; the short one's 4 ran inside them
    assert after.num_decode_steps - before.num_decode_steps == 39

    # and both sampled exactly what they sample alone (per-request seeds, whatever shares the batch)
    long_alone, short_alone = alone(scheduler, "la", long_ids, long_p), alone(scheduler, "sa", short_ids, short_p)
    assert long_result.output_ids == long_alone.output_ids
    assert short_result.output_ids == short_alone.output_ids
    worst = max(abs(a - b) for a, b in zip(long_result.output_logprobs + short_result.output_logprobs,
                                            long_alone.output_logprobs + short_alone.output_logprobs))
    assert worst < 1e-4, f"log-probs differ by {worst} between batched and alone"


def test_staggered_arrivals_sample_the_same_tokens_as_alone(scheduler, runner):
    """Six requests with different prompt lengths and budgets, each arriving at a different step of the
    ones before: rows join with different padding, the longest prompt leaves first (its columns are cut)."""
    texts = ["what is 12+13? 12+13=", "1+2=", "hello 99+1=", "7+", "37+58=", "5+5+5="]
    budgets = [6, 30, 12, 25, 9, 18]
    temps = [1.0, 0.7, 1.0, 0.0, 1.0, 0.9]
    tracked = [Tracked(scheduler, f"r{i}", prompt(runner, t), params(b, seed=100 + i, temperature=temps[i]))
               for i, (t, b) in enumerate(zip(texts, budgets))]
    for i in range(len(tracked) - 1):  # request i+1 arrives at token 2 of request i
        tracked[i].on_token(2, tracked[i + 1].submit)
    before = scheduler.stats()
    tracked[0].submit()
    together = [t.result() for t in tracked]
    assert scheduler.stats().num_joined_running - before.num_joined_running == len(tracked) - 1
    for t, got in zip(tracked, together):
        single = alone(scheduler, t.rid + "-alone", t.request.prompt_ids, t.request.params)
        assert got.output_ids == single.output_ids, t.rid
        assert max(abs(a - b) for a, b in zip(got.output_logprobs, single.output_logprobs)) < 1e-4, t.rid


def test_abort_of_one_running_row_leaves_the_others(scheduler, runner):
    keep = Tracked(scheduler, "keep", prompt(runner, "1+2="), params(20, seed=3))
    doomed = Tracked(scheduler, "doomed", prompt(runner, "9+9="), params(200, seed=4))
    keep.on_token(1, doomed.submit)
    doomed.on_token(2, lambda: scheduler.abort("doomed"))
    keep.submit()
    assert doomed.result().finish_reason.type == "abort"
    kept = keep.result()
    assert kept.finish_reason.type == "length" and len(kept.output_ids) == 20
    assert kept.output_ids == alone(scheduler, "keep2", keep.request.prompt_ids, keep.request.params).output_ids


def test_weight_swap_waits_for_the_running_batch_and_blocks_admission(scheduler, runner):
    """A control (how weights are swapped) queued mid-decode runs only once the batch is empty, and a
    request queued after it is admitted under the new version: no request sees two versions."""
    seen_at_swap: list[bool] = []
    later = Tracked(scheduler, "later", prompt(runner, "2+2="), params(3, seed=5))
    running = Tracked(scheduler, "running", prompt(runner, "4+4="), params(15, seed=6))

    def swap():
        seen_at_swap.append(running.done.done())
        scheduler.weight_version = "v2"

    def queue_swap_then_request():
        swapped.append(scheduler.call_between_batches(swap))
        later.submit()

    swapped: list[Future] = []
    running.on_token(2, queue_swap_then_request).submit()
    assert running.result().weight_version == "v1" and len(running.result().output_ids) == 15
    swapped[0].result(timeout=TIMEOUT_S)
    assert seen_at_swap == [True]
    assert later.result().weight_version == "v2"


def test_a_prefill_that_breaks_fails_alone_and_spares_the_running_batch(scheduler, runner, monkeypatch):
    poison = prompt(runner, "7+7=")
    real_prefill = runner.prefill
    calls: list[int] = []

    def prefill(prompts):
        calls.append(len(prompts))
        if poison in prompts:
            raise RuntimeError("boom")
        return real_prefill(prompts)

    monkeypatch.setattr(runner, "prefill", prefill)
    running = Tracked(scheduler, "running", prompt(runner, "1+1="), params(20, seed=8))
    bad = Tracked(scheduler, "bad", poison, params(5, seed=9))
    good = Tracked(scheduler, "good", prompt(runner, "3+3="), params(5, seed=10))

    def admit_both():  # on the scheduler thread between two steps: the two are admitted as one group
        bad.submit()
        good.submit()

    running.on_token(2, admit_both).submit()
    assert bad.result().finish_reason.type == "abort" and "boom" in bad.result().finish_reason.message
    assert good.result().finish_reason.type == "length" and len(good.result().output_ids) == 5
    assert running.result().finish_reason.type == "length" and len(running.result().output_ids) == 20
    assert calls[1:] == [2, 1, 1]  # the group, then each of its requests alone


def test_a_model_whose_cache_cannot_merge_runs_each_batch_to_its_end(scheduler, runner, monkeypatch):
    """The fallback for sliding-window caches: a request arriving mid-decode waits for the batch to end,
    and still samples what it samples alone."""
    monkeypatch.setattr(runner, "merges_batches", False)
    long_p, short_p = params(12, seed=21), params(4, seed=22)
    short = Tracked(scheduler, "short", prompt(runner, "3+4="), short_p)
    long = Tracked(scheduler, "long", prompt(runner, "12+13="), long_p).on_token(3, short.submit).submit()
    seen: list[int] = []
    short.done.add_done_callback(lambda _: seen.append(len(long.tokens)))
    assert len(long.result().output_ids) == 12 and len(short.result().output_ids) == 4
    assert seen == [12] and scheduler.stats().num_joined_running == 0
    assert short.result().output_ids == alone(scheduler, "s2", short.request.prompt_ids, short_p).output_ids


def test_a_requests_tokens_are_counted_before_its_answer_is_sent(scheduler):
    """A client that scrapes /metrics once its answer arrived finds every token it got counted (the count came
    after the step's finished rows were answered: one token short, seen in a clean-clone run)."""
    counted = Future()

    def sink(event) -> None:
        if isinstance(event, FinishEvent):
            counted.set_result(scheduler.metrics.render().decode())

    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    scheduler.submit(EngineRequest(rid="counted", prompt_ids=[5, 6, 7], params=params, sink=sink))
    lines = [ln for ln in counted.result(TIMEOUT_S).splitlines() if ln.startswith("sglang:generation_tokens_total")]
    assert len(lines) == 1 and float(lines[0].rsplit(" ", 1)[1]) == 4.0, lines


def test_a_thread_descheduled_between_steps_does_not_split_the_decode_span(runner, tmp_path, monkeypatch):
    """Steps of one request with work always waiting are one stretch, even when the wall clock jumps between
    them (the scheduler thread descheduled on a loaded machine): only idling ends a stretch. Before, any gap
    over IDLE_GAP_S split it, and tests/engines/test_timeline.py saw two spans for one batch under load."""
    import time
    from types import SimpleNamespace

    from miles.engines import scheduler as scheduler_module
    from miles.record.timeline import TimelineWriter, read_spans

    calls = [0]

    def jumping_clock() -> float:  # each reading 0.2 s after the last, as if the thread waited for a core
        calls[0] += 1
        return time.time() + 0.2 * calls[0]

    monkeypatch.setattr(scheduler_module, "time", SimpleNamespace(time=jumping_clock, perf_counter=time.perf_counter,
                                                                  monotonic=time.monotonic))
    path = tmp_path / "timeline.jsonl"
    s = Scheduler(runner, EngineMetrics(model_name="test"), max_batch_size=8, max_queued=64,
                  timeline=TimelineWriter(path, lane="engine"))
    s.start()
    try:
        result = alone(s, "r", prompt(runner, "1+2="), params(8, seed=3, temperature=0.0))
    finally:
        s.stop()  # writes the stretch still open
    spans = [sp for sp in read_spans(path) if sp.name == "decode"]
    assert len(spans) == 1, spans
    assert spans[0].args["requests"] == 1 and spans[0].args["tokens"] == len(result.output_ids) == 8
