"""One RL iteration: rollout -> reward -> log -> train -> weight sync -> eval -> record (`RLTrainer`).

The driver loop around it (resume, base eval, iterate, save, close) is `miles.loop`, used by both
`python -m miles.train` and the Prefect training task. Where the rollout comes from (made when
asked, or generated ahead by async GRPO) is the rollout source's business
(`miles.run.rollout_source`): the iteration reads the same with either.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Iterator

import httpx
from transformers import AutoTokenizer

from miles.run import checkpoint
from miles.run.engine_loss import NoEngineLeft, engines_lost, when
from miles.backends.flops import IterationFlops
from miles.backends.rank_memory import rank_memory_metrics
from miles.moe.routing_stats import rank_routing_metrics
from miles.backends.group import ActorGroup
from miles.backends.pack import combine, split_for_replicas
from miles.backends.sync import WeightSync, WeightSyncError, push_disk, served_version
from miles.cluster.names import RunNames
from miles.config.parallel import rank_layout
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
from miles.rollout.data import DataSource, read_prompts
from miles.rollout.evaluation import EvalResult, evaluate, load_eval_sets
from miles.rollout.generate import GenerateError, watch_outage
from miles.rollout.generate_hook import load_generate_function
from miles.rollout.metrics import rollout_metrics
from miles.rollout.rewards import RewardModel
from miles.rollout.rollout_maker import RolloutMaker
from miles.record.timeline import OPEN_NAME, TIMELINE_NAME, TimelineWriter
from miles.run.evals import eval_due, eval_what, saved_base_eval
from miles.run.iteration_metrics import iteration_metrics, take_router_stats
from miles.run.observer import IterationResult
from miles.run.rollout_source import Rollout, rollout_source
from miles.run.rank_lanes import rank_straggler_metrics, write_rank_lanes
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
        reward, generate hook, and where rollouts come from."""
        self.config, self.rollout_url, self.engine_urls = config, rollout_url, engine_urls
        self.args = config.as_namespace()  # the one `args` every custom hook gets, as in Miles
        r, run_dir = config.rollout, Path(config.train.run_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(r.hf_checkpoint)
        self.data = DataSource(read_prompts(r.prompt_data, r.input_key, r.label_key), seed=config.train.seed)
        self.eval_sets = load_eval_sets(r) if r.eval_interval is not None else []
        self.reward = RewardModel(r.rm_type, r.custom_rm_path, self.args)
        self.generate_fn = load_generate_function(config.generate)
        self.tracker, self.health, self.group, self.sync, self.profiler = tracker, health, group, sync, profiler
        self.weight_version = 0
        self._phase = "rollout"  # the iteration's phase now (what an engine loss happened in)
        self.flops = IterationFlops(Path(config.rollout.hf_checkpoint), group)  # MFU: asked once
        self.timeline = TimelineWriter(run_dir / TIMELINE_NAME, starts=run_dir / OPEN_NAME)
        make = RolloutMaker(config, rollout_url, self.generate_fn, self.reward, self.args)
        new_tokenizer = partial(AutoTokenizer.from_pretrained, r.hf_checkpoint)  # for a producer
        self.rollouts = rollout_source(config.train, self.data, r.rollout_batch_size, make,
                                       self.tokenizer, new_tokenizer)

    # ---- resume / checkpoint --------------------------------------------------------------
    def resume(self) -> int:
        """Load the newest good checkpoint (if any) everywhere; return the next rollout id. Continuing from
        one (the next chunk of `miles train`, or a resume after a crash) is a `resume` span of the timeline,
        at the rollout it continues with, so that views can mark where a new trainer took over."""
        began, t = time.time(), self.config.train
        self.rollouts.stop()  # what it generated ahead belongs to weights that are being replaced
        scan = checkpoint.resume_point(Path(t.save), Path(t.load))
        for bad in scan.rejected:
            print(f"[trainer] skipping checkpoint {bad.path}: {bad.reason}", flush=True)
        if scan.path is None:
            base = Path(self.config.rollout.hf_checkpoint)
            if self.group.attached:  # a retried task's actors may hold trained weights: start over
                self.group.call("load_base", str(base))
            self.data.load_state_dict({"epoch": 0, "offset": 0})
            self.weight_version = 0
            self.rollouts.restart(0, [], -1)
            self.tracker.open({})
            self.health.resume([])
            self._engines_serve(base, 0)
            return 0
        state = scan.state
        resharded = checkpoint.layout_change(state, rank_layout(t))
        if resharded:  # weights and optimizer state are saved in HF names: any layout reads them
            print(f"[trainer] resharding: {resharded}", flush=True)
        self.group.call("load", str(scan.path))
        self.data.load_state_dict(state.data_cursor)
        self.weight_version = state.weight_version
        self.tracker.open(state.extra)
        journal = read_journal(Path(t.run_dir) / JOURNAL_NAME)
        # the watch judges the redone rollouts again: its history ends at the checkpoint
        self.health.resume([ln for ln in journal if ln.rollout_id <= state.rollout_id])
        self.rollouts.restart(state.weight_version, journal, state.rollout_id)
        self._engines_serve(scan.path, state.weight_version)
        print(checkpoint.resume_message(scan.path, state.rollout_id, journal), flush=True)
        self.timeline.add("resume", began, time.time(), state.rollout_id + 1, checkpoint=str(scan.path))
        return state.rollout_id + 1

    def _engines_serve(self, model_dir: Path, version: int) -> None:
        probe = self.tokenizer("0", add_special_tokens=False)["input_ids"]
        stale = [u for u in self.engine_urls if served_version(u, probe) != str(version)]
        if stale:
            push_disk(stale, model_dir, version, self.sync.admin_token)
            self.sync.announce(version)
        self.group.call("set_weight_version", version)
        self.sync.serving(model_dir, version)  # what a relaunched engine is brought up to until the next push

    def save_checkpoint(self, rollout_id: int) -> Path:
        t = self.config.train
        with self.phase("checkpoint", rollout_id), checkpoint.staging(Path(t.save), rollout_id) as staged:
            self.group.call("save", str(staged))
            state = checkpoint.TrainerState(rollout_id=rollout_id, weight_version=self.weight_version,
                                            data_cursor=self.rollouts.cursor(),
                                            world_size=self.config.world_size,
                                            parallel=vars(rank_layout(t)),
                                            extra=self.tracker.checkpoint_extra())
            return checkpoint.seal(staged, Path(t.save), state, t.keep_checkpoints)

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
            lost = engines_lost(exc, when(self._phase, rollout_id),
                                None if trained else rollout_id - 1, self.sync.supervisor,
                                self.engine_urls)
            if lost is None:
                raise
            self.data.load_state_dict(cursor)
            raise lost from None

    def _iteration(self, rollout_id: int) -> IterationResult:
        times: dict[str, float] = {}
        start = time.perf_counter()
        with self.phase("rollout", rollout_id, times):  # 1-3. prompts, samples, rewards, advantages
            rollout = self.rollouts.take(rollout_id)  # (async: the wait for the producer's rollout)
        rollout_logged = self._log_rollout(rollout_id, rollout, times["rollout"])  # 4. log it
        summary, batches, results = self._train(rollout_id, rollout, times)  # 5. train
        self._push_weights(rollout_id, times)  # 6. weight sync, version bumped
        step_time = time.perf_counter() - start
        metrics = iteration_metrics(self.config, rollout_id, summary, times, step_time,  # 7. log
                                    router=self._router_stats(), supervisor=self.sync.supervisor,
                                    more=[self.flops.metrics(batches, results), self.sync.last_times,
                                          rollout.metrics(step_time), rank_straggler_metrics(results),
                                          rank_memory_metrics(results),
                                          rank_routing_metrics(results)])
        evaluated = {}
        if eval_due(self.config.rollout, self.eval_sets, rollout_id):
            with self.phase("eval", rollout_id, times):
                evaluated = self.evaluate(rollout_id)  # goes out through the eval logger, with eval/step
            metrics["perf/eval_time"] = times["eval"]
        metrics.update(self.rollouts.observe(rollout_id, metrics))
        health = self.health.observe(rollout_id, self.tracker.line_for(rollout_id, metrics))
        metrics.update(health.metrics)  # health/<signal> joins the iteration's own journal line
        self.tracker.record(rollout_id, metrics)
        everything = {**rollout_logged, **metrics, **evaluated, **health.metrics}
        return IterationResult(rollout_id, everything, rollout.samples, health)

    @contextmanager
    def phase(self, name: str, rollout_id: int, times: dict[str, float] | None = None, **span) -> Iterator[None]:
        """One named phase of an iteration: timed through `miles.run.phases` (where profiling hooks in) and
        written as a span of the run's timeline."""
        self._phase = name
        with timed(name, times), self.timeline.span(name, rollout_id, **span):
            yield

    def _log_rollout(self, rollout_id: int, rollout: Rollout, rollout_time: float) -> dict:
        """rollout/ and passrate/ go out by the rollout logger (a custom one may replace them)."""
        r = self.config.rollout
        logged = rollout_metrics(rollout.samples, rollout.advantages, r.n_samples_per_prompt,
                                 binary_reward=r.custom_rm_path is None)
        self.tracker.log_rollout(rollout_id, self.args, rollout.samples, dict(logged), rollout_time)
        return logged

    def _train(self, rollout_id: int, rollout: Rollout, times: dict[str, float]):
        """Log-probs and the optimizer steps on the ranks (their phases on their timeline lanes); a
        rollout due for the samples table gets its token file (a redone one keeps its first's)."""
        cfg = self.config
        due = samples_due(cfg.tracking.log_samples_interval, rollout_id, cfg.rollout.num_rollout)
        logged = due and not self.tracker.recorded(rollout_id)
        with self.phase("train", rollout_id, times):  # log_probs, actor_train: phases in the ranks
            layout = rank_layout(cfg.train)  # the TP x PP ranks of one replica train the same samples
            batches = split_for_replicas(rollout.samples, rollout.advantages, cfg.global_batch_size,
                                         layout.tp, layout.pp, layout.dp, rollout_id,
                                         return_token_stats=logged)
            results = self.group.train(batches)
            summary = combine(results)
        write_rank_lanes(self.timeline, rollout_id, summary, results)
        if logged:
            with self.phase("log_tokens", rollout_id):
                write_tokens(Path(cfg.train.run_dir), rollout_id, rollout.samples, self.tokenizer,
                             summary.token_stats)
        return summary, batches, results

    def _push_weights(self, rollout_id: int, times: dict[str, float]) -> None:
        """The next weight version to every engine (async: paused as the rollout source says; the
        producer's requests waiting for this version may start once it returns)."""
        version = self.weight_version + 1
        with self.phase("update_weights", rollout_id, times, version=version):
            self.weight_version = version
            self.sync.push(version, pause_mode=self.rollouts.pause_mode)
            self.rollouts.pushed(version)

    def _router_stats(self) -> dict[str, float]:
        """The router's counters since the last iteration or the eval after it (a new window)."""
        return take_router_stats(self.sync.router, self.sync.supervisor,
                                 self.config.orchestration.engine_wait_timeout)

    # ---- evals ------------------------------------------------------------------------------
    def evaluate(self, rollout_id: int) -> dict[str, float]:
        """Eval metrics (with `eval/step` = `rollout_id`) of the weights the engines serve now, handed to
        the eval logger hook and recorded with the iteration."""
        print(f"{PREFIX}eval after rollout {rollout_id}: {self._eval_what()} ...", flush=True)
        result = self._eval(rollout_id)
        self._router_stats()  # the eval's requests: not the next rollout's (its window starts now)
        self.tracker.log_eval(rollout_id, self.args, result.data, dict(result.metrics))
        base = saved_base_eval(Path(self.config.train.run_dir))
        print(format_eval_result(f"eval after rollout {rollout_id}:", result.metrics, base),
              flush=True)
        return result.metrics

    def evaluate_base(self) -> dict[str, float]:
        """The starting weights' eval, before any training: Miles logs it at `eval/step` 0, as its own
        journal line; also written to RUN_DIR/base_eval.json for the final comparison."""
        print(f"{PREFIX}base eval: the starting weights on {self._eval_what()} ...", flush=True)
        try:
            with self.phase("eval", 0):
                result = self._eval(0)
        except (NoEngineLeft, GenerateError, httpx.HTTPError) as exc:
            lost = engines_lost(exc, when("eval", None), None,  # nothing trained yet
                                self.sync.supervisor, self.engine_urls)
            if lost is None:
                raise
            raise lost from None
        self._router_stats()  # rollout 0's router window holds its own requests, not the eval's
        self.tracker.log_base_eval(self.args, result.data, dict(result.metrics))
        base = Path(self.config.train.run_dir) / layout.BASE_EVAL
        base.write_text(base_eval_json(result.metrics))
        return result.metrics

    def _eval(self, step: int) -> EvalResult:
        return evaluate(self.rollout_url, self.eval_sets, self.tokenizer, self.reward,
                        self.config.rollout, seed=self.config.train.seed, step=step,
                        generate_fn=self.generate_fn, args=self.args)

    def _eval_what(self) -> str:
        return eval_what(self.eval_sets, self.config.rollout.n_samples_per_eval_prompt)

    # ---- shutdown ---------------------------------------------------------------------------
    def close(self, final: bool = True) -> None:
        """Stop the ranks cleanly unless they are named (the next chunk's trainer attaches to those, the
        flow's finish stops them), then close the trackers; `final=False`: the run goes on elsewhere."""
        watch_outage(None)  # this trainer's supervisor no longer speaks for the rollout client
        try:
            self.rollouts.stop()
            self.profiler.close()  # the loop's end already did, unless the trainer ran outside the loop
            if self.group.actors and self.group.names is None:
                self.group.stop()
        finally:
            try:
                self.tracker.close(final=final)
            finally:
                self.timeline.close()

