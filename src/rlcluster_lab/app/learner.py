"""A small GRPO learner built only on cluster operations.

Each step: sample a group of completions per prompt, score them, normalise rewards within each
group, take the anchor's and the reference's log-probs, update the actor, and sync. The toy
task rewards lowercase ASCII letters, which a tiny random model learns in a few dozen steps.
With ``LearnerConfig(critic=True)`` a step is PPO-style: the critic's baseline gives the
advantage (``critic_advantages``) and the critic is trained after the actor. Before every
optimizer step a ``P11Record`` says how far the live actor's log-probs are from the anchor's,
and the anchor's from the sampler's: the numbers behind rule P11.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlcluster_lab.cluster.operations import check_accumulation
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.options import as_bool, as_int
from rlcluster_lab.core.roles import Role
from rlcluster_lab.core.waits import waiting
from rlcluster_lab.measure.sync import SyncReport
from rlcluster_lab.model.fits import check_only
from rlcluster_lab.rl_cluster import RLCluster
from rlcluster_lab.training.batch import TrainBatch, validate_prompts
from rlcluster_lab.training.critic import ValueBatch
from rlcluster_lab.training.step import rejection_reason

RewardFn = Callable[[Sequence[str], Sequence[str]], np.ndarray]

TOY_PROMPTS: tuple[str, ...] = ("abc", "the cat", "hello", "xyz", "rl is", "jax ", "mesh", "sync")


@dataclasses.dataclass(frozen=True)
class RewardWords:
    """What a learner's reward function rewards and what a rising mean reward means, in words:
    what every view of a reward curve says beside it (the CLI's ``learn``)."""

    rewarded: str
    rising: str

    @classmethod
    def of(cls, reward_fn: Any) -> RewardWords:
        """The words ``reward_fn`` declared (``@rewards``), or what can be said from its name and docstring."""
        declared = getattr(reward_fn, "reward_words", None)
        if isinstance(declared, RewardWords):
            return declared
        name = getattr(reward_fn, "__name__", type(reward_fn).__name__)
        doc = (getattr(reward_fn, "__doc__", None) or "").strip().splitlines()
        said = f": {doc[0].rstrip('.')}" if doc and doc[0] and not isinstance(reward_fn, type) else ""
        rewarded = f"what {name} returns for each completion{said}"
        return cls(rewarded, f"the completions score higher under {name}, on average")


# ``use_reward_model=True``: the cluster's reward model scores (a ``Scenario(with_reward=True)`` one
# has drawn weights and stands for no task).
REWARD_MODEL_WORDS = RewardWords(
    "the score the cluster's reward model gives each completion",
    "the actor's completions score higher under the cluster's reward model",
)


def rewards(rewarded: str, rising: str) -> Callable[[RewardFn], RewardFn]:
    """Declare what a reward function rewards and what a rising mean reward means (``RewardWords``)."""

    def declare(fn: RewardFn) -> RewardFn:
        fn.reward_words = RewardWords(rewarded, rising)  # type: ignore[attr-defined]
        return fn

    return declare


@rewards(
    "the share of each completion's characters that are lowercase ASCII letters a-z, from 0 to 1 "
    "(an empty completion scores 0)",
    "the actor samples more lowercase letters: it is learning the toy task",
)
def lowercase_reward(prompts: Sequence[str], completions: Sequence[str]) -> np.ndarray:
    """Fraction of the completion's characters that are lowercase ASCII letters (0 if empty)."""
    return np.asarray(
        [sum("a" <= ch <= "z" for ch in text) / len(text) if text else 0.0 for text in completions], dtype=np.float32
    )


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """Knobs of the loop. ``batch_size`` counts completions (prompts x group). ``critic``: PPO-style
    advantages from the cluster's critic, trained every step, instead of GRPO's group normalisation."""

    steps: int = 30
    prompts_per_step: int = 4
    group_size: int = 4
    seed: int = 0
    critic: bool = False

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "group_size", "seed"):
            object.__setattr__(self, name, as_int(getattr(self, name), name, knobs=(name,)))
        object.__setattr__(self, "critic", as_bool(self.critic, "critic", knobs=("with_critic",)))
        if self.steps < 0:
            raise ConfigError(f"steps (--steps) must be >= 0, got {self.steps}", knobs=("steps",))
        if self.prompts_per_step < 1 or self.group_size < 2:
            raise ConfigError(
                "prompts_per_step (--prompts-per-step) must be >= 1 and group_size (--group-size) >= 2 "
                "(GRPO compares within a group)",
                knobs=("group_size",) if self.group_size < 2 else ("prompts_per_step",),
            )

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.group_size


def check_learner_batch(config: LearnerConfig, training: Any) -> None:
    """Refuse, before any step, a learner every step of which the cluster would refuse: with
    micro-batches (``TrainingConfig.train_micro_batch_size``) a step's batch, ``prompts_per_step``
    x ``group_size`` completions, must be a whole number of mini-batches
    (``cluster.operations.check_accumulation``, the rule itself).

    Raises:
        ConfigError: naming the learner's sizes and the knobs that fix them.
    """
    try:
        check_accumulation(config.batch_size, training)
    except ConfigError:
        prompts = f"{config.prompts_per_step} prompt{'s' if config.prompts_per_step != 1 else ''}"
        problem = (
            f"a learner step trains on {config.batch_size} completions ({prompts} x {config.group_size} per "
            f"group), not a multiple of mini_batch_size (--mini-batch-size) = {training.mini_batch_size}; with "
            f"train_micro_batch_size (--micro-batch-size) = {training.train_micro_batch_size} every mini-batch "
            "must be whole"
        )
        raise ConfigError(
            f"{problem}: choose prompts_per_step x group_size a multiple of mini_batch_size",
            knobs=("prompts_per_step", "group_size", "mini_batch_size"),
            problem=problem + ".",
        ) from None


@dataclasses.dataclass(frozen=True)
class P11Record:
    """One optimizer step's view of P11."""

    step: int
    iteration: int
    rows: tuple[int, int]
    steps_taken_before: int  # optimizer steps already taken this global step
    live_vs_anchor: float  # max |live - anchor| log-prob on these rows
    anchor_vs_sampler: float  # max |anchor - sampler| log-prob on these rows


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One GRPO step: its figures, and the report of the weight sync that ended it (P13).
    ``rejected_steps``: optimizer steps whose update was not finite (``rejected`` says why)."""

    step: int
    mean_reward: float
    loss: float
    kl: float
    optimizer_steps: int
    sync: SyncReport | None = dataclasses.field(default=None, repr=False, compare=False)
    rejected_steps: int = 0
    rejected: str | None = None
    value_loss: float | None = None  # the critic's mean clipped value loss (PPO-style steps only)

    def to_json(self) -> dict[str, Any]:
        """The step's figures (the sync report has its own ``to_json``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "sync"}


@dataclasses.dataclass(frozen=True)
class LearnerResult:
    steps: list[StepRecord]
    p11: list[P11Record]

    @property
    def rewards(self) -> list[float]:
        return [s.mean_reward for s in self.steps]

    def to_json(self) -> dict[str, Any]:
        return {"steps": [s.to_json() for s in self.steps], "p11": [dataclasses.asdict(p) for p in self.p11]}


class GRPOLearner:
    """Runs GRPO steps against one cluster."""

    def __init__(
        self,
        cluster: RLCluster,
        config: LearnerConfig = LearnerConfig(),
        reward_fn: RewardFn | None = None,
        prompts: Sequence[str] = TOY_PROMPTS,
        use_reward_model: bool = False,
    ) -> None:
        """Rewards come from ``reward_fn`` (default: the toy task), or the cluster's reward model.

        Raises:
            TypeError: ``prompts`` is a bare string (pass ``["hello"]``) or holds a non-string.
            ValueError: no prompts, or conflicting reward sources.
        """
        if not isinstance(cluster, RLCluster):
            raise TypeError(f"cluster must be an RLCluster (build_cluster(...)), got {type(cluster).__name__}")
        if not isinstance(config, LearnerConfig):
            raise TypeError(f"config must be a LearnerConfig, got {type(config).__name__} {config!r:.40}")
        prompts = validate_prompts(prompts)
        if use_reward_model and reward_fn is not None:
            raise ValueError("give either reward_fn or use_reward_model=True, not both")
        if use_reward_model and cluster.reward_model is None:
            raise ValueError("use_reward_model=True needs a cluster built with reward=...")
        if config.critic and cluster.critic_model is None:
            raise ValueError(
                "LearnerConfig(critic=True) needs a cluster built with critic=... (Scenario(with_critic=True))"
            )
        check_learner_batch(config, cluster.cluster_config.training_config)
        self.cluster, self.config, self.use_reward_model = cluster, config, use_reward_model
        self.reward_fn = reward_fn or lowercase_reward
        # What the reward curve measures, read from the reward function (or model) itself.
        self.reward_words = REWARD_MODEL_WORDS if use_reward_model else RewardWords.of(self.reward_fn)
        self.prompts = list(prompts)
        self._rng = np.random.default_rng(config.seed)
        self.history: list[StepRecord] = []
        self.p11: list[P11Record] = []
        # The programs a first step builds on more threads (RLCluster.build_ahead's parts): True for
        # all, a tuple naming them, False for none. The rehearsal, beside a person's clicks, builds the update alone.
        self.builds_ahead: bool | tuple[str, ...] = True
        # Whether its syncs walk their transient peak (the lab's view shows it; a run need not).
        self.sync_peak = False
        self._checked: tuple[int, int, int] | None = None  # the step shape whose programs were checked

    def on(self, cluster: RLCluster) -> GRPOLearner:
        """This learner as it is now (config, rewards, prompts, the prompts it draws next, its
        history) on ``cluster``, drawing and recording on its own: its ``step`` is the step this
        learner takes next. The lab's rehearsal steps it on the cluster's twin (``RLCluster.isolated``)."""
        twin = copy.copy(self)
        twin.cluster = cluster
        twin._rng = copy.deepcopy(self._rng)
        twin.history, twin.p11 = list(self.history), list(self.p11)
        return twin

    def step(self) -> StepRecord:
        """One step: sample, score, take the anchor's and reference's log-probs, update the actor
        (and the critic), sync. A first step builds its later programs beside the sampling
        (``RLCluster.build_ahead``); when it returns or raises, nothing it started is still running."""
        cfg = self.config
        cluster = self.cluster
        n = len(self.prompts)
        drawn = self._rng.bit_generator.state
        chosen = self._rng.choice(n, size=cfg.prompts_per_step, replace=n < cfg.prompts_per_step)
        prompts = [self.prompts[i] for i in chosen for _ in range(cfg.group_size)]
        shape = cluster.generated_shape(prompts)
        if shape != self._checked:  # each program of the step fits before any is compiled (model.fits)
            try:
                check_step_programs(cluster, prompts, shape, critic=cfg.critic)
            except Exception:
                self._rng.bit_generator.state = drawn  # a refused step draws no prompts
                raise
            self._checked = shape
        if self.builds_ahead and not self.history:
            cluster.build_ahead(prompts, self.builds_ahead)
        try:
            return self._take(prompts)
        finally:
            cluster.wait_for_builds()  # a step that failed early leaves nothing running either

    def _take(self, prompts: list[str]) -> StepRecord:
        cfg = self.config
        cluster = self.cluster
        # Each phase is a wait the progress displays show (core.waits): the CLI's line, the lab's status.
        with waiting("generate"):
            out = cluster.generate(prompts)
        check_not_diverged(out.logprobs, len(self.history), self.history[-1] if self.history else None)
        prompt_tokens, completion = out.left_padded_prompt_tokens, out.tokens
        with waiting("rewards"):
            if self.use_reward_model:
                rewards = np.asarray(cluster.get_rewards(prompt_tokens, completion), dtype=np.float32)
            else:
                rewards = np.asarray(self.reward_fn(prompts, out.text), dtype=np.float32)
        if rewards.shape != (len(prompts),):
            raise ValueError(f"reward_fn returned shape {rewards.shape}, expected ({len(prompts)},)")
        values = returns = None
        if cfg.critic:
            with waiting("values (critic)"):
                values = np.asarray(cluster.get_values(prompt_tokens, completion), dtype=np.float32)
            advantages, returns = critic_advantages(rewards, values, completion != cluster.rollout.pad_id())
        else:
            advantages = group_advantages(rewards, cfg.group_size)
        with waiting("log-probs (anchor)"):  # waits for build_ahead's scoring helper first
            anchor = np.asarray(cluster.per_token_logps(Role.ACTOR, prompt_tokens, completion))
        ref = None
        if cluster.scores_reference:
            with waiting("log-probs (reference)"):
                ref = np.asarray(cluster.per_token_logps(Role.REFERENCE, prompt_tokens, completion))
        batch = TrainBatch(prompt_tokens, completion, advantages, anchor, ref)
        index, first = len(self.history), len(self.p11)

        def probe(iteration: int, rows: slice, live_logps: Callable[..., Any]) -> None:
            # The live weights score the whole batch, as the anchor did: the same shapes and
            # shardings run the anchor's compiled program (a mini-batch's own shape would compile
            # another); P11 compares the mini-batch's rows.
            live = np.asarray(live_logps(prompt_tokens, completion))[rows]
            live_vs_anchor = float(np.abs(live - anchor[rows]).max())
            anchor_vs_sampler = float(np.abs(anchor[rows] - out.logprobs[rows]).max())
            record = P11Record(
                step=index,
                iteration=iteration,
                rows=(rows.start, rows.stop),
                steps_taken_before=len(self.p11) - first,
                live_vs_anchor=live_vs_anchor,
                anchor_vs_sampler=anchor_vs_sampler,
            )
            self.p11.append(record)

        with waiting("update_actor"):
            metrics = cluster.update_actor(batch, on_step=probe)
        value_loss = None
        if cfg.critic:
            with waiting("update_critic"):
                critic_metrics = cluster.update_critic(ValueBatch(prompt_tokens, completion, returns, values))
            value_loss = float(np.mean([m["loss"] for m in critic_metrics]))
        with waiting("sync_weights"):
            sync = cluster.sync_weights(peak=self.sync_peak)
        reasons = [r for r in (rejection_reason(m) for m in metrics) if r is not None]
        kept = f"{len(reasons)} of {len(metrics)} optimizer steps kept the previous parameters and optimizer state"
        record = StepRecord(
            step=index,
            mean_reward=float(rewards.mean()),
            loss=float(np.mean([m["loss"] for m in metrics])),
            kl=float(np.mean([m["kl"] for m in metrics])),
            optimizer_steps=len(metrics),
            sync=sync,
            rejected_steps=len(reasons),
            rejected=f"{kept}: {reasons[0]}" if reasons else None,
            value_loss=value_loss,
        )
        self.history.append(record)
        return record

    def run(self, progress: Callable[[StepRecord], None] | None = None) -> LearnerResult:
        total = self.config.steps
        for i in range(total):
            # Every step is one kind of wait: the last step's duration is the next one's estimate.
            with waiting(f"step {i + 1} of {total}", kind="learner step"):
                record = self.step()
            if progress is not None:
                progress(record)
        return LearnerResult(steps=list(self.history), p11=list(self.p11))


def check_step_programs(cluster: RLCluster, prompts: list[str], shape: tuple[int, int, int], critic: bool) -> None:
    """Check every batch program a step on ``prompts`` compiles against its devices' free memory
    before any of them is compiled or run (``model.fits.check_only``): the sampler, the anchor's
    (and the reference's) log-probs and the optimizer step(s), each on a twin of the cluster
    (``RLCluster.isolated``) over zeros of the step's ``shape`` (``RLCluster.generated_shape``),
    as the step's own calls will check them. A step that would stop at its optimizer step is
    refused before it samples.

    Raises:
        TooLargeError: the first program, in the step's order, that does not fit; it names the
            planner's figure, the device's free bytes and the knobs that make the step smaller.
    """
    batch, width, length = shape
    prompt, completion = np.zeros((batch, width), np.int32), np.zeros((batch, length), np.int32)
    logps, rows = np.zeros((batch, length), np.float32), np.zeros(batch, np.float32)
    reference, twin = cluster.scores_reference, cluster.isolated()
    check_only(lambda: twin.generate(prompts))
    check_only(lambda: twin.get_actor_per_token_logps(prompt, completion))
    if reference:
        check_only(lambda: twin.get_ref_per_token_logps(prompt, completion))
    check_only(lambda: twin.update_actor(TrainBatch(prompt, completion, rows, logps, logps if reference else None)))
    if critic:
        check_only(lambda: twin.update_critic(ValueBatch(prompt, completion, logps, logps)))


def group_advantages(rewards: np.ndarray, group_size: int) -> np.ndarray:
    """Reward minus its group's mean, over the group's std (GRPO); 0 for a flat group."""
    if len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}")
    groups = rewards.reshape(-1, group_size)
    mean = groups.mean(axis=1, keepdims=True)
    std = groups.std(axis=1, keepdims=True)
    return ((groups - mean) / np.maximum(std, 1e-6)).reshape(-1).astype(np.float32)


def critic_advantages(rewards: np.ndarray, values: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """PPO-style advantages and value targets from a critic, for a sequence-level reward.

    The reward comes once, at the end, undiscounted (gamma = 1), so every real completion
    token's return-to-go, the critic's target, is the reward itself (0 at padding). The actor
    takes one advantage per completion: the reward minus the critic's mean value over the real
    tokens, whitened over the batch as PPO implementations usually do.

    Args:
        rewards: (B,) one reward per completion.
        values: (B, C) the critic's values (``RLCluster.get_values``).
        mask: (B, C) True at real completion tokens.

    Returns:
        ``(advantages (B,), returns (B, C))``, float32.
    """
    rewards = np.asarray(rewards, np.float32)
    mask = np.asarray(mask, bool)
    if values.shape != mask.shape or rewards.shape != values.shape[:1]:
        raise ValueError(
            f"critic_advantages needs rewards (B,), values (B, C) and mask (B, C); got {rewards.shape}, "
            f"{values.shape} and {mask.shape}"
        )
    returns = np.where(mask, rewards[:, None], 0.0).astype(np.float32)
    counts = np.maximum(mask.sum(axis=1), 1)
    baseline = np.where(mask, values, 0.0).sum(axis=1) / counts
    raw = rewards - baseline
    advantages = (raw - raw.mean()) / max(float(raw.std()), 1e-6)
    return advantages.astype(np.float32), returns


def check_not_diverged(logprobs: np.ndarray, step: int, last: StepRecord | None) -> None:
    """Refuse a step whose sampled log-probs are not finite.

    A fresh model's forward pass is finite (``ModelConfig`` keeps its numerics so); NaN or inf
    here means the weights the actor trained to overflow it, which an update cannot undo: the
    step stops before anything is scored or applied, saying so, instead of refusing the batch
    it would build from these values.

    Raises:
        ConfigError: the run diverged, naming the learning rate (and ``last``'s rejection).
    """
    bad = ~np.isfinite(logprobs)
    if not bad.any():
        return
    before = f"; step {last.step} already said: {last.rejected}" if last is not None and last.rejected else ""
    problem = (
        f"step {step}: the rollout's log-probs are not finite ({int(bad.sum())} of {bad.size} tokens): the "
        f"weights the actor trained to no longer give a finite forward pass, so the run has diverged{before}. "
        "Nothing of this step was scored or applied"
    )
    raise ConfigError(
        f"{problem}. Lower the learning rate (TrainingConfig.learning_rate, or your optimizer's step size).",
        knobs=("learning_rate",),
        problem=problem + ".",
    )
