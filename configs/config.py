"""Configuration dataclasses for the MuZero agent and its training, and the named presets.

`tiny` is for tests and CI (seconds to minutes), `small` for this 2-core machine (~10-30 minutes),
`large` for cloud runs (many actors, bigger networks).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from malloczero.env.game import GameConfig
from malloczero.env.hardware import Hardware


@dataclasses.dataclass(frozen=True)
class ProgramFile:
  """A program to train on from a workload file (`train --workload`), beside or instead of the
  suite's training programs."""

  name: str
  workload: str  # Absolute path of the workload file.
  hardware: Hardware  # With the fast capacities the command line set.


@dataclasses.dataclass(frozen=True)
class NetworkConfig:
  """Haiku MuZero networks (learner/networks.py)."""

  d_model: int = 64  # Token width of the attention encoder.
  num_layers: int = 2  # Encoder layers.
  num_heads: int = 4
  latent_dim: int = 128  # MuZero hidden state size.
  hidden_dim: int = 256  # Width of the dynamics / prediction MLPs.
  support_size: int = 31  # Bins of the categorical value and reward heads.
  support_limit: float = 3.0  # Support covers [-limit, limit] in signed-hyperbolic space.
  # Returns and rewards are multiplied by this before encoding. With the "advantage" reward
  # (fractions of msa's time) deviations that matter are worth 1e-3 to 1e-2 and the worst lose
  # 0.1-0.14 (measured on the default suite's training programs, docs/results): 100 puts 1e-3 at
  # h = 0.05, 1e-2 at h = 0.41 and the support's end (h = 3) at 0.15.
  value_scale: float = 100.0


@dataclasses.dataclass(frozen=True)
class SearchConfig:
  """Gumbel MuZero search (mctx) in the actors."""

  num_simulations: int = 16
  eval_num_simulations: int = 32
  max_num_considered_actions: int = 8
  gumbel_scale: float = 1.0
  # Q-values (raw return units: fractions of msa's time with the "advantage" reward) of a node's
  # actions are rescaled by max(their spread, this) before they shape the policy (mctx
  # `qtransform_completed_by_mix_value` `epsilon`; mctx's own is 1e-8): a spread below it is not
  # stretched, so gaps the model cannot resolve stay small policy changes. 0.01 lets a 1e-3 gap
  # (a deviation that matters) move a logit by about 0.7. With the "time" reward 0.1 was needed
  # (values then erred by 0.017-0.043 of the all-slow time).
  q_spread_floor: float = 0.01
  # The same floor for evaluation searches (greedy play: the learning curve, the final report, the
  # agent solver's first attempt). Trained networks' values err by 0.57-0.80 of |z| (docs/results
  # 3.14), and every loss of the greedy search to msa came from Q gaps below 0.1 (3.15): at 0.1
  # greedy play leaves the policy's move only for gaps the value can tell apart. Training keeps
  # the lower floor, where small gaps must still shape the policy targets.
  eval_q_spread_floor: float = 0.1
  # Evaluation searches (greedy play, the agent as a solver) add this to the root prior's logit
  # of msa's own move in the msa game (actors/search.py). 0, the default, leaves the prior to the
  # network, so that greedy play is the network's own (msa's mapping is one of the agent
  # solver's attempts anyway, so it never needs the prior to be at least msa).
  eval_msa_prior_logit: float = 0.0


# Trajectories the trained agent plays per program at test time (the first greedy, the others
# sampled), keeping the best. Test-time only, so not in SearchConfig: runs never read it.
DEFAULT_ATTEMPTS = 8
# Seconds per program of the agent solver's search guided by the network after its attempts
# (actors/agent.py `guided_search`) in `solve` and `evaluate`: half of evo's default time limit,
# so that the agent's whole solve stays comparable to evo's. A run's final evaluation uses its
# config's `final_search_seconds`.
DEFAULT_SEARCH_SECONDS = 5.0


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
  batch_size: int = 64
  unroll_steps: int = 5  # K
  td_steps: int = 10  # n in the n-step value target
  discount: float = 1.0  # Per-step discount of value targets (mallocGame: undiscounted).
  learning_rate: float = 1e-3
  warmup_steps: int = 100
  decay_steps: int = 10_000  # Cosine decay to 10% after warm-up.
  weight_decay: float = 1e-4
  max_grad_norm: float = 5.0
  target_update_period: int = 100
  value_loss_weight: float = 0.25
  # Weight of the policy's cross-entropy to replay's and demonstrations' targets (the search's
  # action weights, self-imitation's, the demonstrations' moves); with probes on, 0 leaves the
  # policy to the probes' exact advantages alone.
  policy_loss_weight: float = 1.0
  legality_loss_weight: float = 1.0
  checkpoint_every_s: float = 120.0
  # Share of each batch drawn from the best known trajectory per training program, msa's play at
  # first (replay/demonstrations.py); 0 turns demonstrations off.
  demonstration_fraction: float = 0.25
  # Share of those windows placed so that the policy is fitted at a step where the demonstration
  # leaves msa's move (replay/demonstrations.py `Demonstrations.sample`); the rest are uniform.
  demonstration_departures: float = 0.0
  # Share of the items sampled from replay whose policy targets at states 0..K are searched
  # again with the learner's current parameters before each step (learner/reanalyse.py; MuZero
  # Reanalyse); self-imitation targets and demonstrations keep theirs. 0 turns it off.
  reanalyse_fraction: float = 0.0
  # With probes on (`ActorConfig.probe_share`), each batch also fits the policy's cross-entropy
  # to softmax(exact advantage over msa / `probe_temperature`) at this many decisions drawn from
  # the newest `probe_capacity` the actors probed (actors/prober.py), weighted by
  # `probe_loss_weight`. The temperature: 1e-3 of msa's time is where deviations start to
  # matter; fitted offline so, a fresh network beat msa on 9-12 of 16 held-out programs with no
  # search (docs/results 3.20).
  probe_batch: int = 64
  probe_temperature: float = 1e-3
  # Added to msa's move's advantage in the probes' targets (learner/losses.py
  # `probe_policy_loss`): the policy leaves msa's move where another gains more than this.
  probe_msa_margin: float = 0.0
  probe_loss_weight: float = 1.0
  probe_capacity: int = 20_000

  def __post_init__(self):
    if not 0.0 <= self.demonstration_fraction < 1.0:
      raise ValueError(
        f"demonstration_fraction must be in [0, 1), got {self.demonstration_fraction}"
      )
    if not 0.0 <= self.demonstration_departures <= 1.0:
      raise ValueError(
        f"demonstration_departures must be in [0, 1], got {self.demonstration_departures}"
      )
    if not 0.0 <= self.reanalyse_fraction <= 1.0:
      raise ValueError(f"reanalyse_fraction must be in [0, 1], got {self.reanalyse_fraction}")
    if self.probe_batch < 1 or self.probe_capacity < 1:
      raise ValueError("probe_batch and probe_capacity must be at least 1")
    if self.probe_msa_margin < 0:
      raise ValueError(f"probe_msa_margin must be at least 0, got {self.probe_msa_margin}")
    if self.policy_loss_weight < 0:
      raise ValueError(f"policy_loss_weight must be >= 0, got {self.policy_loss_weight}")
    if not self.probe_temperature > 0 or not self.probe_loss_weight >= 0:
      raise ValueError("probe_temperature must be > 0 and probe_loss_weight >= 0")

  @property
  def demonstration_batch(self) -> int:
    """Demonstration windows per batch."""
    return int(round(self.demonstration_fraction * self.batch_size))

  @property
  def replay_batch(self) -> int:
    """Items sampled from replay per batch: the rest of `batch_size`."""
    return self.batch_size - self.demonstration_batch

  @property
  def reanalyse_batch(self) -> int:
    """Items of each batch's replay share whose policy targets are searched again."""
    return int(round(self.reanalyse_fraction * self.replay_batch))

  @property
  def sequence_length(self) -> int:
    """Steps per replay item: the unroll, the n-step window and the bootstrap state."""
    return self.unroll_steps + self.td_steps + 1


@dataclasses.dataclass(frozen=True)
class ReplayConfig:
  max_size: int = 100_000
  min_size_to_sample: int = 1_000
  samples_per_insert: float = 4.0
  samples_per_insert_tolerance: float = 0.5  # Error buffer as a fraction of min size x ratio.
  priority_exponent: float = 0.6
  importance_sampling_exponent: float = 0.4
  prefetch: int = 4


@dataclasses.dataclass(frozen=True)
class ActorConfig:
  num_games: int = 16  # B games stepped together per actor.
  variable_update_period: int = 50  # Acting steps between parameter pulls.
  # Short games (env/game/game.py `reset_segment`): the agent decides this many moves from a
  # uniformly drawn point of msa's own game, msa the rest; 0 plays whole programs. Why: whole
  # programs of the default suite take 16 to 16,855 moves, so a run completed about 60 games per
  # 5,000 learner steps and a return mixed thousands of moves. Each short game costs one msa pass
  # over its program (the prefix and msa's completion), which 64 moves amortise: 16 gave a third
  # of 64's moves per second (docs/results, "Short games").
  segment_moves: int = 64
  # Self-imitation of gains only (Oh et al. 2018): a game that ends no faster than msa's mapping
  # is written with msa's move as the policy target wherever it left msa's move, so the policy
  # learns a departure from msa only from a game that beat msa. Why: the search's targets follow
  # value noise larger than the gains over msa, and the departures they teach lose to msa in
  # greedy play (docs/results 3.9-3.10). Needs the msa game; on in the `small` preset. A game's
  # steps are held until it ends (64 with short games; a whole program's without).
  imitate_gains_only: bool = False
  # Share of each actor's time spent probing decisions (actors/prober.py: every legal move of a
  # decision of msa's trajectory played once, msa finishing), which the learner fits
  # (`LearnerConfig.probe_batch`); 0 turns probes off. About 0.3 s per decision on the default
  # suite.
  probe_share: float = 0.0
  # Share of the probes drawn along the network's own trajectory (its policy alone from the
  # program's start, with the actor's parameters of the moment) rather than msa's: the states
  # its departures reach, where a prior fitted on msa's states alone loses (DAgger; docs/results
  # 3.21). The rollout costs one network call and one game move per step before the decision.
  probe_on_policy: float = 0.0

  def __post_init__(self):
    if self.segment_moves < 0:
      raise ValueError(f"segment_moves must be >= 0, got {self.segment_moves}")
    if not 0.0 <= self.probe_share < 1.0:
      raise ValueError(f"probe_share must be in [0, 1), got {self.probe_share}")
    if not 0.0 <= self.probe_on_policy <= 1.0:
      raise ValueError(f"probe_on_policy must be in [0, 1], got {self.probe_on_policy}")


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """The Launchpad program (system/distributed.py): node counts and how often state is saved."""

  num_actors: int = 2
  replay_checkpoint_every_s: float = 180.0  # Reverb table checkpoints (and one at stop).
  counter_save_every_s: float = 30.0  # Step counters (and at stop).
  actor_report_every_s: float = 2.0  # Actor -> counter increments (batched RPCs).
  summary_every_s: float = 5.0  # Console summary line in the launcher.
  heldout_only_evaluator: bool = True  # The evaluator node plays only held-out programs.


@dataclasses.dataclass(frozen=True)
class Config:
  name: str = "small"
  suite: str = "default"  # "" with `programs`: train on those alone.
  programs: tuple[ProgramFile, ...] = ()
  game: GameConfig = GameConfig()
  network: NetworkConfig = NetworkConfig()
  search: SearchConfig = SearchConfig()
  learner: LearnerConfig = LearnerConfig()
  replay: ReplayConfig = ReplayConfig()
  actor: ActorConfig = ActorConfig()
  distributed: DistributedConfig = DistributedConfig()
  seed: int = 0
  max_learner_steps: int = 5_000
  eval_every_steps: int = 1_000  # Learner steps between greedy evaluations of the whole suite.
  # The final evaluation's agent: its greedy play, msa's mapping and this many seconds per
  # program of the guided search (56 programs on the default suite: about 2 minutes).
  final_search_seconds: float = 2.0
  # Checkpoint selection on training programs only: the learner keeps a checkpoint every
  # `eval_every_steps` learner steps (the newest this many), and the final evaluation plays the
  # last `select_checkpoints` of them (the final one included) greedily on the training programs
  # and reports the one whose geomean is highest (ties: the latest). 1 reports the final one.
  select_checkpoints: int = 1
  # Actors also play every training suite entry at these fractions of its program's peak live
  # bytes (actors/games.py `training_specs`): more situations of contention per program, to
  # measure whether the network's play then transfers to held-out programs. () plays the suite's
  # entries alone.
  capacity_variants: tuple[float, ...] = ()

  def __post_init__(self):
    if self.select_checkpoints < 1:
      raise ValueError(f"select_checkpoints must be at least 1, got {self.select_checkpoints}")
    for fraction in self.capacity_variants:
      if not 0.0 < fraction <= 1.0:
        raise ValueError(f"capacity variants must be fractions in (0, 1], got {fraction:g}")
    if self.capacity_variants and not self.suite:
      raise ValueError("capacity variants vary a suite's entries: train on a suite")
    if self.actor.segment_moves and (self.game.decisions, self.game.reward) != ("msa", "advantage"):
      raise ValueError(
        "short games (segment_moves > 0) need the msa game's 'advantage' reward: their return "
        "is exact only relative to msa's completion (set segment_moves to 0)"
      )
    if self.actor.probe_share and self.game.decisions != "msa":
      raise ValueError("probes need the msa game: only it knows msa's move at each step")
    if self.actor.imitate_gains_only and self.game.decisions != "msa":
      raise ValueError(
        "imitate_gains_only needs the msa game: only it knows msa's move at each step"
      )


def tiny() -> Config:
  return Config(
    name="tiny",
    suite="tiny",
    network=NetworkConfig(
      d_model=32,
      num_layers=1,
      num_heads=2,
      latent_dim=64,
      hidden_dim=64,
      support_size=21,
      value_scale=10.0,
    ),
    # The "time" reward and whole games: the 100-step test run (tests/trained.py) is calibrated on
    # them. With the sparse "advantage" reward and 8-move short games it learnt nothing in 100
    # steps (train geomean 1.196 and 0.988 from 1.04-1.06 in two runs; the tiny programs'
    # deviations lose up to half of msa's time, where the default suite's lose at most 14%).
    game=GameConfig(reward="time"),
    # Floor 0.02 for both searches: the tiny programs' 20-60 decisions each carry far larger Q
    # gaps than the default suite's; at 0.1 the 100-step test run (tests/trained.py) learnt too
    # little in one of three runs (train geomean 1.075, 1.272, 1.320 from 1.041), at 0.02
    # 1.363-1.538.
    search=SearchConfig(
      num_simulations=8,
      eval_num_simulations=16,
      max_num_considered_actions=4,
      q_spread_floor=0.02,
      eval_q_spread_floor=0.02,
    ),
    learner=LearnerConfig(
      batch_size=32,
      unroll_steps=3,
      td_steps=5,
      learning_rate=2e-3,
      warmup_steps=20,
      decay_steps=2_000,
      target_update_period=50,
      checkpoint_every_s=30.0,
    ),
    replay=ReplayConfig(max_size=20_000, min_size_to_sample=200, samples_per_insert=2.0),
    actor=ActorConfig(num_games=8, variable_update_period=20, segment_moves=0),
    distributed=DistributedConfig(
      replay_checkpoint_every_s=20.0,
      counter_save_every_s=5.0,
      actor_report_every_s=1.0,
      summary_every_s=3.0,
    ),
    max_learner_steps=400,
    eval_every_steps=100,
    final_search_seconds=0.25,
  )


def small() -> Config:
  # Sized for a 2-core CPU: one search simulation costs about as much as mctx's own bookkeeping.
  # Probes, and the policy fitted to them alone: at 3 seeds of `make train` they took the
  # policy's own held-out play from 1.008 +- 0.015 to 1.035 +- 0.038 x msa (training programs
  # 1.000 to 0.998 +- 0.009) and the agent's from 1.067 +- 0.001 to 1.083 +- 0.008 (training
  # programs 1.017 to 1.031) (docs/results 3.22). A margin of 1e-3 for msa's move in their
  # targets keeps the policy from departing at ties, which lost whole long programs: the
  # policy's own play at least msa on both splits in every seed (docs/results 3.23).
  # Self-imitation of gains only: at 3 seeds of `make train` it took held-out greedy play from
  # 1.001 +- 0.005 to 1.024 +- 0.001 x msa, training programs 0.996 +- 0.006 to 0.999 +- 0.001
  # (docs/results 3.10). Reanalyse stays off: its greedy search's losses on training programs
  # (3.14) went with the evaluation floor, but its policy kept the held-out departure it is for
  # in 5 of 12 runs against 1 of 6 without it, within chance (docs/results 3.14, 3.16).
  return Config(
    network=NetworkConfig(d_model=32, num_layers=1, num_heads=2, latent_dim=64, hidden_dim=128),
    learner=LearnerConfig(policy_loss_weight=0.0, probe_msa_margin=1e-3),
    actor=ActorConfig(imitate_gains_only=True, probe_share=0.6),
  )


def large() -> Config:
  return Config(
    name="large",
    network=NetworkConfig(
      d_model=128, num_layers=4, num_heads=8, latent_dim=256, hidden_dim=512, support_size=61
    ),
    search=SearchConfig(
      num_simulations=32, eval_num_simulations=128, max_num_considered_actions=16
    ),
    learner=LearnerConfig(
      batch_size=256,
      learning_rate=5e-4,
      warmup_steps=1_000,
      decay_steps=200_000,
      target_update_period=500,
      checkpoint_every_s=600.0,
    ),
    replay=ReplayConfig(max_size=2_000_000, min_size_to_sample=20_000, samples_per_insert=8.0),
    actor=ActorConfig(num_games=64, variable_update_period=100),
    distributed=DistributedConfig(
      num_actors=64,
      replay_checkpoint_every_s=900.0,
      counter_save_every_s=60.0,
      summary_every_s=30.0,
    ),
    max_learner_steps=500_000,
    eval_every_steps=20_000,
  )


PRESETS = {"tiny": tiny, "small": small, "large": large}


def with_section(config: Config, section: str, **values: Any) -> Config:
  """`config` with some fields of one section (`game`, `learner`, `search`, ...) replaced."""
  return dataclasses.replace(
    config, **{section: dataclasses.replace(getattr(config, section), **values)}
  )


def get_config(name: str) -> Config:
  from malloczero.common.errors import MalloczeroError

  if name not in PRESETS:
    raise MalloczeroError(f"unknown config '{name}' (choose from {', '.join(PRESETS)})")
  return PRESETS[name]()
