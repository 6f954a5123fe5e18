"""What a run trains on and what it is measured on: a training suite (a corpus) apart from the
report suite whose splits the figures use, a bound on the demonstrations kept, and a bound on the
games an actor keeps built."""

import dataclasses

import pytest

from malloczero.actors.games import (
  GamePool,
  demonstration_specs,
  program_specs,
  suite_games,
  training_specs,
)
from malloczero.common.errors import MalloczeroError
from malloczero.configs.config import get_config, with_section
from malloczero.env.game.cache import BuiltGames
from malloczero.env.programs.suites import get_suite
from malloczero.learner.demonstrations import Demonstrations
from malloczero.system.training import preflight


def _names(specs) -> list[str]:
  return [s.name for s in specs]


def test_a_run_trains_on_its_suite_and_is_measured_on_its_report_suite():
  config = dataclasses.replace(get_config("tiny"), suite="tiny", report_suite="default")
  assert config.measured_suite == "default"
  trained = _names(training_specs(config))
  assert trained == [e.name for e in get_suite("tiny").split("train").entries]
  for split in ("train", "heldout"):
    assert _names(program_specs(config, split)) == [
      e.name for e in get_suite("default").split(split).entries
    ]
  # Without a report suite both are the training suite's.
  plain = get_config("tiny")
  assert plain.measured_suite == "tiny"
  assert _names(program_specs(plain, "heldout")) == _names(suite_games("tiny", "heldout"))


def test_a_report_suite_lacking_a_split_or_a_corpus_unreported_is_refused_first(tmp_path):
  config = dataclasses.replace(get_config("tiny"), report_suite="foreign")
  with pytest.raises(MalloczeroError, match="evaluation only"):
    preflight(config, str(tmp_path / "run"), 100)
  with pytest.raises(MalloczeroError, match="unknown suite 'nope'"):
    preflight(dataclasses.replace(config, report_suite="nope"), str(tmp_path / "run"), 100)
  with pytest.raises(MalloczeroError, match="'corpus' is for training only"):
    preflight(dataclasses.replace(config, report_suite="corpus"), str(tmp_path / "run"), 100)
  corpus = dataclasses.replace(config, suite="corpus", report_suite="")
  with pytest.raises(MalloczeroError, match="--set report_suite=default"):
    preflight(corpus, str(tmp_path / "run"), 100)
  preflight(dataclasses.replace(corpus, report_suite="tiny"), str(tmp_path / "run"), 100)
  assert not (tmp_path / "run").exists()


def test_demonstrations_keep_the_reported_training_programs_first_then_a_seeded_draw():
  config = dataclasses.replace(get_config("tiny"), suite="default", report_suite="tiny")
  specs = suite_games("default", "train")[:12] + suite_games("tiny", "train")
  assert demonstration_specs(config, specs) == specs  # 0: every program.
  capped = with_section(config, "learner", demonstration_programs=6)
  kept = demonstration_specs(capped, specs)
  reported = _names(suite_games("tiny", "train"))
  assert _names(kept[: len(reported)]) == reported and len(kept) == 6
  assert kept == demonstration_specs(capped, specs)  # The same run: the same programs.
  other = demonstration_specs(dataclasses.replace(capped, seed=capped.seed + 1), specs)
  assert {s.name for s in other[len(reported) :]} != {s.name for s in kept[len(reported) :]}
  store = Demonstrations(kept, config.game, config.learner.sequence_length)
  assert store.holds(kept[-1].name) and not store.holds(
    next(s.name for s in specs if s not in kept)
  )


def test_built_games_keep_at_most_their_capacity_the_least_recent_dropped():
  built = []
  games = BuiltGames(2)

  def build(key):
    built.append(key)
    return object()

  a = games.get("a", lambda: build("a"))
  games.get("b", lambda: build("b"))
  assert games.get("a", lambda: build("a")) is a  # Kept, and now the most recent.
  games.get("c", lambda: build("c"))  # Drops b.
  assert len(games) == 2 and games.get("a", lambda: build("a")) is a
  games.get("b", lambda: build("b"))
  assert built == ["a", "b", "c", "b"] and games.num_built == 4
  unbounded = BuiltGames(0)
  for key in range(50):
    unbounded.get(key, object)
  assert len(unbounded) == 50


def test_a_game_pool_with_a_bound_rebuilds_what_it_dropped_and_plays_the_same_programs():
  config = get_config("tiny")
  specs = suite_games("tiny", "train")
  pool = GamePool(specs, config.game, num_slots=1, seed=0, cached_games=1)
  first = pool.game(0, 0)
  assert pool.game(0, 0) is first
  pool.game(0, 1)
  again = pool.game(0, 0)
  assert again is not first and again.workload is first.workload
