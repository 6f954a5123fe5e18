"""`train --set PATH=VALUE` reaches every settable field of every preset, refuses a wrong path or
value in one line, and the aliases and the older spellings set the same fields; a saved config of
the older layout still resumes."""

import dataclasses
import json

import pytest

from malloczero.common.settings import is_setting, shown
from malloczero.configs.config import PRESETS, Config, get_config
from malloczero.launch import cli
from malloczero.launch.commands.train import train_config
from malloczero.launch.config_flags import (
  ALIASES,
  DEPRECATED,
  NOT_SETTABLE,
  sections,
  settable_fields,
)

# A field that needs others changed with it in some preset (short games need the msa game's
# "advantage" reward; probes and self-imitation need the msa game).
COMPANIONS = {
  "game.decisions": (
    "game.reward=time",
    "actor.segment_moves=0",
    "actor.imitate_gains_only=off",
    "probes.share=0",
  ),
  "game.reward": ("actor.segment_moves=0",),
  "actor.segment_moves": ("game.reward=advantage",),
}


def _config(*args: str) -> Config:
  return train_config(cli.build_parser().parse_args(["train", *args]))


def _value(config: Config, path: str):
  section, _, name = path.rpartition(".")
  return getattr(getattr(config, section) if section else config, name)


def _other_value(field: dataclasses.Field, value):
  """A valid value of `field` other than `value`."""
  choices = field.metadata["choices"]
  if choices:
    return next(c for c in choices if c != value)
  return {
    "positive_int": lambda: value + 1,
    "non_negative_int": lambda: value + 1,
    "seed": lambda: value + 1,
    "positive": lambda: value * 2,
    "non_negative": lambda: value + 0.5,
    "fraction": lambda: 0.5 if value != 0.5 else 0.25,
    "probability": lambda: 0.5 if value != 0.5 else 0.25,
    "switch": lambda: not value,
    "text": lambda: "tiny" if value != "tiny" else "default",
    "unit_fractions": lambda: (0.25, 0.5) if value != (0.25, 0.5) else (),
  }[field.metadata["check"]]()


def _exit_code_and_stderr(capsys, argv):
  try:
    code = cli.main(argv)
  except SystemExit as e:
    code = e.code
  captured = capsys.readouterr()
  return code, captured.err


def test_every_field_is_settable_a_section_or_set_by_another_flag():
  for field in dataclasses.fields(Config):
    assert is_setting(field) or field.name in sections() or field.name in NOT_SETTABLE, field.name
  for section in sections():
    for field in dataclasses.fields(getattr(Config(), section)):
      assert is_setting(field), f"{section}.{field.name} declares no check and help"
      assert f"{section}.{field.name}" in settable_fields()
  assert set(sections()) == {
    "game",
    "network",
    "search",
    "learner",
    "replay",
    "actor",
    "probes",
    "proposer",
    "distributed",
  }


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_field_of_every_preset_is_reached_by_its_path(preset):
  defaults = get_config(preset)
  for path, field in settable_fields().items():
    wanted = _other_value(field, _value(defaults, path))
    sets = [f"--set={companion}" for companion in COMPANIONS.get(path, ())]
    config = _config("--config", preset, *sets, "--set", f"{path}={shown(wanted)}")
    assert _value(config, path) == wanted, path
    assert type(_value(config, path)) is type(_value(defaults, path)), path
    # The field alone changed (and its companions).
    touched = {path, *(companion.partition("=")[0] for companion in COMPANIONS.get(path, ()))}
    for other in settable_fields():
      if other not in touched:
        assert _value(config, other) == _value(defaults, other), (path, other)


@pytest.mark.parametrize(
  "setting, message",
  [
    (
      "learner.demo=1",
      "--set learner.demo=1: no field 'demo' in learner; valid: batch_size, unroll_steps,",
    ),
    ("lerner.batch_size=1", "no section 'lerner' in the config; valid: game, network, search,"),
    (
      "speed=1",
      "no field 'speed' in the config; valid: suite, report_suite, seed, max_learner_steps,",
    ),
    ("learner=1", "'learner' is a section: name one of its fields, e.g. learner.batch_size"),
    ("programs=x", "'programs' is set by --workload, not --set"),
    ("name=x", "'name' is set by --config, not --set"),
    ("learner.batch_size", "expected PATH=VALUE"),
    ("learner.batch_size.x=1", "no field 'batch_size.x' in learner"),
  ],
)
def test_a_wrong_path_is_one_line_naming_the_valid_ones(capsys, setting, message):
  code, err = _exit_code_and_stderr(capsys, ["train", "--set", setting, "--workdir", "unused"])
  assert code == 2 and err.count("\n") == 1 and err.startswith("malloczero: error: --set "), err
  assert message in err, err


@pytest.mark.parametrize(
  "setting, message",
  [
    (
      "learner.batch_size=x",
      "learner.batch_size: expected a positive integer at most 65,536, got 'x'",
    ),
    (
      "learner.batch_size=0",
      "learner.batch_size: expected a positive integer at most 65,536, got '0'",
    ),
    (
      "learner.batch_size=2.5",
      "learner.batch_size: expected a positive integer at most 65,536, got '2.5'",
    ),
    # Every count has a bound, so that no setting allocates without one.
    ("learner.batch_size=65537", "at most 65,536, got '65537'"),
    (
      "actor.num_games=1000000000000",
      "actor.num_games: expected a positive integer at most 65,536",
    ),
    (
      "search.num_simulations=1025",
      "search.num_simulations: expected an integer >= 0 at most 1,024",
    ),
    ("network.hidden_dim=8193", "network.hidden_dim: expected a positive integer at most 8,192"),
    ("game.num_candidates=1025", "game.num_candidates: expected a positive integer at most 1,024"),
    (
      "replay.max_size=1000000001",
      "replay.max_size: expected a positive integer at most 1,000,000,000",
    ),
    (
      "max_learner_steps=10**12",
      "max_learner_steps: expected a positive integer at most 1,000,000,000",
    ),
    (
      "learner.demonstration_fraction=1",
      "learner.demonstration_fraction: expected a fraction in [0, 1), got '1'",
    ),
    ("search.q_spread_floor=inf", "search.q_spread_floor: expected a finite number >= 0"),
    ("seed=-1", "seed: expected an integer seed between 0 and 2**31-1"),
    ("game.reward=fast", "game.reward: expected one of advantage, time, got 'fast'"),
    (
      "actor.imitate_gains_only=maybe",
      "actor.imitate_gains_only: expected on, off, true or false, got 'maybe'",
    ),
    ("capacity_variants=0.5,0.5", "capacity_variants: expected fractions in (0, 1], each once"),
    ("capacity_variants=0.5,2", "capacity_variants: expected fractions in (0, 1], each once"),
  ],
)
def test_a_wrong_or_out_of_range_value_is_one_line_naming_the_field_and_range(
  capsys, setting, message
):
  code, err = _exit_code_and_stderr(capsys, ["train", "--set", setting, "--workdir", "unused"])
  assert code == 2 and err.count("\n") == 1 and err.startswith("malloczero: error: --set "), err
  assert message in err, err


def test_values_that_contradict_each_other_are_one_flag_error(capsys):
  code, err = _exit_code_and_stderr(
    capsys, ["train", "--set", "game.reward=time", "--workdir", "unused"]
  )
  assert code == 2 and err.count("\n") == 1 and "set segment_moves to 0" in err, err
  for empty in (["--set", "suite="], ["--suite", ""]):
    code, err = _exit_code_and_stderr(capsys, ["train", *empty, "--workdir", "unused"])
    assert code == 2 and err.count("\n") == 1 and "name a suite or a workload" in err, err
  # Together with the field that needs changing too, in any order, it is accepted: fields are
  # applied at once, not one at a time.
  for order in (("game.reward=time", "actor.segment_moves=0"), ("actor.segment_moves=0",) * 2):
    config = _config("--set", order[0], "--set", order[1], "--set", "game.reward=time")
    assert config.game.reward == "time" and config.actor.segment_moves == 0


def test_each_alias_sets_its_field():
  parser = cli.build_parser()
  assert [flags for flags, _, _ in ALIASES] == [
    ("--seed",),
    ("--suite",),
    ("--num-actors",),
    ("--max-learner-steps", "--max-steps"),
  ]
  config = _config("--seed", "3", "--suite", "tiny", "--num-actors", "3", "--max-steps", "7")
  assert (config.seed, config.suite, config.distributed.num_actors) == (3, "tiny", 3)
  assert config.max_learner_steps == 7
  assert _config("--max-learner-steps", "9").max_learner_steps == 9
  # Run options that are not config fields.
  args = parser.parse_args(["train", "--max-seconds", "5", "--workdir", "runs/x"])
  assert args.max_seconds == 5.0 and args.workdir == "runs/x"
  assert _config() == get_config("small")


# Each older spelling, the path it sets and a value: the same field as before the paths (the
# probe settings then lived in `actor` and `learner`).
OLD_SPELLINGS = {
  "--eval-every": ("eval_every_steps", "250", 250),
  "--select-checkpoints": ("select_checkpoints", "3", 3),
  "--capacity-variants": ("capacity_variants", "0.1,0.5", (0.1, 0.5)),
  "--reward": ("game.reward", "time", "time"),
  "--skip-below": ("game.skip_below", "0.001", 0.001),
  "--segment-moves": ("actor.segment_moves", "32", 32),
  "--imitate-gains-only": ("actor.imitate_gains_only", "off", False),
  "--demonstrations": ("learner.demonstration_fraction", "0", 0.0),
  "--demonstration-departures": ("learner.demonstration_departures", "1", 1.0),
  "--reanalyse": ("learner.reanalyse_fraction", "0.5", 0.5),
  "--policy-loss-weight": ("learner.policy_loss_weight", "0.5", 0.5),
  "--lr-decay-steps": ("learner.decay_steps", "5000", 5000),
  "--probes": ("probes.share", "0.3", 0.3),
  "--probes-on-policy": ("probes.on_policy", "0.5", 0.5),
  "--probe-batch": ("probes.batch", "16", 16),
  "--probe-msa-margin": ("probes.msa_margin", "0.002", 0.002),
  "--q-spread-floor": ("search.q_spread_floor", "0.3", 0.3),
  "--eval-q-spread-floor": ("search.eval_q_spread_floor", "0.2", 0.2),
  "--eval-msa-prior": ("search.eval_msa_prior_logit", "1", 1.0),
}


@pytest.mark.parametrize("flag", sorted(OLD_SPELLINGS))
def test_each_older_spelling_sets_the_same_field_with_a_note(capsys, flag):
  path, text, value = OLD_SPELLINGS[flag]
  assert DEPRECATED[flag] == path
  extra = ("--set", "actor.segment_moves=0") if flag == "--reward" else ()
  old = _config(*extra, flag, text)
  note = capsys.readouterr().err
  assert note == f"malloczero: note: {flag} is deprecated; use --set {path}={text}\n", note
  assert _value(old, path) == value
  assert old == _config(*extra, "--set", f"{path}={text}")
  assert capsys.readouterr().err == ""  # --set itself says nothing.


def test_every_older_spelling_is_listed_in_the_help(capsys):
  assert set(DEPRECATED) == set(OLD_SPELLINGS)
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["train", "--help"])
  help = capsys.readouterr().out
  assert exit_info.value.code == 0
  listed = help.split("older spellings, still accepted this release with a note on stderr:\n")[1]
  assert [line.split() for line in listed.splitlines()] == [
    [flag, "--set", f"{path}=..."] for flag, path in DEPRECATED.items()
  ]
  out = " ".join(help.split())  # The help's lines rewrapped.
  for flags, path, _ in ALIASES:
    assert flags[0] in out and f"--set {path};" in out
  assert "--set PATH=VALUE" in out and "--list-config" in out


def test_flags_and_set_apply_in_command_line_order():
  assert _config("--seed", "2", "--set", "seed=1").seed == 1
  assert _config("--set", "seed=1", "--seed", "2").seed == 2
  assert _config("--set", "seed=1", "--set", "seed=4").seed == 4
  fraction = "learner.demonstration_fraction"
  assert (
    _config("--demonstrations", "0.1", "--set", f"{fraction}=0.2").learner.demonstration_fraction
    == 0.2
  )
  assert (
    _config("--set", f"{fraction}=0.2", "--demonstrations", "0.1").learner.demonstration_fraction
    == 0.1
  )
  # Fields of one section set by several flags are all kept.
  both = _config("--set", "probes.share=0.3", "--probe-batch", "8")
  assert (both.probes.share, both.probes.batch) == (0.3, 8)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_list_config_shows_every_path_with_the_presets_value(capsys, preset):
  assert cli.main(["train", "--config", preset, "--list-config"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == f"config '{preset}': malloczero train --set PATH=VALUE"
  rows = {line.split()[0]: line.split()[1] for line in lines[1:]}
  defaults = get_config(preset)
  assert list(rows) == list(settable_fields())
  for path in settable_fields():
    assert rows[path] == (shown(_value(defaults, path)) or "''"), path
  # After --set, the value set.
  assert cli.main(["train", "--config", preset, "--set", "seed=9", "--list-config"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert {line.split()[0]: line.split()[1] for line in lines[1:]}["seed"] == "9"


def test_a_work_directory_of_the_older_layout_still_resumes(tmp_path):
  """config.json of a run from before the `probes` section (probe settings in `actor` and
  `learner`) still passes the resume check and gives its search settings."""
  from malloczero.actors.agent import read_search_config
  from malloczero.system.training import check_workdir

  config = get_config("small")
  old = json.loads(json.dumps(dataclasses.asdict(config)))
  del old["probes"]
  old["actor"].update(probe_share=0.6, probe_on_policy=0.0)
  old["learner"].update(
    probe_batch=64,
    probe_temperature=1e-3,
    probe_msa_margin=1e-3,
    probe_loss_weight=1.0,
    probe_capacity=20_000,
  )
  (tmp_path / "config.json").write_text(json.dumps(old))
  assert check_workdir(config, str(tmp_path)) is None
  assert read_search_config(str(tmp_path / "config.json")) == config.search


def test_train_skip_below_reaches_the_game_config():
  from malloczero.launch.cli import build_parser
  from malloczero.launch.commands.train import train_config

  args = build_parser().parse_args(["train", "--config", "tiny", "--set", "game.skip_below=0.001"])
  assert train_config(args).game.skip_below == 0.001
  args = build_parser().parse_args(["train", "--config", "tiny"])
  assert train_config(args).game.skip_below == 0.0


def test_train_demonstration_and_search_flags_reach_the_config():
  from malloczero.launch.cli import build_parser
  from malloczero.launch.commands.train import train_config

  args = build_parser().parse_args(
    [
      "train",
      "--config",
      "tiny",
      "--set",
      "learner.demonstration_fraction=0",
      "--set",
      "search.q_spread_floor=0.3",
      "--set",
      "search.eval_q_spread_floor=0.2",
      "--set",
      "search.eval_msa_prior_logit=0",
      "--set",
      "learner.demonstration_departures=1",
      "--set",
      "learner.reanalyse_fraction=0.5",
      "--set",
      "learner.decay_steps=5000",
    ]
  )
  config = train_config(args)
  assert config.learner.decay_steps == 5000
  # tiny: 32 items a batch, all from replay with no demonstrations; half of them reanalysed.
  assert config.learner.reanalyse_fraction == 0.5 and config.learner.reanalyse_batch == 16
  assert config.learner.demonstration_fraction == 0.0 and config.learner.demonstration_batch == 0
  assert config.learner.demonstration_departures == 1.0
  assert config.search.q_spread_floor == 0.3 and config.search.eval_msa_prior_logit == 0.0
  assert config.search.eval_q_spread_floor == 0.2
  default = train_config(build_parser().parse_args(["train"]))  # The small preset.
  assert default.capacity_variants == () and default.learner.decay_steps == 10_000
  varied = train_config(build_parser().parse_args(["train", "--set", "capacity_variants=0.1,0.5"]))
  assert varied.capacity_variants == (0.1, 0.5)
  assert default.learner.demonstration_fraction == 0.25 and default.search.q_spread_floor == 0.01
  assert default.search.eval_msa_prior_logit == 0.0 and default.learner.reanalyse_batch == 0
  assert default.search.eval_q_spread_floor == 0.1
  assert default.game.reward == "advantage" and default.actor.segment_moves == 64
  timed = train_config(
    build_parser().parse_args(
      ["train", "--set", "game.reward=time", "--set", "actor.segment_moves=0"]
    )
  )
  assert timed.game.reward == "time" and timed.actor.segment_moves == 0
  assert default.actor.imitate_gains_only
  whole = train_config(
    build_parser().parse_args(["train", "--set", "actor.imitate_gains_only=off"])
  )
  assert not whole.actor.imitate_gains_only and whole.actor.segment_moves == 64


def test_imitate_gains_only_takes_on_or_off_in_one_line(capsys):
  from malloczero.launch import cli

  with pytest.raises(SystemExit) as exit_info:
    cli.main(["train", "--set", "actor.imitate_gains_only=yes", "--workdir", "unused"])
  err = capsys.readouterr().err.strip().splitlines()
  assert (
    exit_info.value.code == 2
    and len(err) == 1
    and "expected on, off, true or false, got 'yes'" in err[0]
  ), err


def test_short_games_with_the_time_reward_are_a_flag_error(capsys):
  from malloczero.launch import cli

  code = cli.main(["train", "--set", "game.reward=time", "--workdir", "unused"])
  err = capsys.readouterr().err.strip()
  assert code == 2 and len(err.splitlines()) == 1 and "segment_moves to 0" in err, err
