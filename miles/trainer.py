"""The RL loop one iteration at a time: rollout -> reward -> log -> train -> weight sync -> eval -> record.

`RLTrainer` is what the Prefect tasks drive in chunks (resume, run a range of
iterations, save); `miles.train.train` drives it as one plain loop. It owns the
training actors and the data cursor, and knows the engines only by URL.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import ray
from transformers import AutoTokenizer

from miles import checkpoint
from miles.backends import check_backend
from miles.backends.group import ActorGroup
from miles.backends.pack import combine, split_for_ranks
from miles.backends.sync import WeightSync, served_version
from miles.health import HealthReport, HealthWatch, RedFlagStop, stop_message
from miles.ray_cluster import check_cluster, connect
from miles.rollout.advantages import compute_advantages
from miles.rollout.data import DataSource, read_prompts
from miles.rollout.evaluation import EvalResult, evaluate, load_eval_sets
from miles.rollout.generate import SamplingParams, generate_groups
from miles.rollout.generate_hook import load_generate_function
from miles.rollout.metrics import rollout_metrics
from miles.rollout.rewards import RewardModel
from miles.rollout.sample import Sample
from miles.tracking import open_tracking
from miles.tracking.journal import JOURNAL_NAME, read_journal
from miles.tracking.samples import samples_due
from miles.tracking.timeline import TIMELINE_NAME, TimelineWriter
from miles.tracking.tokens import write_tokens

log = logging.getLogger(__name__)


@dataclass
class IterationResult:
    rollout_id: int
    metrics: dict[str, float]  # every train/ rollout/ passrate/ perf/ (eval/) metric and the step counters
    samples: list[Sample]
    health: HealthReport  # the health watch's verdicts on this rollout


def resolve_paths(config) -> tuple[Path, Path, Path | None]:
    """(model dir, train JSONL, default eval JSONL): the tiny defaults fill what is not given (those of
    the multi-turn calculator task when a custom generate function is set)."""
    from miles.tiny.defaults import tiny_model, tiny_task_data

    r, multi_turn = config.rollout, config.generate.custom_generate_function_path is not None
    model = Path(r.hf_checkpoint) if r.hf_checkpoint else tiny_model(multi_turn)
    train_data, eval_data = (Path(r.prompt_data), None) if r.prompt_data else tiny_task_data(multi_turn)
    return model, train_data, eval_data


def preflight(config) -> None:
    """Everything checkable before services start: backend, Ray cluster, reward hook, prompt and eval files."""
    check_backend(config.train.train_backend)
    check_cluster(config.orchestration.ray_address)
    r = config.rollout
    RewardModel(r.rm_type, r.custom_rm_path, config.as_namespace())
    load_generate_function(config.generate)
    _, train_data, eval_data = resolve_paths(config)
    read_prompts(train_data, r.input_key, r.label_key)
    if r.eval_interval is not None:
        load_eval_sets(r, eval_data)


def router_admin_token(config) -> str | None:
    return config.router.router_admin_token or os.environ.get("MILES_ROUTER_ADMIN_TOKEN") or None


class RLTrainer:
    def __init__(self, config, run_dir: Path, rollout_url: str, engine_urls: list[str],
                 actor_name_prefix: str | None = None):
        check_backend(config.train.train_backend)
        self.config, self.run_dir = config, Path(run_dir)
        self.rollout_url = rollout_url.rstrip("/")
        self.engine_urls = [u.rstrip("/") for u in engine_urls]
        router_url = self.rollout_url if self.rollout_url not in self.engine_urls else None
        self.args = config.as_namespace()
        self.model_path, train_data, eval_data = resolve_paths(config)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))
        r = config.rollout
        self.data = DataSource(read_prompts(train_data, r.input_key, r.label_key), seed=config.train.seed)
        self.eval_sets = load_eval_sets(r, eval_data) if r.eval_interval is not None else []
        self.reward = RewardModel(r.rm_type, r.custom_rm_path, self.args)
        self.generate_fn = load_generate_function(config.generate)
        self.params = SamplingParams(r.rollout_temperature, r.rollout_top_p, r.rollout_top_k,
                                     r.rollout_max_response_len)
        self.save_dir = Path(config.train.save) if config.train.save else self.run_dir / "checkpoints"
        self.load_dir = Path(config.train.load) if config.train.load else self.save_dir
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            o = config.orchestration
            connect(o.ray_address, o.ray_num_cpus, o.ray_object_store_mb)
        self.tracker = open_tracking(config, self.run_dir)
        self.health = HealthWatch(config, self.run_dir)
        self.group = ActorGroup(config, str(self.model_path), actor_name_prefix)
        self.sync = WeightSync(self.group, self.engine_urls, router_url, self.run_dir / "weights",
                               in_memory=config.train.colocate, admin_token=router_admin_token(config))
        self.weight_version = 0
        self.timeline = TimelineWriter(self.run_dir / TIMELINE_NAME)

    # ---- resume / checkpoint --------------------------------------------------------------
    def resume(self) -> int:
        """Load the newest good checkpoint (if any) everywhere; return the next rollout id."""
        scan = checkpoint.latest_good(self.load_dir)
        for bad in scan.rejected:
            print(f"[trainer] skipping checkpoint {bad.path}: {bad.reason}", flush=True)
        if scan.path is None:
            if self.group.attached:  # a retried task's actors may hold trained weights: start over
                self.group.call("load_base", str(self.model_path))
            self.data.load_state_dict({"epoch": 0, "offset": 0})
            self.weight_version = 0
            self.tracker.resume(None, {})
            self.health.resume([])
            self._engines_serve(self.model_path, 0)
            return 0
        state = scan.state
        self.group.call("load", str(scan.path))
        self.data.load_state_dict(state.data_cursor)
        self.weight_version = state.weight_version
        self.tracker.resume(state.rollout_id, state.extra)
        self.health.resume(read_journal(self.run_dir / JOURNAL_NAME))
        self._engines_serve(scan.path, state.weight_version)
        print(f"[trainer] resumed from {scan.path} (rollout {state.rollout_id})", flush=True)
        return state.rollout_id + 1

    def _engines_serve(self, model_dir: Path, version: int) -> None:
        probe = self.tokenizer("0", add_special_tokens=False)["input_ids"]
        stale = [u for u in self.engine_urls if served_version(u, probe) != str(version)]
        if stale:
            from miles.backends.sync import push_disk, tell_router

            push_disk(stale, model_dir, version)
            tell_router(self.sync.router_url, version, self.sync.admin_token)
        self.group.call("set_weight_version", version)

    def save_checkpoint(self, rollout_id: int) -> Path:
        started = time.time()
        staged = checkpoint.staging_dir(self.save_dir, rollout_id)
        self.group.call("save", str(staged))
        state = checkpoint.TrainerState(rollout_id=rollout_id, weight_version=self.weight_version,
                                        data_cursor=self.data.state_dict(), world_size=self.config.world_size,
                                        extra=self.tracker.checkpoint_extra())
        path = checkpoint.seal(staged, self.save_dir, state, self.config.train.keep_checkpoints)
        self.tracker.commit(rollout_id)
        self.timeline.add("checkpoint", started, time.time(), rollout_id)
        return path

    # ---- one iteration ----------------------------------------------------------------------
    def run_iteration(self, rollout_id: int) -> IterationResult:
        cfg = self.config
        start = time.perf_counter()
        with self.timeline.span("rollout", rollout_id):
            samples, advantages = self._rollout(rollout_id)
        rollout_time = time.perf_counter() - start
        # rollout/ and passrate/ go out through the rollout logger (a custom one may replace them)
        rollout_logged = rollout_metrics(samples, advantages, cfg.rollout.n_samples_per_prompt,
                                         binary_reward=cfg.rollout.custom_rm_path is None)
        self.tracker.log_rollout(rollout_id, self.args, samples, dict(rollout_logged), rollout_time)

        t_train = time.perf_counter()
        logged = samples_due(cfg.tracking.log_samples_interval, rollout_id)
        with self.timeline.span("train", rollout_id):
            batches = split_for_ranks(samples, advantages, cfg.global_batch_size, cfg.world_size, rollout_id,
                                      return_token_stats=logged)
            summary = combine(self.group.train(batches))
        train_time = time.perf_counter() - t_train
        self._write_rank_phases(rollout_id, summary)
        if logged:
            with self.timeline.span("log_tokens", rollout_id):
                write_tokens(self.run_dir, rollout_id, samples, self.tokenizer, summary.token_stats)

        t_sync = time.perf_counter()
        with self.timeline.span("update_weights", rollout_id, version=self.weight_version + 1):
            self.weight_version += 1
            self.sync.push(self.weight_version)
        update_time = time.perf_counter() - t_sync
        step_time = time.perf_counter() - start

        metrics = dict(summary.metrics)
        metrics.update(self._router_metrics())
        metrics.update({
            "perf/rollout_time": rollout_time, "perf/train_time": train_time,
            "perf/actor_train_time": summary.actor_train_time, "perf/log_probs_time": summary.log_probs_time,
            "perf/update_weights_time": update_time, "perf/step_time": step_time,
            "perf/wait_time_ratio": rollout_time / step_time,
            "perf/actor_train_tok_per_s": summary.num_tokens / max(summary.actor_train_time, 1e-9),
            "perf/tokens_per_gpu_per_sec": summary.num_tokens / max(train_time, 1e-9) / cfg.world_size,
        })
        if cfg.train.use_kl_loss:
            metrics["perf/ref_log_probs_time"] = summary.ref_log_probs_time
        steps = cfg.train.num_steps_per_rollout
        metrics.update({"train/step": float(rollout_id * steps + steps - 1), "rollout/step": float(rollout_id),
                        "eval/step": float(rollout_id)})
        evaluated = {}
        if self._eval_due(rollout_id):
            t_eval = time.perf_counter()
            with self.timeline.span("eval", rollout_id):
                evaluated = self.evaluate(rollout_id).metrics  # goes out through the eval logger
            metrics["perf/eval_time"] = time.perf_counter() - t_eval
        health = self.health.observe(rollout_id, self.tracker.line_for(rollout_id, metrics))
        metrics.update(health.metrics)  # health/<signal> joins the iteration's own journal line
        self.tracker.record(rollout_id, metrics)
        return IterationResult(rollout_id, {**rollout_logged, **metrics, **evaluated, **health.metrics}, samples,
                               health)

    def stop_on_red_flag(self, result: IterationResult) -> None:
        """With --on-red-flag stop, a red flag checkpoints this rollout and ends the run (RedFlagStop)."""
        if self.config.health.on_red_flag == "stop" and result.health.red:
            path = self.save_checkpoint(result.rollout_id)
            raise RedFlagStop(stop_message(result.health.red, path))

    def _write_rank_phases(self, rollout_id: int, summary) -> None:
        for rank, phases in summary.phases.items():
            for name, begin, end in phases:
                self.timeline.add(name, begin, end, rollout_id, lane=f"rank{rank}")

    def _rollout(self, rollout_id: int) -> tuple[list[Sample], list[float]]:
        r = self.config.rollout
        prompts = self.data.next_batch(r.rollout_batch_size)
        samples = generate_groups(self.rollout_url, prompts, r.n_samples_per_prompt, self.tokenizer, self.params,
                                  seed=self.config.train.seed, stream="train", rollout_id=rollout_id,
                                  concurrency=r.sglang_server_concurrency, apply_chat_template=r.apply_chat_template,
                                  generate_fn=self.generate_fn, args=self.args)
        self.reward.score(samples)
        advantages = compute_advantages(samples, self.config.train.advantage_estimator,
                                        self.config.train.normalize_advantages_std)
        for sample, advantage in zip(samples, advantages):
            sample.metadata["advantage"] = advantage
        return samples, advantages

    def _router_metrics(self) -> dict[str, float]:
        """`rollout/router_*`: the router's requests, errors, retries, latency and worker counts since
        the last iteration (none when rollouts go straight to one engine)."""
        if self.sync.router_url is None:
            return {}
        token = self.sync.admin_token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        stats = httpx.get(f"{self.sync.router_url}/router_stats", headers=headers,
                          timeout=30.0).raise_for_status().json()
        return {f"rollout/{key}": float(value) for key, value in stats.items()
                if isinstance(value, (int, float)) and not isinstance(value, bool)}

    def _eval_due(self, rollout_id: int) -> bool:
        interval = self.config.rollout.eval_interval
        if interval is None or not self.eval_sets:
            return False
        return (rollout_id + 1) % interval == 0 or rollout_id == self.config.rollout.num_rollout - 1

    def evaluate(self, rollout_id: int, log: bool = True) -> EvalResult:
        """Eval metrics of the weights the engines serve now; with `log`, handed to the eval logger hook
        (the base model's eval before training is not an iteration's, so it is not logged there)."""
        result = evaluate(self.rollout_url, self.eval_sets, self.tokenizer, self.reward, self.config.rollout,
                          seed=self.config.train.seed, step=rollout_id, generate_fn=self.generate_fn, args=self.args)
        if log:
            self.tracker.log_eval(rollout_id, self.args, result.data, dict(result.metrics))
        return result

    # ---- shutdown ---------------------------------------------------------------------------
    def close(self, keep_actors: bool = False) -> None:
        """Stop the ranks cleanly and close the trackers (and Ray, when this trainer started it).
        `keep_actors` leaves named ranks running for the next chunk's trainer to attach to."""
        try:
            if self.group.actors and not keep_actors:
                self.group.stop()
        finally:
            self.tracker.close()
            self.timeline.close()
            if self._owns_ray and ray.is_initialized():
                ray.shutdown()
