"""Does a network know which deviations from msa pay? Its scores against exact advantages.

At decisions sampled along msa's own trajectory of a program, every legal move is played once
and msa finishes the program (`MsaGame.reset_segment(step, 1)`: a one-move short game), so each
move's *exact* advantage over msa is known: (msa's time - the mapping's time) / msa's time, 0
for msa's own move. A network scores the same moves two ways at that state:

  prior   its policy logits (what greedy play without search follows);
  model   its one-step model's Q: the predicted reward of the move plus the predicted value of
          the state the dynamics reach (what the search's Q-values are built from).

`summarise` compares both with the exact advantages: how often the prior's argmax is msa's move,
pairwise ranking accuracy over pairs of moves whose advantages differ by at least a threshold
(0.5 is chance), and what the prior's argmax would earn where a deviation pays (the model's
error is in the advantage's units only for networks trained with the "advantage" reward).
`probe_policy_trajectory` draws the decisions along a policy's own trajectory instead.

Why: the network's own play ties msa on almost every program (docs/results/archive.md 3.12-3.18),
and this tells apart a network that ranks deviations but is held back (by its prior, the search or
the evaluation floor) from one that cannot tell a gainful deviation from a losing one, on training
programs (fitted) and held-out ones (generalisation).
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from malloczero.actors.actor import stack_observations
from malloczero.actors.games import GameSpec
from malloczero.common.errors import MalloczeroError
from malloczero.env.game import GameConfig, make_game, observation_spec
from malloczero.env.solvers.evo_msa import Genome
from malloczero.learner.networks import MuZeroNetworks, Params, logits_to_scalar
from malloczero.learner.probes import Policy, advantages_after, one_move_advantages

# Pairs of moves whose exact advantages differ by less than this are not ranked: 1e-3 of msa's
# time is where deviations start to matter (docs/results/README.md, "What a deviation from msa
# is worth").
DEFAULT_MIN_GAP = 1e-3


@dataclasses.dataclass(frozen=True)
class ProbedDecision:
  """One decision of a probed trajectory (msa's, or a policy's) with the exact advantage of each
  legal move."""

  program: str
  split: str
  step: int  # The move's index in the trajectory probed.
  msa_action: int
  actions: np.ndarray  # [n] the legal action slots.
  advantages: np.ndarray  # [n] exact advantage over msa of each, msa finishing (msa's is 0).
  observation: dict[str, np.ndarray]  # The game's observation at the decision.


def _draw_steps(program: str, legal_counts: Sequence[int], decisions: int, seed: int) -> list[int]:
  """Up to `decisions` of a trajectory's steps that offer more than one legal move, drawn
  uniformly without replacement, sorted; the draw depends on `seed` and the program's name only,
  not on which programs are probed with it."""
  rng = np.random.default_rng([seed, zlib.crc32(program.encode())])
  choices = np.flatnonzero(np.asarray(legal_counts) > 1)
  return np.sort(rng.choice(choices, size=min(decisions, len(choices)), replace=False)).tolist()


def probe_program(
  spec: GameSpec, split: str, config: GameConfig, decisions: int, seed: int = 0
) -> list[ProbedDecision]:
  """Up to `decisions` decisions of `spec`'s msa trajectory that offer more than one legal move,
  drawn uniformly without replacement, each with every legal move's exact advantage. The draw
  depends on `seed` and the program's name only, not on which programs are probed with it."""
  game = make_game(spec.workload, spec.hardware, dataclasses.replace(config, reward="advantage"))
  legal_counts = []
  timestep = game.reset()
  while not timestep.last():
    legal_counts.append(int(timestep.observation["legal_actions"].sum()))
    timestep = game.step(game.msa_action)
  steps = _draw_steps(spec.name, legal_counts, decisions, seed)
  probed = []
  for step in steps:
    observation, advantages, msa_action = one_move_advantages(game, step)
    actions = np.flatnonzero(observation["legal_actions"])
    probed.append(
      ProbedDecision(
        spec.name,
        split,
        step,
        msa_action,
        actions,
        advantages[actions],
        observation,
      )
    )
  return probed


def probe_policy_trajectory(
  spec: GameSpec,
  split: str,
  config: GameConfig,
  decisions: int,
  policy: Policy,
  seed: int = 0,
) -> list[ProbedDecision]:
  """`probe_program` along the trajectory `policy` plays instead of msa's: at a drawn step the
  earlier moves are the policy's, each legal move is played there and msa finishes the program
  (evo-msa's `decode`, the policy's departures before the step as its genome). A move's advantage
  is over msa's move at that step after the same moves (so msa's is 0), in fractions of msa's own
  program time. Why: a policy's departures lead to states msa's trajectory never visits, and a
  prior fitted on msa's states alone loses there over whole games (docs/results/archive.md
  3.20); these are the states to fit it on next (DAgger, Ross et al. 2011)."""
  game = make_game(spec.workload, spec.hardware, dataclasses.replace(config, reward="advantage"))
  moves, msa_moves, observations = [], [], []
  timestep = game.reset()
  while not timestep.last():
    observations.append({k: np.asarray(v) for k, v in timestep.observation.items()})
    msa_moves.append(game.msa_action)
    moves.append(int(policy(timestep.observation)))
    timestep = game.step(moves[-1])
  legal_counts = [int(o["legal_actions"].sum()) for o in observations]
  steps = _draw_steps(spec.name, legal_counts, decisions, seed)
  probed = []
  departures: Genome = {}
  game.reset()
  for step in steps:  # Sorted: the game replays the policy's moves up to each in turn.
    while game.num_steps < step:
      if moves[game.num_steps] != msa_moves[game.num_steps]:
        departures[(game.decision.buffer, game.decision.use)] = moves[game.num_steps]
      game.step(moves[game.num_steps])
    legal = observations[step]["legal_actions"]
    advantages = advantages_after(game, departures, legal, msa_moves[step])
    actions = np.flatnonzero(legal)
    probed.append(
      ProbedDecision(
        spec.name,
        split,
        step,
        msa_moves[step],
        actions,
        advantages[actions],
        observations[step],
      )
    )
  return probed


def save_probed(path: str, probed: Sequence[ProbedDecision]) -> None:
  """Writes decisions to an `.npz` of plain arrays (no pickled objects), `load_probed`'s input:
  the exact advantages cost one msa pass per move, the scores of a new network none."""
  width = max(len(p.actions) for p in probed)
  actions = np.full((len(probed), width), -1, np.int64)
  advantages = np.zeros((len(probed), width), np.float64)
  for i, p in enumerate(probed):
    actions[i, : len(p.actions)] = p.actions
    advantages[i, : len(p.actions)] = p.advantages
  arrays = {
    "program": np.array([p.program for p in probed]),
    "split": np.array([p.split for p in probed]),
    "step": np.array([p.step for p in probed], np.int64),
    "msa_action": np.array([p.msa_action for p in probed], np.int64),
    "actions": actions,
    "advantages": advantages,
  }
  for key, stacked in stack_observations([p.observation for p in probed]).items():
    arrays[f"observation/{key}"] = stacked
  np.savez_compressed(path, **arrays)


def load_probed(path: str) -> list[ProbedDecision]:
  """`save_probed`'s decisions."""
  with np.load(path, allow_pickle=False) as f:
    a = {k: f[k] for k in f.files}
  keys = [k.split("/", 1)[1] for k in a if k.startswith("observation/")]
  probed = []
  for i in range(len(a["step"])):
    legal = a["actions"][i] >= 0
    probed.append(
      ProbedDecision(
        str(a["program"][i]),
        str(a["split"][i]),
        int(a["step"][i]),
        int(a["msa_action"][i]),
        a["actions"][i][legal],
        a["advantages"][i][legal],
        {k: a[f"observation/{k}"][i] for k in keys},
      )
    )
  return probed


def load_probe_store(run: str, config: GameConfig) -> list[ProbedDecision]:
  """The decisions a training run's learner fitted (its probe store, `run`/checkpoints/
  probes.npz, learner/probes/store.py) as training decisions of `config`'s game: program "" and
  step -1 (the store keeps neither), observation fields outside `config`'s dropped.

  Raises MalloczeroError (one line) for a run without probes or a store of another game."""
  from malloczero.configs.workdir import WorkDir
  from malloczero.learner.probes import PROBES_FILENAME

  path = run if run.endswith(".npz") else os.path.join(WorkDir(run).checkpoints, PROBES_FILENAME)
  try:
    with np.load(path, allow_pickle=False) as f:
      arrays = {k: f[k] for k in f.files}
    spec = observation_spec(config)
    observations = {k: arrays[f"observation/{k}"] for k in spec}
    advantages, msa_actions = arrays["advantages"], arrays["msa_actions"]
    if advantages.shape[1:] != (config.num_actions,) or any(
      observations[k].shape[1:] != s.shape for k, s in spec.items()
    ):
      raise ValueError("shapes of another game")
  except (OSError, ValueError, KeyError) as e:
    raise MalloczeroError(f"{path}: not a probe store of this game ({e})") from None
  decisions = []
  for i in range(len(advantages)):
    actions = np.flatnonzero(observations["legal_actions"][i] > 0)
    decisions.append(
      ProbedDecision(
        "",
        "train",
        -1,
        int(msa_actions[i]),
        actions,
        advantages[i][actions].astype(np.float64),
        {k: v[i] for k, v in observations.items()},
      )
    )
  return decisions


def network_scores(
  networks: MuZeroNetworks, params: Params, probed: Sequence[ProbedDecision], batch: int = 64
) -> tuple[np.ndarray, np.ndarray]:
  """(prior logits `[N, A]`, model Q `[N, A]`) of every action at each probed decision."""

  @jax.jit
  def score(params, observation):
    latent = networks.represent(params, observation)  # [B, D]
    prior = networks.predict(params, latent).policy_logits  # [B, A]
    batch_size, num_actions = prior.shape
    actions = jnp.tile(jnp.arange(num_actions), batch_size)  # [B * A]
    next_latent, reward_logits = networks.dynamics(
      params, jnp.repeat(latent, num_actions, axis=0), actions
    )
    value_logits = networks.predict(params, next_latent).value_logits
    q = logits_to_scalar(reward_logits, networks.config) + logits_to_scalar(
      value_logits, networks.config
    )
    return prior, q.reshape(batch_size, num_actions)

  priors, qs = [], []
  for begin in range(0, len(probed), batch):
    chunk = probed[begin : begin + batch]
    padded = list(chunk) + [chunk[-1]] * (batch - len(chunk))  # One compiled shape.
    prior, q = score(params, stack_observations([p.observation for p in padded]))
    priors.append(np.asarray(prior)[: len(chunk)])
    qs.append(np.asarray(q)[: len(chunk)])
  return np.concatenate(priors), np.concatenate(qs)


def _pairwise(scores: np.ndarray, advantages: np.ndarray, min_gap: float) -> tuple[float, int]:
  """(pairs ranked as the advantages rank them, a tie counting half; pairs) over the pairs whose
  advantages are at least `min_gap` apart."""
  ranked = advantages[:, None] - advantages[None, :] >= min_gap
  score_gap = scores[:, None] - scores[None, :]
  agree = np.where(score_gap > 0, 1.0, np.where(score_gap == 0, 0.5, 0.0))
  return float(np.sum(agree * ranked)), int(np.sum(ranked))


def summarise(
  probed: Sequence[ProbedDecision],
  prior: np.ndarray,
  q: np.ndarray,
  min_gap: float = DEFAULT_MIN_GAP,
) -> dict[str, Any]:
  """The network's scores against the exact advantages, over `probed` (one split, say).

  Args:
    probed: the decisions, N of them.
    prior, q: `network_scores` of them, `[N, A]` each.
    min_gap: advantages closer than this are not told apart.

  Returns:
    A dict: `decisions`; `gainful`, the decisions where some move beats msa's by at least
    `min_gap`; `best_gain`, the best move's mean advantage there; `gain_is_option0`, the share
    of those whose best move is action 0 (default memory, the eviction or the uncommit: msa
    allocated where it should not have); `pairs`, the move pairs at least `min_gap` apart, and
    `deviation_pairs`, those without msa's move; `model_error`, the mean |Q - advantage| over
    every legal move, against `advantage_abs`, the mean |advantage|. Then for the prior and the
    model's Q (keys prefixed `prior_` and `model_`): `is_msa`, the share of decisions whose
    argmax is msa's move; `pairwise`, the share of `pairs` ranked as the advantages rank them
    (a tie counts half: 0.5 is chance); `pairwise_deviations`, the same over `deviation_pairs`
    (are the deviations ranked among themselves?); `finds_gain`, the share of the `gainful`
    decisions whose argmax beats msa's by at least `min_gap`; `pick_gain`, the argmax's mean
    advantage there; `pick_elsewhere`, its mean advantage at the other decisions (0 for msa's
    move, below 0 where it leaves msa for nothing)."""
  gainful = np.array([p.advantages.max() >= min_gap for p in probed], bool)  # [N]
  summary: dict[str, Any] = {
    "decisions": len(probed),
    "gainful": int(gainful.sum()),
    "best_gain": _mean([p.advantages.max() for p, g in zip(probed, gainful) if g]),
    "gain_is_option0": _mean(
      [p.actions[np.argmax(p.advantages)] == 0 for p, g in zip(probed, gainful) if g]
    ),
    "pairs": sum(_pairwise(p.advantages, p.advantages, min_gap)[1] for p in probed),
    "deviation_pairs": sum(
      _pairwise(p.advantages[o], p.advantages[o], min_gap)[1]
      for p, o in zip(probed, _deviations(probed))
    ),
    "model_error": _mean(
      np.concatenate([np.abs(v[p.actions] - p.advantages) for p, v in zip(probed, q)])
    ),
    "advantage_abs": _mean(np.concatenate([np.abs(p.advantages) for p in probed])),
  }
  for name, scores in (("prior", prior), ("model", q)):
    picks = [p.advantages[np.argmax(s[p.actions])] for p, s in zip(probed, scores)]
    is_msa = [p.actions[np.argmax(s[p.actions])] == p.msa_action for p, s in zip(probed, scores)]
    ranked = [_pairwise(s[p.actions], p.advantages, min_gap) for p, s in zip(probed, scores)]
    ranked_deviations = [
      _pairwise(s[p.actions][o], p.advantages[o], min_gap)
      for p, s, o in zip(probed, scores, _deviations(probed))
    ]
    summary.update(
      {
        f"{name}_is_msa": _mean(is_msa),
        f"{name}_pairwise": _ratio(ranked),
        f"{name}_pairwise_deviations": _ratio(ranked_deviations),
        f"{name}_finds_gain": _mean([pick >= min_gap for pick, g in zip(picks, gainful) if g]),
        f"{name}_pick_gain": _mean([pick for pick, g in zip(picks, gainful) if g]),
        f"{name}_pick_elsewhere": _mean([pick for pick, g in zip(picks, gainful) if not g]),
      }
    )
  return summary


def _deviations(probed: Sequence[ProbedDecision]) -> list[np.ndarray]:
  """Per decision, `[n]` True for the legal moves that are not msa's."""
  return [p.actions != p.msa_action for p in probed]


def _mean(values: Any) -> float:
  values = np.asarray(values, np.float64)
  return float(values.mean()) if values.size else float("nan")


def _ratio(counts: Sequence[tuple[float, int]]) -> float:
  """(agreeing, total) pairs summed over decisions -> their share."""
  total = sum(n for _, n in counts)
  return sum(a for a, _ in counts) / total if total else float("nan")
