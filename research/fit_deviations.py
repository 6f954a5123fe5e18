"""Can the network's observation tell which deviations from msa pay? A supervised test.

Fits the project's network (its representation and policy head), by supervision alone, to the
exact advantages of the training programs' probed decisions (`scripts/score_deviations.py
--save`), then scores its prior on the held-out programs' decisions with
`research/deviation_scores.py`'s summary. The target at a decision is softmax(advantage /
temperature) over its legal moves, msa's move's advantage raised by `--msa-margin`: msa's move
where nothing pays, the gainful move where one does. Why: trained agents put msa's move first at
every probed decision and rank the deviations among themselves at chance, on training programs
too (docs/results/archive.md 3.19); a network fitted directly to exact advantages tells
whether the observation can express which deviations pay, apart from the reinforcement-learning
signal.
`--save-checkpoint` writes the fitted network where `malloczero evaluate` plays it.

  .venv/bin/python scripts/fit_deviations.py --probed probed.npz --checkpoint runs/a
  .venv/bin/python scripts/fit_deviations.py --probed probed.npz on.npz --checkpoint runs/a
  .venv/bin/python scripts/fit_deviations.py --probed heldout.npz --stores runs/a runs/b \
      --checkpoint runs/a --train-decisions 1000 --network d_model=64

`--stores` adds training runs' probe stores (their `checkpoints/probes.npz`, the decisions the
learner fitted) as training decisions, and `--train-decisions N` fits a random N of all the
training decisions: with `--network FIELD=VALUE` (a wider or deeper network than the
checkpoint's), the measurements of whether held-out play is limited by the data or the
network's capacity. Each row reports the loss's floor, the targets' own entropy, beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from collections.abc import Sequence
from typing import Any


def with_fields(config: Any, settings: Sequence[str], flag: str = "network") -> Any:
  """The config `config` (a network's or a game's) with `settings` ("FIELD=VALUE", `train --set
  network.FIELD`'s values) applied; ValueError (one line, naming `--flag`) names a field or value
  it refuses."""
  from malloczero.common.settings import is_setting, parse_setting

  example = {"network": "d_model=64", "game": "pressure_bins=8"}.get(flag, "FIELD=VALUE")
  fields = {f.name: f for f in dataclasses.fields(config) if is_setting(f)}
  values = {}
  for text in settings:
    name, sep, value = text.partition("=")
    if not sep:
      raise ValueError(f"--{flag} {text}: expected FIELD=VALUE, e.g. {example}")
    if name not in fields:
      raise ValueError(f"--{flag} {text}: no field '{name}' in {flag}; valid: {', '.join(fields)}")
    try:
      values[name] = parse_setting(fields[name], value)
    except ValueError as e:
      raise ValueError(f"--{flag} {text}: {e}") from None
  return dataclasses.replace(config, **values)


def target_entropy(decisions: Sequence[Any], temperature: float, msa_margin: float) -> float:
  """The mean entropy (nats) of the decisions' policy targets, the learner's own
  (`advantage_targets`): the least cross-entropy any network can reach on them, so loss - floor
  is what is left to fit."""
  import jax.numpy as jnp
  import numpy as np

  from malloczero.learner.probes import advantage_targets

  width = 1 + max(int(p.actions.max()) for p in decisions)
  advantages = np.zeros((len(decisions), width), np.float64)
  legal = np.zeros((len(decisions), width), bool)
  for i, p in enumerate(decisions):
    advantages[i, p.actions], legal[i, p.actions] = p.advantages, True
  msa_actions = np.array([p.msa_action for p in decisions])
  targets = advantage_targets(advantages, legal, temperature, msa_actions, msa_margin)
  entropies = -jnp.sum(jnp.where(targets > 0, targets * jnp.log(targets), 0.0), axis=-1)
  return float(entropies.mean())


def main(argv: Sequence[str] | None = None) -> int:
  """The command (`scripts/fit_deviations.py`): parses `argv` (default: sys.argv), prints the
  table; returns the exit status."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--probed", nargs="+", required=True, help="decisions from score_deviations --save"
  )
  parser.add_argument(
    "--stores",
    nargs="+",
    default=[],
    metavar="RUN",
    help="training runs whose probe stores (checkpoints/probes.npz) add training decisions",
  )
  parser.add_argument(
    "--train-decisions",
    type=int,
    metavar="N",
    help="fit a random N of the training decisions (default: all of them)",
  )
  parser.add_argument(
    "--network",
    nargs="+",
    default=[],
    metavar="FIELD=VALUE",
    help="fit a network of the checkpoint's config with these fields changed (e.g. d_model=64)",
  )
  parser.add_argument(
    "--game",
    nargs="+",
    default=[],
    metavar="FIELD=VALUE",
    help="fit for the checkpoint's game with these fields changed: decisions observed in it "
    "(rollout_oracle.py --replay --game), e.g. pressure_bins=8",
  )
  parser.add_argument("--checkpoint", required=True, help="whose network and game configs")
  parser.add_argument("--init", choices=("fresh", "checkpoint"), default="fresh")
  parser.add_argument("--steps", type=int, default=3000)
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--learning-rate", type=float, default=1e-3)
  parser.add_argument("--temperature", type=float, default=1e-3)
  parser.add_argument(
    "--msa-margin",
    type=float,
    default=0.0,
    help="added to msa's move's advantage in the targets: deviate only where a move beats msa's "
    "by more (a whole game makes hundreds of decisions, and small losses add up)",
  )
  parser.add_argument("--report-every", type=int, default=500)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", help="write the rows as JSON here")
  parser.add_argument(
    "--save-checkpoint",
    metavar="DIR",
    help="write the fitted network as a run's work directory (DIR/checkpoints/, the source "
    "run's config.json) for `malloczero evaluate --checkpoint DIR`",
  )
  args = parser.parse_args(argv)
  if min(args.steps, args.batch, args.report_every) < 1 or args.temperature <= 0:
    parser.error("--steps, --batch, --report-every and --temperature must be positive")
  if args.msa_margin < 0:
    parser.error("--msa-margin must be at least 0")
  if args.train_decisions is not None and args.train_decisions < 1:
    parser.error("--train-decisions must be at least 1")
  if (args.network or args.game) and args.save_checkpoint:
    parser.error(
      "--save-checkpoint writes the checkpoint's own configs: not with --network or --game"
    )

  import jax
  import numpy as np
  import optax

  from malloczero.actors.actor import stack_observations
  from malloczero.actors.agent import load_agent
  from malloczero.common.errors import MalloczeroError
  from malloczero.configs.workdir import WorkDir
  from malloczero.env.game.config import observation_spec
  from malloczero.learner.checkpoint import replace_params
  from malloczero.learner.networks import make_networks
  from malloczero.learner.probes import probe_policy_loss
  from malloczero.research import deviation_scores as probe

  try:
    agent = load_agent(args.checkpoint)
    probed = [p for path in args.probed for p in probe.load_probed(path)]
    probed += [p for run in args.stores for p in probe.load_probe_store(run, agent.game)]
    networks, game = agent.networks, with_fields(agent.game, args.game, "game")
    if args.network or args.game:
      networks = make_networks(with_fields(agent.networks.config, args.network), game)
    expected = set(observation_spec(game))
    for p in probed:
      if set(p.observation) != expected:
        raise ValueError(
          f"{p.program}: decision {p.step} is observed with {sorted(p.observation)}; this "
          f"game's observation has {sorted(expected)} (--game changes the game's)"
        )
  except (MalloczeroError, OSError, ValueError, KeyError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  train = [p for p in probed if p.split == "train"]
  heldout = [p for p in probed if p.split == "heldout"]
  if not train or not heldout:
    print(f"error: {' '.join(args.probed)}: decisions of both splits are needed", file=sys.stderr)
    return 2
  if args.train_decisions is not None:
    if args.train_decisions > len(train):
      print(
        f"error: --train-decisions {args.train_decisions}: only {len(train)} training decisions",
        file=sys.stderr,
      )
      return 2
    chosen = np.random.default_rng(args.seed).permutation(len(train))[: args.train_decisions]
    train = [train[i] for i in sorted(chosen)]
  num_actions = game.num_actions

  def advantages(decisions):
    """`[N, A]` each legal move's exact advantage (0 at illegal slots, which the observations'
    legal masks exclude from the targets) and `[N]` msa's moves."""
    table = np.zeros((len(decisions), num_actions), np.float32)
    for i, p in enumerate(decisions):
      table[i, p.actions] = p.advantages
    return table, np.asarray([p.msa_action for p in decisions], np.int32)

  observations = stack_observations([p.observation for p in train])
  train_advantages, train_msa_actions = advantages(train)

  def loss_fn(params, observation, advantage, msa_actions):
    return probe_policy_loss(
      networks, params, observation, advantage, msa_actions, args.temperature, args.msa_margin
    )[0]

  optimiser = optax.adam(args.learning_rate)
  mean_loss = jax.jit(loss_fn)

  def split_loss(params, decisions, chunk=256):
    """The loss over all of `decisions` (in chunks: the encoder's activations are large)."""
    total = 0.0
    for begin in range(0, len(decisions), chunk):
      part = decisions[begin : begin + chunk]
      observation = stack_observations([p.observation for p in part])
      total += len(part) * float(mean_loss(params, observation, *advantages(part)))
    return total / len(decisions)

  @jax.jit
  def update(params, opt_state, observation, advantage, msa_actions):
    loss, grads = jax.value_and_grad(loss_fn)(params, observation, advantage, msa_actions)
    updates, opt_state = optimiser.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  if args.init == "checkpoint":
    params = agent.params
  else:
    first = {k: v[:1] for k, v in observations.items()}
    params = networks.init(jax.random.PRNGKey(args.seed), first)
  opt_state = optimiser.init(params)
  rng = np.random.default_rng(args.seed)
  rows, started = [], time.perf_counter()

  def report(step):
    for split, decisions in (("train", train), ("heldout", heldout)):
      loss = split_loss(params, decisions)
      prior, _ = probe.network_scores(networks, params, decisions)
      summary = probe.summarise(decisions, prior, prior)
      floor = target_entropy(decisions, args.temperature, args.msa_margin)
      rows.append({"step": step, "split": split, "loss": loss, "floor": floor, **summary})
      print(
        f"step {step:5d} {split:7s} loss {loss:.4f} (floor {floor:.4f}) prior: is_msa "
        f"{summary['prior_is_msa']:.3f} "
        f"pairwise {summary['prior_pairwise']:.3f} deviations "
        f"{summary['prior_pairwise_deviations']:.3f} finds_gain {summary['prior_finds_gain']:.3f}"
        f" pick_gain {summary['prior_pick_gain']:.4f} elsewhere "
        f"{summary['prior_pick_elsewhere']:.5f} ({time.perf_counter() - started:.0f} s)",
        flush=True,
      )

  report(0)
  for step in range(1, args.steps + 1):
    index = rng.integers(len(train), size=args.batch)
    batch = {k: v[index] for k, v in observations.items()}
    params, opt_state, _ = update(
      params, opt_state, batch, train_advantages[index], train_msa_actions[index]
    )
    if step % args.report_every == 0 or step == args.steps:
      report(step)
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump({"args": vars(args), "rows": rows}, f, indent=1)
  if args.save_checkpoint:
    target = WorkDir(args.save_checkpoint)
    replace_params(agent.checkpoint, target.learner_state, params)
    if agent.config_file is not None:
      shutil.copyfile(agent.config_file, target.config)
    print(f"fitted network: {target.learner_state}")
  return 0
