"""One RL iteration: rollout -> reward -> log -> train -> weight sync -> eval -> record (`RLTrainer`).

The driver loop around it (resume, base eval, iterate, save, close) is `miles.loop`, used by both
`python -m miles.train` and the Prefect training task.
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
from transformers import AutoTokenizer

from miles.run import checkpoint
from miles.run.engine_loss import EnginesLost, NoEngineLeft, silent_engines, supervised_loss, unsupervised_loss, when
from miles.backends.flops import ModelShape, mfu_metrics
from miles.backends.group import ActorGroup
from miles.backends.pack import combine, split_for_ranks
from miles.backends.sync import WeightSync, WeightSyncError, served_version
from miles.cluster.names import RunNames
from miles.config.resolve import require_resolved
from miles.config.secrets import resolve_admin_token
from miles.record.tokens import write_tokens
from miles.health import HealthWatch
from miles.run.phases import timed
from miles.profiling.driver import RunProfiler
from miles.record import layout
from miles.record.journal import JOURNAL_NAME, base_eval_json, read_journal
from miles.record.row import PREFIX, format_eval_result
from miles.record.samples import samples_due
from miles.rollout.advantages import compute_advantages
from miles.rollout.data import DataSource, read_prompts
from miles.rollout.evaluation import evaluate, load_eval_sets
from miles.rollout.generate import GenerateError, RolloutSampling, generate_groups, take_resends, watch_outage
from miles.rollout.generate_hook import load_generate_function
from miles.rollout.metrics import rollout_metrics
from miles.rollout.producer import RolloutProducer, Taken
from miles.rollout.staleness import staleness_metrics
from miles.run.staleness_guard import StalenessGuard
from miles.rollout.rewards import RewardModel
from miles.rollout.sample import Sample
from miles.record.timeline import OPEN_NAME, TIMELINE_NAME, TimelineWriter
from miles.run.observer import IterationResult
from miles.tracking import open_tracking


class RLTrainer:
    """One run's training side: the data cursor, the reward, the tracker, the ranks and the weight sync.

    Build it with `RLTrainer.start`, which starts what a trainer runs beside it. `config` must be
    prepared (`miles.prepare`); the engines are known only by URL, and Ray must be up (the driver
    connects it). With `names`, the ranks are named actors that outlive this trainer (Prefect chunks
    attach to them); without, `close` stops them."""

    @classmethod
    def start(cls, config, rollout_url: str, engine_urls: list[str], names: RunNames | None = None,
              supervisor=None, group: ActorGroup | None = None) -> "RLTrainer":
        """Start the trainer's parts: the tracker (and its delivery process), the health watch, the training
        ranks (a Ray actor group, found when `names` already exist; or `group`, launched earlier by the caller
        and waited for here), the weight sync and the run profiler (its py-spy sampler runs only inside a
        profiling window). With an engine `supervisor` (--use-fault-tolerance) the weight sync pushes only to
        ready engines and lends it the current weights."""
        require_resolved(config, "RLTrainer.start")
        run_dir = Path(config.train.run_dir)
        rollout_url, engine_urls = rollout_url.rstrip("/"), [u.rstrip("/") for u in engine_urls]
        router_url = rollout_url if rollout_url not in engine_urls else None  # rollouts may go straight to one engine
        token = resolve_admin_token(config.router)
        launched = group is None
        if launched:  # the ranks load the model while the tracker and the health watch open
            group = ActorGroup(config, config.rollout.hf_checkpoint, names, wait=False)
        try:
            tracker = open_tracking(config, run_dir)
            health = HealthWatch(config, run_dir)
            group.wait_started()
        except BaseException:
            if launched and names is None:  # named ranks outlive a failed task on purpose: a retry attaches
                group.kill()
            raise
        sync = WeightSync(group, engine_urls, router_url, run_dir / layout.WEIGHTS,
                          in_memory=config.train.colocate, admin_token=token, supervisor=supervisor)
        profiler = RunProfiler(config, run_dir, group.actors, engine_urls, router_url, token)
        # a rollout request stops waiting for an engine once the supervisor gave up on every one
        watch_outage(supervisor.gave_up if supervisor is not None else None)
        return cls(config, rollout_url, engine_urls, tracker=tracker, health=health, group=group, sync=sync,
                   profiler=profiler)

    def __init__(self, config, rollout_url: str, engine_urls: list[str], *, tracker, health, group, sync, profiler):
        """Hold the started parts (see `start`) and read what an iteration needs: tokenizer, data, eval sets,
        reward, generate hook."""
        self.config = config
        self.run_dir = Path(config.train.run_dir)
        self.rollout_url, self.engine_urls = rollout_url, engine_urls
        self.args = config.as_namespace()
        r = config.rollout
        self.model_path = Path(r.hf_checkpoint)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))
        self.data = DataSource(read_prompts(r.prompt_data, r.input_key, r.label_key), seed=config.train.seed)
        self.eval_sets = load_eval_sets(r) if r.eval_interval is not None else []
        self.reward = RewardModel(r.rm_type, r.custom_rm_path, self.args)
        self.generate_fn = load_generate_function(config.generate)
        self.params = RolloutSampling(r.rollout_temperature, r.rollout_top_p, r.rollout_top_k,
                                     r.rollout_max_response_len)
        self.save_dir, self.load_dir = Path(config.train.save), Path(config.train.load)
        self.tracker, self.health, self.group, self.sync, self.profiler = tracker, health, group, sync, profiler
        self.weight_version = 0
        self._phase = "rollout"  # the iteration's phase now (what an engine loss happened in)
        self._flops: tuple | None = None  # (ModelShape or False, each rank's peak FLOP/s): asked once
        self.timeline = TimelineWriter(self.run_dir / TIMELINE_NAME, starts=self.run_dir / OPEN_NAME)
        # async GRPO (--max-weight-staleness, --fully-async): the producer that generates ahead, started at
        # the first iteration; the data cursor of the rollout trained last is what a checkpoint saves
        t = config.train
        self.async_mode = t.fully_async or t.max_weight_staleness > 0
        self.producer: RolloutProducer | None = None
        self._trained_cursor: dict | None = None
        self.guard = StalenessGuard(config.train) if t.staleness_guard else None
        self.max_staleness = t.max_weight_staleness  # the guard's tightened bound, carried across a resume

    # ---- resume / checkpoint --------------------------------------------------------------
    def resume(self) -> int:
        """Load the newest good checkpoint (if any) everywhere; return the next rollout id. Continuing from
        one (the next chunk of `miles train`, or a resume after a crash) is a `resume` span of the timeline,
        at the rollout it continues with, so that views can mark where a new trainer took over."""
        began = time.time()
        self._stop_producer()  # what it generated ahead belongs to weights that are being replaced
        scan = checkpoint.resume_point(self.save_dir, self.load_dir)
        for bad in scan.rejected:
            print(f"[trainer] skipping checkpoint {bad.path}: {bad.reason}", flush=True)
        if scan.path is None:
            if self.group.attached:  # a retried task's actors may hold trained weights: start over
                self.group.call("load_base", str(self.model_path))
            self.data.load_state_dict({"epoch": 0, "offset": 0})
            self.weight_version = 0
            self.max_staleness = self.config.train.max_weight_staleness
            self.tracker.open({})
            self.health.resume([])
            self._engines_serve(self.model_path, 0)
            return 0
        state = scan.state
        self.group.call("load", str(scan.path))
        self.data.load_state_dict(state.data_cursor)
        self.weight_version = state.weight_version
        self.tracker.open(state.extra)
        journal = read_journal(self.run_dir / JOURNAL_NAME)
        # the watch judges the redone rollouts again: its history ends at the checkpoint
        self.health.resume([ln for ln in journal if ln.rollout_id <= state.rollout_id])
        self.max_staleness = resumed_bound(self.config.train, journal, state.rollout_id)
        self._engines_serve(scan.path, state.weight_version)
        print(resume_message(scan.path, state.rollout_id, journal), flush=True)
        self.timeline.add("resume", began, time.time(), state.rollout_id + 1, checkpoint=str(scan.path))
        return state.rollout_id + 1

    def _engines_serve(self, model_dir: Path, version: int) -> None:
        probe = self.tokenizer("0", add_special_tokens=False)["input_ids"]
        stale = [u for u in self.engine_urls if served_version(u, probe) != str(version)]
        if stale:
            from miles.backends.sync import push_disk

            push_disk(stale, model_dir, version, self.sync.admin_token)
            self.sync.announce(version)
        self.group.call("set_weight_version", version)
        self.sync.serving(model_dir, version)  # what a relaunched engine is brought up to until the next push

    def save_checkpoint(self, rollout_id: int) -> Path:
        with self.phase("checkpoint", rollout_id):
            staged = checkpoint.staging_dir(self.save_dir, rollout_id)
            self.group.call("save", str(staged))
            cursor = self._trained_cursor if self.async_mode else None  # the producer drew ahead of it
            state = checkpoint.TrainerState(rollout_id=rollout_id, weight_version=self.weight_version,
                                            data_cursor=cursor or self.data.state_dict(), world_size=self.config.world_size,
                                            extra=self.tracker.checkpoint_extra())
            return checkpoint.seal(staged, self.save_dir, state, self.config.train.keep_checkpoints)

    # ---- one iteration ----------------------------------------------------------------------
    def run_iteration(self, rollout_id: int) -> IterationResult:
        """rollout -> rollout logger -> train (log-probs, optimizer steps) -> weight sync -> eval when due -> record.
        Raises `EnginesLost` when the engines are gone (see `miles.run.engine_loss`); a rollout lost before
        training leaves the data cursor where it was, so a resume redoes it with the same prompts."""
        cursor = self.data.state_dict()
        self._phase = "rollout"
        try:
            return self._iteration(rollout_id)
        except (NoEngineLeft, GenerateError, WeightSyncError, httpx.HTTPError) as exc:
            # a rollout is done once its journal line is written: one lost after training (in the weight push
            # or the eval) is not checkpointed, so checkpoints and journal agree and a resume (the flow's
            # resubmitted chunk) redoes it from the last checkpoint; one lost before training keeps rollout - 1
            trained = self._phase != "rollout"
            lost = self._engines_lost(exc, when(self._phase, rollout_id), None if trained else rollout_id - 1)
            if lost is None:
                raise
            self.data.load_state_dict(cursor)
            raise lost from None

    def _engines_lost(self, exc: Exception, at: str, trained_through: int | None) -> EnginesLost | None:
        """`EnginesLost` when `exc` comes from engines that are gone: the supervisor gave up, or (unsupervised)
        an engine no longer answers /health. None: some other failure, raised as it is."""
        supervisor = self.sync.supervisor
        if isinstance(exc, NoEngineLeft):
            return EnginesLost(supervised_loss(str(exc), at), trained_through)
        if supervisor is not None:
            reason = supervisor.gave_up()
            return None if reason is None else EnginesLost(supervised_loss(reason, at), trained_through)
        dead = silent_engines(self.engine_urls)
        if not dead:
            return None
        return EnginesLost(unsupervised_loss(self.engine_urls, dead, at, exc), trained_through)

    def _iteration(self, rollout_id: int) -> IterationResult:
        cfg = self.config
        times: dict[str, float] = {}
        start = time.perf_counter()
        taken: Taken | None = None
        with self.phase("rollout", rollout_id, times):  # async: the wait for the producer's rollout
            if self.async_mode:
                taken = self._take(rollout_id)
                samples, advantages = taken.ready.result
            else:
                samples, advantages = self._rollout(rollout_id)
        # rollout/ and passrate/ go out through the rollout logger (a custom one may replace them)
        rollout_logged = rollout_metrics(samples, advantages, cfg.rollout.n_samples_per_prompt,
                                         binary_reward=cfg.rollout.custom_rm_path is None)
        self.tracker.log_rollout(rollout_id, self.args, samples, dict(rollout_logged), times["rollout"])

        # a rollout redone after a crash keeps its first run's line, samples and token file
        logged = (samples_due(cfg.tracking.log_samples_interval, rollout_id, cfg.rollout.num_rollout)
                  and not self.tracker.recorded(rollout_id))
        with self.phase("train", rollout_id, times):  # log_probs and actor_train are phases inside the ranks
            batches = split_for_ranks(samples, advantages, cfg.global_batch_size, cfg.world_size, rollout_id,
                                      return_token_stats=logged)
            results = self.group.train(batches)
            summary = combine(results)
        self._write_rank_phases(rollout_id, summary)
        if logged:
            with self.phase("log_tokens", rollout_id):
                write_tokens(self.run_dir, rollout_id, samples, self.tokenizer, summary.token_stats)

        with self.phase("update_weights", rollout_id, times, version=self.weight_version + 1):
            self.weight_version += 1
            self.sync.push(self.weight_version, pause_mode=cfg.train.pause_generation_mode if self.async_mode
                           else None)
            if self.producer is not None:
                self.producer.pushed(self.weight_version)  # requests waiting for this version may start
        step_time = time.perf_counter() - start

        metrics = dict(summary.metrics)
        metrics.update(self._router_metrics())
        metrics.update(self._fault_metrics(metrics))
        metrics.update(perf_metrics(times, step_time, summary, cfg))
        metrics.update(self._mfu_metrics(batches, results))
        metrics.update(self.sync.last_times)  # perf/update_weights_{rank,engine}_<i>_time
        if taken is not None:
            metrics.update(self._async_metrics(taken, samples, step_time))
        steps = cfg.train.num_steps_per_rollout
        metrics.update({"train/step": float(rollout_id * steps + steps - 1), "rollout/step": float(rollout_id)})
        evaluated = {}
        if self._eval_due(rollout_id):
            with self.phase("eval", rollout_id, times):
                evaluated = self.evaluate(rollout_id)  # goes out through the eval logger, with eval/step
            metrics["perf/eval_time"] = times["eval"]
        if self.guard is not None and self.producer is not None:
            metrics.update(self.guard.observe(rollout_id, metrics, self.producer))
            self.max_staleness = self.producer.max_staleness
        health = self.health.observe(rollout_id, self.tracker.line_for(rollout_id, metrics))
        metrics.update(health.metrics)  # health/<signal> joins the iteration's own journal line
        self.tracker.record(rollout_id, metrics)
        return IterationResult(rollout_id, {**rollout_logged, **metrics, **evaluated, **health.metrics}, samples,
                               health)

    @contextmanager
    def phase(self, name: str, rollout_id: int, times: dict[str, float] | None = None, **span) -> Iterator[None]:
        """One named phase of an iteration: timed through `miles.run.phases` (where profiling hooks in) and
        written as a span of the run's timeline."""
        self._phase = name
        with timed(name, times), self.timeline.span(name, rollout_id, **span):
            yield

    def _mfu_metrics(self, batches, results) -> dict[str, float]:
        """Each rank's TFLOP/s and MFU in actor_train: FLOPs counted from the model's config, peaks asked
        of the ranks once (a GPU from the table, a CPU measured on the rank)."""
        if self._flops is None:
            try:
                shape = ModelShape.from_checkpoint(self.model_path)
            except (OSError, ValueError) as exc:
                print(f"{PREFIX}no perf/mfu: {exc}", flush=True)
                shape = False
            peaks = [float(info.extra.get("peak_flops") or 0.0) for info in self.group.call("info")]
            self._flops = (shape, peaks)
        shape, peaks = self._flops
        if not shape:
            return {}
        return mfu_metrics(shape, [[len(t) for t in b.tokens] for b in batches],
                           [r.actor_train_time for r in results], peaks)

    def _write_rank_phases(self, rollout_id: int, summary) -> None:
        for rank, phases in summary.phases.items():
            for name, begin, end in phases:
                self.timeline.add(name, begin, end, rollout_id, lane=f"rank{rank}")

    def _rollout(self, rollout_id: int) -> tuple[list[Sample], list[float]]:
        prompts = self.data.next_batch(self.config.rollout.rollout_batch_size)
        return self._generate_rollout(rollout_id, prompts, self.tokenizer)

    # ---- async GRPO: the producer --------------------------------------------------------------
    def _take(self, rollout_id: int) -> Taken:
        """Rollout `rollout_id` from the producer (started here at the first iteration, or after a resume)."""
        if self.producer is None:
            t = self.config.train
            tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))  # its own: a fast tokenizer is not
            # safe to share between threads
            self.producer = RolloutProducer(
                draw=lambda j: (self.data.next_batch(self.config.rollout.rollout_batch_size), self.data.state_dict()),
                generate=lambda j, prompts, admit: self._generate_rollout(j, prompts, tokenizer, admit),
                first=rollout_id, version=self.weight_version, max_staleness=self.max_staleness,
                overlap=t.fully_async)
        taken = self.producer.take(rollout_id)
        self._trained_cursor = taken.ready.cursor
        return taken

    def _async_metrics(self, taken: Taken, samples: list[Sample], step_time: float) -> dict[str, float]:
        """Staleness (in weight versions, at the version this rollout trained on), the buffer, and how much
        of the generation the trainer did not wait for."""
        wait = taken.wait_time
        out = staleness_metrics(samples, self.weight_version - 1)
        out.update({"rollout/buffer_size": float(taken.buffer_size),
                    "rollout/max_weight_staleness": float(self.producer.max_staleness),
                    "perf/wait_time": wait, "perf/rollout_generate_time": taken.ready.generate_time,
                    "perf/overlap_time": max(taken.ready.generate_time - wait, 0.0),
                    "perf/trainer_idle_ratio": wait / step_time if step_time > 0 else 0.0})
        return out

    def _stop_producer(self) -> None:
        if self.producer is not None:
            self.producer.close()
            self.producer = None

    def _generate_rollout(self, rollout_id: int, prompts, tokenizer, admit=None) -> tuple[list[Sample], list[float]]:
        r = self.config.rollout
        samples = generate_groups(self.rollout_url, prompts, r.n_samples_per_prompt, tokenizer, self.params,
                                  seed=self.config.train.seed, stream="train", rollout_id=rollout_id,
                                  concurrency=r.sglang_server_concurrency, apply_chat_template=r.apply_chat_template,
                                  generate_fn=self.generate_fn, args=self.args, admit=admit)
        self.reward.score(samples)
        advantages = compute_advantages(samples, self.config.train.advantage_estimator,
                                        self.config.train.normalize_advantages_std)
        for sample, advantage in zip(samples, advantages):
            sample.metadata["advantage"] = advantage
        return samples, advantages

    def _router_metrics(self) -> dict[str, float]:
        """`rollout/router_*`: the router's requests, errors, retries, latency and worker counts since
        the last iteration, or since the eval after it (none when rollouts go straight to one engine)."""
        return {f"rollout/{key}": value for key, value in self._take_router_stats().items()}

    def _take_router_stats(self) -> dict[str, float]:
        """The router's counters since they were last taken, which starts a new window (reading
        /router_stats resets them); {} without a router."""
        if self.sync.router is None:
            return {}
        # supervised, a router being relaunched is waited for (within --engine-wait-timeout)
        patience = self.config.orchestration.engine_wait_timeout if self.sync.supervisor is not None else 0.0
        return self.sync.router.take_stats(patience, give_up=self._router_given_up)

    def _router_given_up(self) -> None:
        """NoEngineLeft when the supervisor gave up on the router: no use waiting for it."""
        if self.sync.supervisor is not None and (reason := self.sync.supervisor.gave_up()) is not None:
            raise NoEngineLeft(reason) from None

    def _fault_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """`rollout/engine_restarts` and the engines' states (with --use-fault-tolerance), and
        `rollout/requests_resent`: requests sent again because an engine never answered them (the router's
        failovers plus the rollout client's own re-sends while no engine was ready)."""
        resent = take_resends() + metrics.get("rollout/router_retries", 0.0)
        supervisor = self.sync.supervisor
        if supervisor is None:
            return {}
        counters, states = supervisor.take(), supervisor.states()
        out = {"rollout/requests_resent": float(resent), "rollout/engine_restarts": float(counters.restarts),
               "rollout/engine_deaths": float(counters.deaths), "rollout/router_restarts": float(counters.router_restarts)}
        out.update({f"rollout/engines_{state}": float(n) for state, n in states.items()})
        if counters.seconds_to_readmit:
            out["perf/engine_readmit_time"] = max(counters.seconds_to_readmit)
        return out

    def _eval_due(self, rollout_id: int) -> bool:
        interval = self.config.rollout.eval_interval
        if interval is None or not self.eval_sets:
            return False
        return (rollout_id + 1) % interval == 0 or rollout_id == self.config.rollout.num_rollout - 1

    def evaluate(self, rollout_id: int) -> dict[str, float]:
        """Eval metrics (with `eval/step` = `rollout_id`) of the weights the engines serve now, handed to
        the eval logger hook and recorded with the iteration."""
        print(f"{PREFIX}eval after rollout {rollout_id}: {self._eval_what()} ...", flush=True)
        result = evaluate(self.rollout_url, self.eval_sets, self.tokenizer, self.reward, self.config.rollout,
                          seed=self.config.train.seed, step=rollout_id, generate_fn=self.generate_fn, args=self.args)
        self._take_router_stats()  # the eval's requests: not the next rollout's (its window starts now)
        self.tracker.log_eval(rollout_id, self.args, result.data, dict(result.metrics))
        print(format_eval_result(f"eval after rollout {rollout_id}:", result.metrics, self._base_eval()), flush=True)
        return result.metrics

    def _eval_what(self) -> str:
        """`arithmetic (64 prompts x 4 samples)`: what an eval generates, so its pause is explained."""
        k = self.config.rollout.n_samples_per_eval_prompt
        return ", ".join(f"{s.name} ({len(s.prompts)} prompts x {k} samples)" for s in self.eval_sets)

    def _base_eval(self) -> dict[str, float]:
        try:
            return json.loads((self.run_dir / layout.BASE_EVAL).read_text())
        except (OSError, ValueError):
            return {}

    def evaluate_base(self) -> dict[str, float]:
        """The starting weights' eval, before any training: Miles logs it at `eval/step` 0, as its own
        journal line; also written to RUN_DIR/base_eval.json for the final comparison."""
        print(f"{PREFIX}base eval: the starting weights on {self._eval_what()} ...", flush=True)
        try:
            with self.phase("eval", 0):
                result = evaluate(self.rollout_url, self.eval_sets, self.tokenizer, self.reward, self.config.rollout,
                                  seed=self.config.train.seed, step=0, generate_fn=self.generate_fn, args=self.args)
        except (NoEngineLeft, GenerateError, httpx.HTTPError) as exc:
            lost = self._engines_lost(exc, when("eval", None), None)  # nothing trained yet
            if lost is None:
                raise
            raise lost from None
        self._take_router_stats()  # rollout 0's router window holds its own requests, not the base eval's
        self.tracker.log_base_eval(self.args, result.data, dict(result.metrics))
        (self.run_dir / layout.BASE_EVAL).write_text(base_eval_json(result.metrics))
        return result.metrics

    # ---- shutdown ---------------------------------------------------------------------------
    def close(self, final: bool = True) -> None:
        """Stop the ranks cleanly unless they are named (the next chunk's trainer attaches to those, the
        flow's finish stops them), then close the trackers; `final=False`: the run goes on elsewhere."""
        watch_outage(None)  # this trainer's supervisor no longer speaks for the rollout client
        try:
            self._stop_producer()
            self.profiler.close()  # the loop's end already did, unless the trainer ran outside the loop
            if self.group.actors and self.group.names is None:
                self.group.stop()
        finally:
            try:
                self.tracker.close(final=final)
            finally:
                self.timeline.close()


def perf_metrics(times: dict[str, float], step_time: float, summary, config) -> dict[str, float]:
    """Miles' `perf/*` keys from the phase times of one iteration."""
    train_time = times["train"]
    metrics = {
        "perf/rollout_time": times["rollout"], "perf/train_time": train_time,
        "perf/actor_train_time": summary.actor_train_time, "perf/log_probs_time": summary.log_probs_time,
        "perf/update_weights_time": times["update_weights"], "perf/step_time": step_time,
        "perf/wait_time_ratio": times["rollout"] / step_time,
        "perf/actor_train_tok_per_s": summary.num_tokens / max(summary.actor_train_time, 1e-9),
        "perf/tokens_per_gpu_per_sec": summary.num_tokens / max(train_time, 1e-9) / config.world_size,
    }
    if config.train.use_kl_loss:
        metrics["perf/ref_log_probs_time"] = summary.ref_log_probs_time
    return metrics


def resumed_bound(train_config, journal, rollout_id: int) -> int:
    """--max-weight-staleness as the run left it at its checkpoint: the guard only tightens, so the least
    bound its journal recorded up to `rollout_id` (the flag's own value without the guard)."""
    bound = train_config.max_weight_staleness
    if not train_config.staleness_guard:
        return bound
    recorded = [ln.metrics.get("rollout/max_weight_staleness") for ln in journal if ln.rollout_id <= rollout_id]
    return int(min([bound, *[v for v in recorded if isinstance(v, (int, float))]]))


def resume_message(path: Path, rollout_id: int, journal) -> str:
    """A chunk that starts where the last one checkpointed continues the run; only a run whose journal went
    past its checkpoint (a crash, a killed worker, a retry) resumes, and redoes those rollouts."""
    lost = sorted({ln.rollout_id for ln in journal if ln.rollout_id > rollout_id})
    if not lost:
        return f"[trainer] continuing from {path} (rollout {rollout_id})"
    return (f"[trainer] resumed from {path} (rollout {rollout_id}) after an interruption: "
            f"redoing rollout{'s' * (len(lost) > 1)} {lost[0]}" + (f"..{lost[-1]}" if len(lost) > 1 else ""))
