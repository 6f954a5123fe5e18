"""Configuration dataclasses for the MuZero agent and its training, and the named presets.

`tiny` is for tests and CI (seconds to minutes), `small` for this 2-core machine (~10-30 minutes),
`large` for cloud runs (many actors, bigger networks).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from malloczero.common.settings import check_settings, setting
from malloczero.env.game import GameConfig
from malloczero.env.game.config import MAX_ACTIONS
from malloczero.env.hardware import Hardware

# Bounds of the settings that size what is allocated (`train --set`); beyond them a value is a
# typo rather than a run this project can hold. Simulations: a search's tree grows with them and
# its time faster (actors/greedy_play.py `CALL_COST`).
MAX_SIMULATIONS = 1024
MAX_WIDTH = 8192  # Network widths and support bins.
MAX_BATCH = 65_536  # Learner and probe batches, games per actor.
MAX_UNROLL = 1024  # Unrolled and n-step targets' steps.
MAX_ACTORS = 10_000


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

  d_model: int = setting(
    64, "positive_int", "token width of the attention encoder", maximum=MAX_WIDTH
  )
  num_layers: int = setting(2, "positive_int", "encoder layers", maximum=64)
  num_heads: int = setting(4, "positive_int", "attention heads per encoder layer", maximum=64)
  latent_dim: int = setting(128, "positive_int", "MuZero hidden state size", maximum=MAX_WIDTH)
  hidden_dim: int = setting(
    256, "positive_int", "width of the dynamics and prediction MLPs", maximum=MAX_WIDTH
  )
  support_size: int = setting(
    31, "positive_int", "bins of the categorical value and reward heads", maximum=MAX_WIDTH
  )
  support_limit: float = setting(
    3.0, "positive", "the support covers [-limit, limit] in signed-hyperbolic space"
  )
  # With the "advantage" reward (fractions of msa's time) deviations that matter are worth 1e-3
  # to 1e-2 and the worst lose 0.1-0.14 on the default suite's training programs: 100 puts 1e-3
  # at h = 0.05, 1e-2 at h = 0.41 and the support's end (h = 3) at 0.15.
  value_scale: float = setting(
    100.0, "positive", "returns and rewards are multiplied by this before they are encoded"
  )

  def __post_init__(self):
    check_settings(self, "network")


@dataclasses.dataclass(frozen=True)
class SearchConfig:
  """Gumbel MuZero search (mctx) in the actors."""

  num_simulations: int = setting(
    16,
    "non_negative_int",
    "simulations per move of the actors' training search",
    maximum=MAX_SIMULATIONS,
  )
  eval_num_simulations: int = setting(
    32,
    "non_negative_int",
    "simulations per move of evaluation searches (greedy play)",
    maximum=MAX_SIMULATIONS,
  )
  max_num_considered_actions: int = setting(
    8, "positive_int", "actions the Gumbel search considers at the root", maximum=MAX_ACTIONS
  )
  gumbel_scale: float = setting(1.0, "non_negative", "scale of the root's Gumbel noise")
  # mctx `qtransform_completed_by_mix_value` `epsilon` (mctx's own is 1e-8): a spread below it is
  # not stretched, so gaps the model cannot resolve stay small policy changes. 0.01 lets a 1e-3
  # gap (a deviation that matters) move a logit by about 0.7; the "time" reward, whose values err
  # by a larger share, needs about 0.1.
  q_spread_floor: float = setting(
    0.01,
    "non_negative",
    "the search rescales a node's Q-values by at least this spread, in return units",
  )
  # Trained networks' values err by most of |z|, and a greedy search loses to msa on Q gaps the
  # value cannot tell apart: at 0.1 greedy play leaves the policy's move only for gaps it can.
  # Training keeps the lower floor, where small gaps must still shape the policy targets.
  eval_q_spread_floor: float = setting(
    0.1,
    "non_negative",
    "the same floor for evaluation searches (greedy play: the learning curve, the final report, "
    "the agent solver's first attempt)",
  )
  # 0, the default, leaves the prior to the network, so that greedy play is the network's own
  # (msa's mapping is one of the agent solver's attempts anyway, so it never needs the prior to be
  # at least msa). actors/search.py adds it.
  eval_msa_prior_logit: float = setting(
    0.0,
    "non_negative",
    "evaluation searches add this to the root prior's logit of msa's own move in the msa game "
    "(0 leaves the prior to the network)",
  )

  def __post_init__(self):
    check_settings(self, "search")


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
  batch_size: int = setting(64, "positive_int", "items per learner batch", maximum=MAX_BATCH)
  unroll_steps: int = setting(
    5, "positive_int", "K: steps the dynamics are unrolled", maximum=MAX_UNROLL
  )
  td_steps: int = setting(10, "positive_int", "n of the n-step value target", maximum=MAX_UNROLL)
  # mallocGame is undiscounted.
  discount: float = setting(1.0, "probability", "per-step discount of value targets")
  learning_rate: float = setting(1e-3, "positive", "peak learning rate")
  warmup_steps: int = setting(100, "non_negative_int", "learner steps of linear warm-up")
  decay_steps: int = setting(
    10_000,
    "positive_int",
    "learner steps after the warm-up over which the learning rate falls (cosine) to a tenth of "
    "its peak, where it stays",
  )
  weight_decay: float = setting(1e-4, "non_negative", "AdamW weight decay")
  max_grad_norm: float = setting(5.0, "positive", "gradients are clipped to this global norm")
  target_update_period: int = setting(
    100, "positive_int", "learner steps between copies of the parameters to the target network"
  )
  value_loss_weight: float = setting(0.25, "non_negative", "weight of the value loss")
  # The search's action weights, self-imitation's and the demonstrations' moves; with probes on,
  # 0 leaves the policy to the probes' exact advantages alone.
  policy_loss_weight: float = setting(
    1.0,
    "non_negative",
    "weight of the policy's fit to replay's and demonstrations' targets (with probes, 0 leaves "
    "the policy to the probes' exact advantages)",
  )
  legality_loss_weight: float = setting(
    1.0, "non_negative", "weight of the legal-action prediction's loss"
  )
  checkpoint_every_s: float = setting(120.0, "positive", "seconds between learner checkpoints")
  # The demonstrations, kept and drawn by learner/demonstrations/.
  demonstration_fraction: float = setting(
    0.25,
    "fraction",
    "share of each learner batch drawn from the best known game per training program, msa's "
    "own at first (0 turns them off)",
  )
  # The rest of the windows start uniformly (learner/demonstrations/store.py
  # `Demonstrations.sample`).
  # A corpus of hundreds of programs: a demonstration holds a whole program's observations
  # (tens of MB at 5,000 buffers) and seeding it replays msa over the whole program.
  demonstration_programs: int = setting(
    0,
    "non_negative_int",
    "training programs that keep a demonstration: the report suite's first, then the others "
    "in a seeded order (0: every training program)",
  )
  demonstration_departures: float = setting(
    0.0,
    "probability",
    "share of demonstration windows placed on a step where the demonstration leaves msa's move",
  )
  # MuZero Reanalyse (learner/reanalyse.py): states 0..K searched again with the learner's current
  # parameters before each step.
  reanalyse_fraction: float = setting(
    0.0,
    "probability",
    "share of the items sampled from replay whose policy targets the learner searches again "
    "with its current parameters (self-imitation targets and demonstrations keep theirs)",
  )

  def __post_init__(self):
    check_settings(self, "learner")

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
  max_size: int = setting(100_000, "positive_int", "items the Reverb table holds")
  min_size_to_sample: int = setting(
    1_000, "positive_int", "items in the table before the learner samples"
  )
  samples_per_insert: float = setting(
    4.0, "positive", "samples per inserted item the rate limiter aims at"
  )
  samples_per_insert_tolerance: float = setting(
    0.5, "non_negative", "the rate limiter's error buffer, a fraction of min size x ratio"
  )
  priority_exponent: float = setting(0.6, "non_negative", "prioritised replay's exponent")
  importance_sampling_exponent: float = setting(
    0.4, "non_negative", "exponent of the importance-sampling weights"
  )
  prefetch: int = setting(
    4, "positive_int", "batches the learner's dataset prefetches", maximum=1024
  )

  def __post_init__(self):
    check_settings(self, "replay")


@dataclasses.dataclass(frozen=True)
class ActorConfig:
  num_games: int = setting(
    16, "positive_int", "games stepped together per actor (B)", maximum=MAX_BATCH
  )
  variable_update_period: int = setting(50, "positive_int", "acting steps between parameter pulls")
  # A game holds its program's requests and cost model: hundreds of programs times `num_games`
  # slots do not fit in memory.
  cached_games: int = setting(
    0,
    "non_negative_int",
    "built games an actor keeps for reuse, the least recently drawn dropped first (0: all)",
  )
  # env/game/game.py `reset_segment`. Whole programs of the default suite take 16 to 16,855
  # moves, so a run completes few games and a return mixes thousands of moves. Each short game
  # costs one msa pass over its program (the prefix and msa's completion), which 64 moves
  # amortise: 16 gave a third of 64's moves per second.
  segment_moves: int = setting(
    64,
    "non_negative_int",
    "actors play short games: this many moves from a random point of msa's game, msa the rest "
    "(0: whole programs)",
  )
  # Self-imitation of gains only (Oh et al. 2018). The search's targets follow value noise larger
  # than the gains over msa, and the departures they teach lose to msa in greedy play. Needs the
  # msa game. A game's steps are held until it ends (64 with short games; a whole program's
  # without).
  imitate_gains_only: bool = setting(
    False,
    "switch",
    "on: a game no faster than msa's mapping teaches msa's move wherever it left it, so the "
    "policy learns departures from msa only from games that beat msa",
  )

  def __post_init__(self):
    check_settings(self, "actor")


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
  """Probes (learner/probes/): an actor plays every legal move of a decision once, msa
  finishing, and the learner fits the policy's cross-entropy to softmax(exact advantage over msa
  / `temperature`) at `batch` decisions of the newest `capacity` beside every batch, weighted by
  `loss_weight` (learner/probes/loss.py `probe_policy_loss`)."""

  # About 0.3 s per decision on the default suite.
  share: float = setting(
    0.0,
    "fraction",
    "share of each actor's time spent probing decisions of msa's game (every legal move played "
    "once, msa the rest), whose exact advantages over msa the learner fits the policy to (0 "
    "turns probes off)",
  )
  # The states the network's departures reach, where a prior fitted on msa's states alone loses
  # (DAgger). The rollout costs one network call and one game move per step before the decision.
  on_policy: float = setting(
    0.0,
    "probability",
    "share of the probes drawn along the network's own trajectory (its policy alone from the "
    "program's start) rather than msa's",
  )
  # A rollout is one network call per move: on a 2,000-move program it costs several probes.
  on_policy_per_rollout: int = setting(
    8,
    "positive_int",
    "decisions of the network's trajectory recorded by one rollout of it and probed in turn",
  )
  batch: int = setting(
    64, "positive_int", "probed decisions the learner fits beside each batch", maximum=MAX_BATCH
  )
  # 1e-3 of msa's time is where deviations start to matter.
  temperature: float = setting(
    1e-3, "positive", "temperature of the softmax over the probes' exact advantages"
  )
  msa_margin: float = setting(
    0.0,
    "non_negative",
    "added to msa's move's advantage in the probes' policy targets: the policy leaves msa's "
    "move only where another gains more than this (in fractions of msa's time)",
  )
  loss_weight: float = setting(1.0, "non_negative", "weight of the probes' policy loss")
  capacity: int = setting(20_000, "positive_int", "probed decisions the learner keeps")

  def __post_init__(self):
    check_settings(self, "probes")


@dataclasses.dataclass(frozen=True)
class ProposerConfig:
  """The proposer (learner/proposer/): a network that proposes evo's request priorities, fitted
  before the run trains to labels of evo's best mappings (by default the committed labels of the
  training corpus), saved beside the checkpoints; the agent plays its proposal first and starts
  its guided search from it. The fit's time counts in the run's --max-seconds."""

  # About 15 s a member on 2 cores on the corpus labels, after building their features.
  steps: int = setting(
    3000,
    "non_negative_int",
    "Adam steps of the proposer's fit before the run trains (0: no proposer)",
    maximum=1_000_000,
  )
  batch_size: int = setting(
    4096, "positive_int", "requests per step of the proposer's fit", maximum=MAX_BATCH
  )
  learning_rate: float = setting(1e-3, "positive", "the proposer's Adam learning rate")
  # members and saving_weight: measured on the corpus labels at 3 seeds (docs/results/README.md,
  # "Saving-weighted labels and an ensemble"); also the defaults of learner/proposer `fit`.
  members: int = setting(
    3,
    "positive_int",
    "networks of the proposer, each fitted from its own seed; it proposes by their mean chance",
    maximum=16,
  )
  saving_weight: float = setting(
    0.25,
    "fraction",
    "share of each program's weight in the proposer's fit given to its requests by what each "
    "saves placed alone (the rest evenly)",
  )
  max_programs: int = setting(
    0,
    "non_negative_int",
    "labelled programs the proposer is fitted to, drawn with the run's seed (0: all)",
  )
  labels: str = setting(
    "",
    "text",
    "the proposer's labels file (scripts/priority_proposer.py labels; empty: the built-in "
    "labels of the training corpus)",
  )
  # The tuning (learner/proposer/tuning.py): evolution strategies on the members' last layers,
  # judged by one decode's speed over msa on the labelled programs.
  # 100 steps: about 6.5 minutes of 2 cores (docs/results/README.md, "Tuning the proposer on
  # its decoded speed").
  tune_steps: int = setting(
    100,
    "non_negative_int",
    "evolution-strategies steps that tune the fitted proposer's last layers on its decoded speed "
    "over msa (0: none)",
    maximum=100_000,
  )
  tune_pairs: int = setting(
    8, "positive_int", "antithetic pairs of perturbations per tuning step", maximum=1024
  )
  tune_batch: int = setting(
    48, "positive_int", "labelled programs each tuning perturbation is decoded on", maximum=10_000
  )

  def __post_init__(self):
    check_settings(self, "proposer")


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """The Launchpad program (system/distributed.py): node counts and how often state is saved."""

  num_actors: int = setting(
    2, "positive_int", "actor nodes (local_mp and vertex_ai)", maximum=MAX_ACTORS
  )
  replay_checkpoint_every_s: float = setting(
    180.0, "positive", "seconds between Reverb table checkpoints (and one at stop)"
  )
  counter_save_every_s: float = setting(
    30.0, "positive", "seconds between saves of the step counters (and one at stop)"
  )
  actor_report_every_s: float = setting(
    2.0, "positive", "seconds between an actor's batched counter increments"
  )
  summary_every_s: float = setting(
    5.0, "positive", "seconds between the launcher's console summary lines"
  )
  heldout_only_evaluator: bool = setting(
    True, "switch", "the evaluator node plays only held-out programs"
  )

  def __post_init__(self):
    check_settings(self, "distributed")


@dataclasses.dataclass(frozen=True)
class Config:
  name: str = "small"  # The preset's; set by `train --config`.
  # "" with `programs`: train on those alone.
  suite: str = setting("default", "text", "suite whose training programs the run trains on")
  # A training corpus has no held-out split of its own, and its hundreds of programs are too
  # many to measure every `eval_every_steps`: the figures come from another suite's splits.
  report_suite: str = setting(
    "",
    "text",
    "suite whose train and held-out programs the learning curve, checkpoint selection and "
    "final report measure (empty: the training suite)",
  )
  programs: tuple[ProgramFile, ...] = ()  # Set by `train --workload`.
  game: GameConfig = GameConfig()
  network: NetworkConfig = NetworkConfig()
  search: SearchConfig = SearchConfig()
  learner: LearnerConfig = LearnerConfig()
  replay: ReplayConfig = ReplayConfig()
  actor: ActorConfig = ActorConfig()
  probes: ProbeConfig = ProbeConfig()
  proposer: ProposerConfig = ProposerConfig()
  distributed: DistributedConfig = DistributedConfig()
  seed: int = setting(0, "seed", "the run's seed")
  max_learner_steps: int = setting(5_000, "positive_int", "the run stops at this learner step")
  eval_every_steps: int = setting(1_000, "positive_int", "learner steps between greedy evaluations")
  # 56 programs on the default suite: about 2 minutes.
  final_search_seconds: float = setting(
    2.0,
    "non_negative",
    "the final evaluation's agent: its greedy play, msa's mapping and this many seconds per "
    "program of the guided search",
  )
  # Checkpoint selection on training programs only: the learner keeps a checkpoint every
  # `eval_every_steps` learner steps (the newest this many), and the final evaluation plays them
  # greedily on the training programs and reports the one whose geomean is highest (ties: the
  # latest). Each candidate costs a greedy play of the training programs, about 3 minutes on the
  # default suite on 2 cores.
  select_checkpoints: int = setting(
    1,
    "positive_int",
    "the final evaluation reports, of the last N checkpoints (one kept every eval_every_steps), "
    "the one whose greedy play is fastest on the training programs; 1: the final one",
  )
  # actors/games.py `training_specs`: more situations of contention per program, to measure
  # whether the network's play then transfers to held-out programs.
  capacity_variants: tuple[float, ...] = setting(
    (),
    "unit_fractions",
    "actors also play every training suite entry at these fractions of its program's peak live "
    "bytes, e.g. 0.1,0.25,0.5 (reports keep to the suite's own entries; empty: none)",
  )

  @property
  def measured_suite(self) -> str:
    """The suite whose splits the run's figures measure: `report_suite`, else `suite`."""
    return self.report_suite or self.suite

  def __post_init__(self):
    check_settings(self)
    if self.capacity_variants and not self.suite:
      raise ValueError("capacity variants vary a suite's entries: train on a suite")
    if self.actor.segment_moves and (self.game.decisions, self.game.reward) != ("msa", "advantage"):
      raise ValueError(
        "short games (segment_moves > 0) need the msa game's 'advantage' reward: their return "
        "is exact only relative to msa's completion (set segment_moves to 0)"
      )
    if self.probes.share and self.game.decisions != "msa":
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
    # The "time" reward and whole games: a dense reward that a short test run (tests/trained.py)
    # learns from; the sparse "advantage" reward with short games teaches little in so few steps,
    # and the tiny programs' deviations lose up to half of msa's time, where the default suite's
    # lose at most 14%.
    game=GameConfig(reward="time"),
    # Floor 0.02 for both searches: the tiny programs' 20-60 decisions each carry far larger Q
    # gaps than the default suite's, and a floor of 0.1 flattens the policy targets of a short
    # test run too much.
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
    # Seconds: a few of the corpus's programs, a short fit.
    proposer=ProposerConfig(steps=100, batch_size=512, max_programs=4, tune_steps=2),
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
  # Probes take most of the actors' time, and the policy is fitted to their exact advantages
  # alone (policy_loss_weight 0): replay's and the demonstrations' targets still train the value,
  # reward and dynamics. A margin of 1e-3 for msa's move in the probes' targets keeps the policy
  # from departing from msa at exact ties, where a departure can lose a whole long program.
  # Self-imitation of gains only: a departure from msa is learnt only from a game that beat msa.
  # Reanalyse stays off: it costs a search of every item it reanalyses, and its policy was not
  # measurably better.
  return Config(
    network=NetworkConfig(d_model=32, num_layers=1, num_heads=2, latent_dim=64, hidden_dim=128),
    learner=LearnerConfig(policy_loss_weight=0.0),
    actor=ActorConfig(imitate_gains_only=True),
    probes=ProbeConfig(share=0.6, msa_margin=1e-3),
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
