"""The `malloczero` command line.

Every user error (bad files, impossible hardware, wrong flags) ends in one line on stderr,
`malloczero: error: ...`, and a non-zero exit status; never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Callable, Optional, Sequence

from rich.console import Console
from rich.table import Table

from malloczero.configs.config import DEFAULT_ATTEMPTS
from malloczero.configs.config import PRESETS as CONFIG_PRESETS
from malloczero.common.errors import MalloczeroError
from malloczero.common.files import check_output_dir, check_output_file
from malloczero.env.hardware import PRESETS, Hardware, load_hardware
from malloczero.env.mapping import load_mapping
from malloczero.env.programs.suites import SPLITS
from malloczero.env.solvers import SOLVERS
from malloczero.env.solvers.cpsat import DEFAULT_TIME_LIMIT_S, DEFAULT_WORKERS
from malloczero.env.solvers.evo import DEFAULT_EVALUATIONS
from malloczero.env.validator import validate_mapping
from malloczero.env.workload import Workload, load_workload

EXIT_INPUT_ERROR = 1


def console(stderr: bool = False) -> Console:
  """Wide tables when output goes to a file or a pipe (rich would assume 80 columns)."""
  stream = sys.stderr if stderr else sys.stdout
  return Console(stderr=stderr, width=None if stream.isatty() else 240)


def human_bytes(n: float) -> str:
  for unit in ("B", "KiB", "MiB", "GiB"):
    if abs(n) < 1024 or unit == "GiB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
    n /= 1024


class _Parser(argparse.ArgumentParser):
  def error(self, message: str) -> None:  # One line, exit 2, as argparse does, minus the usage dump.
    sys.stderr.write(f"malloczero: error: {message} (see 'malloczero {self.prog.split()[-1]} --help')\n"
                     if " " in self.prog else f"malloczero: error: {message}\n")
    sys.exit(2)


def _positive_int(text: str) -> int:
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
  if value <= 0:
    raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
  return value


def _name_value(text: str) -> tuple[str, str]:
  name, sep, value = text.partition("=")
  if not sep or not name or not value:
    raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got '{text}'")
  return name, value


def _capacity(text: str) -> tuple[Optional[str], int]:
  """`BYTES` (the fast levels together) or `LEVEL=BYTES` (one fast level)."""
  level, sep, value = text.rpartition("=")
  if sep and not level:
    raise argparse.ArgumentTypeError(f"expected BYTES or LEVEL=BYTES, got '{text}'")
  return (level if sep else None), _positive_int(value)


# The seeds' consumers: numpy's default_rng takes no negative seed, CP-SAT's random_seed is an int32
# and jax.random.PRNGKey an int64; derived seeds (seed + 7919 x actor) stay within the last two.
MAX_SEED = 2**31 - 1


def _seed(text: str) -> int:
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected an integer seed, got '{text}'") from None
  if not 0 <= value <= MAX_SEED:
    raise argparse.ArgumentTypeError(f"the seed must be between 0 and 2**31-1 ({MAX_SEED}), "
                                     f"got {value}")
  return value


def resolve_hardware(workload: Workload, hardware: str | None,
                     capacities: Sequence[tuple[Optional[str], int]] | None,
                     fallback: Hardware | None = None) -> Hardware:
  """--hardware (preset or file), else `fallback` (a mapping's recorded hardware); --capacity
  overrides fast sizes (see `apply_capacities`). A workload file records no hardware, so it needs
  one of those; a MiniMalloc CSV (bytes and lifetimes only) defaults to the 'minimalloc' machine,
  which needs --capacity."""
  capacities = list(capacities or ())
  if hardware is not None:
    hw = load_hardware(hardware)
  elif fallback is not None:
    hw = fallback
  elif workload.source == "minimalloc-csv":
    if not capacities:
      raise MalloczeroError("a MiniMalloc CSV needs --capacity BYTES (the fast memory size)")
    hw = PRESETS["minimalloc"]
  else:
    presets = f"--hardware ({', '.join(PRESETS)} or a hardware JSON file)"
    raise MalloczeroError(
        f"a workload file records no hardware: --capacity alone is for MiniMalloc CSVs; add "
        f"{presets}" if capacities else
        f"a workload file records no hardware: pass {presets}; --capacity BYTES then sets its "
        "fast memory size")
  return apply_capacities(hw, capacities)


def apply_capacities(hw: Hardware, capacities: Sequence[tuple[Optional[str], int]]) -> Hardware:
  """`--capacity BYTES`: the fast levels together hold BYTES, in the hardware's ratio (on
  nnpi-like, 1/7 SRAM and 6/7 LLC); `--capacity LEVEL=BYTES` (repeatable): that level alone."""
  together = [size for level, size in capacities if level is None]
  per_level: dict[str, int] = {}
  for level, size in capacities:
    if level is not None:
      if level in per_level:
        raise MalloczeroError(f"--capacity {level}=... given twice")
      per_level[level] = size
  if len(together) > 1:
    raise MalloczeroError("--capacity BYTES given twice")
  if together and per_level:
    raise MalloczeroError("give either --capacity BYTES (the fast levels together) or "
                          "--capacity LEVEL=BYTES per level, not both")
  if together:
    return hw.with_fast_capacity(together[0])
  return hw.with_level_capacities(per_level) if per_level else hw


def _say_capacities(capacities: Optional[Sequence[tuple[Optional[str], int]]],
                    hw: Hardware) -> None:
  if capacities and hw.num_fast_levels > 1:
    print(f"fast memory (--capacity): {describe_fast_levels(hw)}")


def describe_fast_levels(hw: Hardware) -> str:
  """'SRAM 1.00 MiB + LLC 6.00 MiB' (what --capacity set)."""
  return " + ".join(f"{lv.name} {human_bytes(lv.capacity_bytes)}" for lv in hw.levels[:-1])


def cmd_validate(args: argparse.Namespace) -> int:
  workload = load_workload(args.workload)
  mapping = load_mapping(args.mapping)
  hw = resolve_hardware(workload, args.hardware, args.capacity, fallback=mapping.hardware)
  _say_capacities(args.capacity, hw)
  report = validate_mapping(workload, hw, mapping)
  print(f"valid: {report.num_allocations} allocations on '{hw.name}', estimated "
        f"{report.estimated_time_s * 1e3:.4g} ms vs {report.slow_only_time_s * 1e3:.4g} ms "
        f"all in slow memory (speed-up {report.speedup:.3f}x)")
  return 0


def _float_flag(text: str, expected: str, accept: Callable[[float], bool]) -> float:
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected {expected}, got '{text}'") from None
  if not accept(value):
    raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
  return value


def _positive_float(text: str) -> float:
  return _float_flag(text, "a positive number", lambda value: value > 0)


def _non_negative_float(text: str) -> float:
  return _float_flag(text, "a finite number >= 0", lambda value: 0.0 <= value < float("inf"))


def _fraction(text: str) -> float:
  return _float_flag(text, "a fraction in [0, 1)", lambda value: 0.0 <= value < 1.0)


def solver_options(args: argparse.Namespace, solver: str) -> dict:
  if solver == "cpsat":
    return {"time_limit_s": args.time_limit, "workers": args.workers}
  if solver == "evo":
    return {"evaluations": args.evaluations, "time_limit_s": args.time_limit, "seed": args.seed}
  if solver == "evo-msa":
    return {"evaluations": args.evaluations, "time_limit_s": args.time_limit, "seed": args.seed,
            "skip_below": args.skip_below, **msa_options(args.msa_option)}
  if solver == "pack":
    return {"time_limit_s": args.time_limit}
  if solver == "random":
    return {"seed": args.seed}
  if solver == "msa":
    return msa_options(args.msa_option)
  return {}


def msa_options(pairs: Optional[Sequence[tuple[str, str]]]) -> dict:
  """`--msa-option NAME=VALUE` pairs as `MsaOptions` fields, each value read as its field's type."""
  from malloczero.env.msa.algorithm import MsaOptions
  defaults = MsaOptions()
  names = [f.name for f in dataclasses.fields(MsaOptions)]
  options: dict = {}
  for name, text in pairs or ():
    if name not in names:
      raise MalloczeroError(f"unknown --msa-option '{name}' (choose from {', '.join(names)})")
    kind = type(getattr(defaults, name))
    try:
      if kind is bool:
        if text.lower() not in ("true", "false"):
          raise ValueError
        value = text.lower() == "true"
      else:
        value = kind(text)
    except ValueError:
      wanted = {bool: "true or false", int: "an integer", float: "a number"}.get(kind, "a string")
      raise MalloczeroError(f"--msa-option {name} needs {wanted}, got '{text}'") from None
    options[name] = value
  try:
    MsaOptions(**options)
  except ValueError as e:
    raise MalloczeroError(f"--msa-option: {e}") from None
  return options


def _solve_line(name: str, result) -> str:
  m = result.mapping
  if any(a["request"] < 0 for a in m.allocations):
    # msa's own segments (a buffer may have several: kept, evicted, prefetched back).
    buffers = len({a["buffer"] for a in m.allocations})
    placed = f"{len(m.allocations)} segments of {buffers} buffers in fast memory"
  else:
    placed = f"{len(m.allocations)} of {result.info['requests']} requests placed"
  return (f"{name}: {placed}; "
          f"estimated {m.estimated_time_s * 1e3:.4g} ms vs {m.slow_only_time_s * 1e3:.4g} ms "
          f"all-slow (speed-up {m.speedup:.3f}x) in {result.solve_time_s:.2f} s; validated")


def _search_notice(agent) -> None:
  """A checkpoint without its run's config.json is played with the default search settings:
  `solve` and `evaluate` both say so, in one line on stderr, rather than silently."""
  notice = agent.search_notice()
  if notice:
    print(f"malloczero: notice: {notice}", file=sys.stderr)


def _solve_with_agent(args: argparse.Namespace, workload: Workload, hw: Hardware):
  """--solver agent | portfolio: the agent's own result is always printed on its own line."""
  from malloczero.actors.agent import load_agent, solve_with_agent
  from malloczero.env.solvers import solve
  if not args.checkpoint:
    raise MalloczeroError(f"--solver {args.solver} needs --checkpoint DIR (a training work "
                          "directory or its checkpoint)")
  agent = load_agent(args.checkpoint)
  _search_notice(agent)
  result = solve_with_agent(agent, workload, hw, simulations=args.simulations,
                            attempts=args.attempts, seed=args.seed)
  info = result.info
  print(_solve_line("agent", result) + f" (checkpoint step {info['learner_steps']}, "
        f"{info['simulations']} simulations, best of {info['attempts']} trajectories: "
        f"#{info['best_attempt']}; greedy alone {info['greedy_speedup']:.3f}x)")
  if args.solver == "agent":
    return result
  baseline = solve(workload, hw, "msa")
  print(_solve_line("msa", baseline))
  winner = result if result.mapping.estimated_time_s <= baseline.mapping.estimated_time_s \
      else baseline
  print(f"portfolio: {'agent' if winner is result else 'msa'} wins "
        f"({winner.mapping.speedup:.3f}x vs "
        f"{(baseline if winner is result else result).mapping.speedup:.3f}x); its mapping is "
        "the portfolio's")
  return winner


def _check_plot(path: str | None) -> None:
  if path:
    from malloczero.system.plots import check_picture_path
    check_picture_path(path)


def cmd_solve(args: argparse.Namespace) -> int:
  from malloczero.env.solvers import solve
  if args.out:
    check_output_file(args.out)
  _check_plot(args.plot)
  workload = load_workload(args.workload)
  hw = resolve_hardware(workload, args.hardware, args.capacity)
  _say_capacities(args.capacity, hw)
  if args.solver in ("agent", "portfolio"):
    result = _solve_with_agent(args, workload, hw)
  else:
    if args.checkpoint:
      raise MalloczeroError(f"--checkpoint is for --solver agent or portfolio, not {args.solver}")
    result = solve(workload, hw, args.solver, **solver_options(args, args.solver))
    extra = ""
    if args.solver == "cpsat":
      extra = (f"; CP-SAT {result.info['status']}, proven bound "
               f"{result.info['bound_s'] * 1e3:.4g} ms"
               + (f" ({result.info['fallback']})" if "fallback" in result.info else "")
               + f" ({result.info['bound_note']})")
    elif args.solver == "pack":
      from malloczero.env.solvers.packing import describe
      extra = describe(result.info)
    print(_solve_line(args.solver, result) + extra)
  m = result.mapping
  if args.out:
    m.save(args.out)
    print(f"wrote {args.out}")
  if args.plot:
    from malloczero.system.plots import plot_memory_map
    plot_memory_map(workload, hw, m, args.plot)
    print(f"wrote {args.plot}")
  return 0


def _describe_import(workload: Workload, out: str, stats: dict | None = None) -> None:
  line = (f"wrote {out}: '{workload.name}', {workload.num_ops} ops, {workload.num_buffers} "
          f"buffers, {workload.arrays.flops.sum():.4g} flops, peak live "
          f"{human_bytes(workload.peak_live_bytes)}")
  if stats and "total_bytes" in stats:
    line += f" (XLA's memory analysis: {human_bytes(stats['total_bytes'])})"
  print(line)


def cmd_import_jax(args: argparse.Namespace) -> int:
  from malloczero.env.programs import import_model
  from malloczero.env.workload import save_workload
  from malloczero.env.programs.zoo import MODELS
  if args.model not in MODELS:
    raise MalloczeroError(f"unknown model '{args.model}' (choose from {', '.join(MODELS)})")
  check_output_file(args.out)
  batch = args.batch or MODELS[args.model].default_batches[0]
  with console(stderr=True).status(f"compiling {args.model} (batch {batch}"
                                   f"{', training step' if args.train else ''}) with XLA..."):
    workload, stats = import_model(args.model, batch, args.train, tiny=args.tiny)
  save_workload(workload, args.out)
  _describe_import(workload, args.out, stats)
  return 0


def cmd_import_hlo(args: argparse.Namespace) -> int:
  from malloczero.env.programs.hlo_import import import_hlo_text
  from malloczero.env.workload import save_workload
  check_output_file(args.out)
  try:
    with open(args.hlo, encoding="utf-8") as f:
      text = f.read()
  except (OSError, UnicodeDecodeError) as e:
    raise MalloczeroError(f"{args.hlo}: cannot read: {e}") from None
  name = args.name or os.path.basename(args.hlo).split(".")[0]
  result = import_hlo_text(text, name, source=f"xla-hlo ({os.path.basename(args.hlo)})",
                           compile=args.compile)
  for note in result.notes:  # What was done (parser, compiling) and one warning per kind.
    print(f"import-hlo: {note}", file=sys.stderr)
  save_workload(result.workload, args.out)
  _describe_import(result.workload, args.out)
  return 0


def cmd_suite(args: argparse.Namespace) -> int:
  from malloczero.env.programs.suites import get_suite, program_summaries, suite_names
  out = console()
  if args.action == "list":
    table = Table(title="built-in suites")
    for col in ("suite", "entries", *SPLITS, "programs", "description"):
      table.add_column(col)
    for name in suite_names():
      suite = get_suite(name)
      table.add_row(name, str(len(suite.entries)),
                    *(str(sum(e.split == split for e in suite.entries)) for split in SPLITS),
                    str(len({e.program for e in suite.entries})), suite.description)
    out.print(table)
    return 0
  if not args.name:
    raise MalloczeroError("'suite show' needs a suite name (see 'malloczero suite list')")
  from malloczero.env.requests import build_requests
  from malloczero.env.cost_model import CostModel
  suite = get_suite(args.name)
  programs = program_summaries()
  table = Table(title=f"suite '{suite.name}': {suite.description}")
  for col in ("entry", "split", "hardware", "fast capacity", "ops", "buffers", "requests",
              "peak live"):
    table.add_column(col, justify="left" if col in ("entry", "split", "hardware") else "right")
  for entry in suite.entries:
    workload, hw = entry.load()
    requests = len(build_requests(CostModel(workload, hw)))
    table.add_row(entry.name, entry.split, entry.hardware,
                  f"{describe_fast_levels(hw)} ({entry.capacity_fraction:.0%})",
                  str(workload.num_ops), str(workload.num_buffers), str(requests),
                  human_bytes(programs[entry.program]["peak_live_bytes"]))
  out.print(table)
  return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
  check_output_dir(args.out)  # First: before the imports, which load the whole agent stack.
  from malloczero.env.programs.suites import get_suite
  from malloczero.launch.evaluate import print_tables, run_evaluation
  from malloczero.system.evaluation import load_agents
  from malloczero.system.report import write_report
  solvers = [s.strip() for s in args.solvers.split(",") if s.strip()]
  unknown = [s for s in solvers if s not in SOLVERS]
  if unknown or (not solvers and not args.checkpoint):
    raise MalloczeroError(f"unknown solver(s) {', '.join(unknown) or '(none given)'} in --solvers "
                          f"(choose from {', '.join(SOLVERS)})")
  for flag in ("simulations", "batch_agents"):
    if getattr(args, flag) and not args.checkpoint:
      raise MalloczeroError(f"--{flag.replace('_', '-')} needs --checkpoint DIR")
  suite = get_suite(args.suite).split(args.split)
  if args.limit:
    suite = dataclasses.replace(suite, entries=suite.entries[:args.limit])
  # Checkpoints are loaded (and a bad one refused) before any solver runs.
  agents = load_agents(args.checkpoint or [], args.simulations, args.attempts)
  for a in agents:
    _search_notice(a.agent)
  out = console()
  for a in agents:
    out.print(f"{a.label}: {a.agent.checkpoint} (learner step {a.agent.learner_steps}), "
              f"{a.simulations} simulations, best of {a.attempts} trajectories per program")
  title = f"malloczero evaluate: suite '{suite.name}' ({args.split}, {len(suite.entries)} entries)"
  evaluation = run_evaluation(suite, solvers, agents, lambda s: solver_options(args, s), out,
                              batch_agents=args.batch_agents, seed=args.seed)
  print_tables(evaluation, out, title)
  for path in write_report(evaluation, args.out, title):
    out.print(f"wrote {path}")
  return 0


def cmd_bench(args: argparse.Namespace) -> int:
  from malloczero.launch.bench import report_table, run_bench, write_report
  if args.out:
    check_output_file(args.out)
  what = "the game and the cost model" + ("" if args.no_agent else ", search, acting and learner"
                                            + ("" if args.quick else ", and local_mp runs with 1 and 2 actors"))
  with console(stderr=True).status(f"benchmarking {what}..."):
    report = run_bench(quick=args.quick, agent=not args.no_agent)
  table = report_table(report, "malloczero bench" + (" --quick" if args.quick else ""))
  console().print(table)  # Before the file: a failed write does not lose the figures.
  if args.out:
    write_report(report, args.out)
    print(f"wrote {args.out}")
  return 0


def _flushing_print(out: Console):
  """Log lines reach a redirected log file as they happen, not when the buffer fills."""
  def print_fn(text: str) -> None:
    out.print(text)
    out.file.flush()
  return print_fn


def _train_config(args: argparse.Namespace):
  from malloczero.configs.config import get_config
  config = get_config(args.config)
  if args.suite:
    config = dataclasses.replace(config, suite=args.suite)
  if args.seed is not None:
    config = dataclasses.replace(config, seed=args.seed)
  if args.eval_every:
    config = dataclasses.replace(config, eval_every_steps=args.eval_every)
  if args.skip_below is not None:
    config = dataclasses.replace(config, game=dataclasses.replace(config.game,
                                                                  skip_below=args.skip_below))
  if args.demonstrations is not None:
    config = dataclasses.replace(config, learner=dataclasses.replace(
        config.learner, demonstration_fraction=args.demonstrations))
  if args.q_spread_floor is not None:
    config = dataclasses.replace(config, search=dataclasses.replace(
        config.search, q_spread_floor=args.q_spread_floor))
  if args.eval_msa_prior is not None:
    config = dataclasses.replace(config, search=dataclasses.replace(
        config.search, eval_msa_prior_logit=args.eval_msa_prior))
  if args.workload:
    config = dataclasses.replace(config, suite=args.suite or "",
                                 programs=(_program_file(args),))
  elif args.hardware or args.capacity:
    raise MalloczeroError("--hardware and --capacity describe a --workload's fast memory; "
                          "give the workload file too")
  if config.suite:
    from malloczero.env.programs.suites import get_suite
    get_suite(config.suite)  # A wrong suite name fails here, before anything starts.
  return config


def _program_file(args: argparse.Namespace):
  """`train --workload FILE --hardware H --capacity B`: the program to optimise, loaded and
  checked here so that a bad file or an impossible capacity fails before anything starts."""
  from malloczero.configs.config import ProgramFile
  from malloczero.env.hardware import check_fits
  workload = load_workload(args.workload)
  hw = resolve_hardware(workload, args.hardware, args.capacity)
  _say_capacities(args.capacity, hw)
  check_fits(hw, workload.peak_live_bytes, workload.name)
  return ProgramFile(workload.name, os.path.abspath(args.workload), hw)


def cmd_train(args: argparse.Namespace) -> int:
  """Trains the MuZero agent; checkpoints, logs, the learning curve and a report go to the work
  directory, which a second run with the same command resumes."""
  config = _train_config(args)
  if config.programs and args.launch == "vertex_ai":
    raise MalloczeroError("train --workload runs locally (--launch local_mp, local_mt or single): "
                          "a cloud run's nodes cannot read this machine's workload file")
  workdir = args.workdir or os.path.join("runs", f"train-{config.name}")
  if args.launch != "vertex_ai":  # Vertex's is a /gcs/ path, checked by launch_vertex_ai.
    check_output_dir(workdir, "--workdir")
  if args.launch == "vertex_ai":
    return _train_vertex_ai(config, args, workdir)
  if args.launch != "single":
    return _train_distributed(config, args, workdir)
  from malloczero.system.single_process import train_single_process
  out = console()
  out.print(f"malloczero train: config '{config.name}', suite '{config.suite}', single process "
            f"(in-process Reverb, 1 actor x {config.actor.num_games} games, 1 learner); "
            f"work directory {workdir}")
  result = train_single_process(config, workdir, max_learner_steps=args.max_steps,
                                max_seconds=args.max_seconds, eval_every_steps=args.eval_every,
                                print_fn=None if args.quiet else _flushing_print(out))
  table = Table(title=f"learning curve (greedy search, {config.search.eval_num_simulations} "
                "simulations): geomean speed-up over all-slow")
  baselines = list(next(iter(result.baselines.values())))
  for column in ("learner steps", "elapsed", "split", "muzero", *baselines, "beats msa"):
    table.add_column(column, justify="left" if column == "split" else "right")
  for row in result.curve:
    split = row["split"]
    table.add_row(str(row["learner_steps"]), f"{float(row['elapsed_s']):.0f} s", split,
                  f"{float(row['geomean_speedup']):.3f}x",
                  *(f"{result.baselines[split][b]:.3f}x" for b in baselines),
                  f"{row['beats_msa']}/{row['programs']}")
  out.print(table)
  out.print(f"{result.learner_steps} learner steps, {result.actor_steps} actor steps, "
            f"{result.episodes} episodes in {result.elapsed_s:.0f} s")
  from malloczero.configs.workdir import WorkDir
  files = WorkDir(workdir)
  for path in (files.learning_curve_png, files.learning_curve_csv, files.learner_state):
    out.print(f"wrote {path}")
  if config.programs and result.learner_steps > 0:
    from malloczero.system.report import write_program_report
    write_program_report(config, workdir, out.print)
  return 0


# Local actors beyond this many per CPU core only slow each other (each one searches flat out)
# and starve the learner; the machine would thrash before the first summary line.
ACTORS_PER_CORE = 2
# Resident memory of local_mp node processes, measured over a tiny-config run on 2 cores: each
# actor peaked at 577 MiB; replay, counter, learner, evaluator and limiter together at 2.6 GiB.
ACTOR_RESIDENT_BYTES = 640 << 20
OTHER_NODES_RESIDENT_BYTES = 3 << 30


def local_actor_limit(launch: str) -> tuple[int, str]:
  """The most actors this machine can run locally under `launch`, and why (cores, memory)."""
  import psutil
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:  # Not Linux.
    cores = os.cpu_count() or 1
  limit = ACTORS_PER_CORE * cores
  why = f"{cores} CPU core(s) run at most {limit} actors ({ACTORS_PER_CORE} per core)"
  if launch == "local_mp":  # One process per node; under local_mt they share this one.
    available = psutil.virtual_memory().available
    by_memory = max(0, (available - OTHER_NODES_RESIDENT_BYTES) // ACTOR_RESIDENT_BYTES)
    if by_memory < limit:
      limit = int(by_memory)
      why = (f"{human_bytes(available)} of available memory runs at most {limit} actors (about "
             f"{human_bytes(ACTOR_RESIDENT_BYTES)} each beside "
             f"{human_bytes(OTHER_NODES_RESIDENT_BYTES)} for the other nodes)")
  return limit, why


def _train_distributed(config, args: argparse.Namespace, workdir: str) -> int:
  from malloczero.system.program import launch_training
  out = console()
  num_actors = args.num_actors or config.distributed.num_actors
  limit, why = local_actor_limit(args.launch)
  if num_actors > limit and not args.oversubscribe:
    # Checked before anything is written or started: 1000 actors on 2 cores once spawned 642
    # processes before the first line was printed.
    print(f"malloczero: error: --num-actors {num_actors} is more than this machine can run: "
          f"{why}; pass --oversubscribe to start them anyway", file=sys.stderr)
    return 2
  out.print(f"malloczero train: config '{config.name}', suite '{config.suite}', Launchpad "
            f"{args.launch} with {num_actors} actor(s) x {config.actor.num_games} games; "
            f"work directory {os.path.abspath(workdir)}")
  print_fn = (lambda text: None) if args.quiet else _flushing_print(out)
  result = launch_training(config, workdir, launch=args.launch, num_actors=num_actors,
                           max_steps=args.max_steps, max_seconds=args.max_seconds,
                           node_output=args.node_output, print_fn=print_fn)
  out.print(f"{result.status}: learner steps {result.start_step} -> {result.learner_steps}, "
            f"{result.actor_moves:,} actor moves, {result.episodes:,} games in "
            f"{result.elapsed_s:.0f} s")
  if result.report is not None:
    from malloczero.system.report import summary_rows
    from malloczero.system.training import BASELINES
    table = Table(title=f"final evaluation at learner step {result.learner_steps}: geomean "
                  "speed-up over all-slow")
    for column in ("split", "programs", "agent", *BASELINES, "agent vs msa", "wins/ties/losses"):
      table.add_column(column, justify="left" if column == "split" else "right")
    for line in summary_rows(result.report, baselines=BASELINES):
      table.add_row(*line)
    out.print(table)
  from malloczero.configs.workdir import WorkDir
  files = WorkDir(result.workdir)
  for path, what in ((files.report("md"), "the evaluation report (with report.json, report.csv "
                      "and pictures)"), (files.learning_curve_png, "the learning curve"),
                     (files.checkpoints, "checkpoints"), (files.logs, "CSV logs"),
                     (files.tensorboard, "TensorBoard events")):
    if os.path.exists(path):
      out.print(f"  {what}: {path}")
  if os.path.isdir(files.best):
    out.print(f"  the fastest mapping found per training program: {files.best}")
  if result.report is not None:
    out.print(f"  compare with evo and CP-SAT too: malloczero evaluate --suite {config.suite} "
              f"--checkpoint {result.workdir} --out {files.evaluation}")
  if config.programs and result.ok and result.learner_steps > 0:
    from malloczero.system.report import write_program_report
    write_program_report(config, result.workdir, out.print)
  if result.status.startswith("failed"):
    print(f"malloczero: error: {result.status}; the last checkpoint is in "
          f"{files.checkpoints}", file=sys.stderr)
    return 1
  if result.status == "interrupted":
    print(f"malloczero: interrupted at learner step {result.learner_steps}; run the same command "
          "to resume", file=sys.stderr)
    return 130
  return 0


def _train_vertex_ai(config, args: argparse.Namespace, workdir: str) -> int:
  from malloczero.system.vertex import launch_vertex_ai
  num_actors = args.num_actors or config.distributed.num_actors
  launch_vertex_ai(config, workdir, num_actors, max_steps=args.max_steps)
  return 0


def _add_solver_flags(p: argparse.ArgumentParser) -> None:
  # evo, evo-msa and pack have no time limit flag of their own; they share CP-SAT's.
  p.add_argument("--time-limit", type=_positive_float, default=DEFAULT_TIME_LIMIT_S,
                 help=f"seconds per program for cpsat, evo, evo-msa and pack, building their models "
                      f"included (default {DEFAULT_TIME_LIMIT_S:g})")
  p.add_argument("--workers", type=_positive_int, default=DEFAULT_WORKERS,
                 help="CP-SAT worker threads")
  p.add_argument("--evaluations", type=_positive_int, default=DEFAULT_EVALUATIONS,
                 help=f"evo and evo-msa budget: full mappings decoded (default "
                      f"{DEFAULT_EVALUATIONS})")
  p.add_argument("--seed", type=_seed, default=0,
                 help="seed for random, evo and evo-msa (0 to 2**31-1)")
  p.add_argument("--skip-below", type=_fraction, default=0.0, metavar="FRACTION",
                 help="evo-msa: change only decisions whose best option saves at least this "
                 "fraction of the all-slow time (default 0: any)")
  p.add_argument("--msa-option", type=_name_value, action="append", metavar="NAME=VALUE",
                 help="msa: one of its options (env/msa/algorithm.py MsaOptions, defaults "
                      "XLA's), e.g. min_overlap_to_async_copy_ratio=0.8, "
                      "max_outstanding_prefetches=2, picker=instruction_count, copy_budget=idle; "
                      "repeatable")


CAPACITY_HELP = ("fast memory in bytes, overriding the hardware's: BYTES for the fast levels "
                 "together, shared in the hardware's ratio (nnpi-like: 1/7 SRAM, 6/7 LLC), or "
                 "LEVEL=BYTES for one level (repeatable)")


def build_parser() -> argparse.ArgumentParser:
  parser = _Parser(prog="malloczero", description="Learned memory mapping for compiled ML "
                   "programs: mallocGame, its cost model, baselines and a distributed MuZero "
                   "agent.")
  sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

  p = sub.add_parser("validate", help="check a mapping independently; exit 0 if valid")
  p.add_argument("workload", help="workload JSON (.json/.json.gz) or MiniMalloc CSV")
  p.add_argument("mapping", help="MAP.json written by a solver")
  p.add_argument("--hardware", help=f"preset ({', '.join(PRESETS)}) or hardware JSON file; "
                 "default: the hardware recorded in the mapping")
  p.add_argument("--capacity", type=_capacity, action="append", metavar="[LEVEL=]BYTES",
                 help=CAPACITY_HELP)
  p.set_defaults(func=cmd_validate)

  p = sub.add_parser("solve", help="map one program with a baseline, the trained agent or the "
                     "better of both; validates the mapping, writes MAP.json and its picture")
  p.add_argument("workload", help="workload JSON (.json/.json.gz) or MiniMalloc CSV")
  p.add_argument("--hardware", help=f"preset ({', '.join(PRESETS)}) or hardware JSON file; "
                 "required for a workload JSON (a MiniMalloc CSV defaults to minimalloc)")
  p.add_argument("--capacity", type=_capacity, action="append", metavar="[LEVEL=]BYTES",
                 help=CAPACITY_HELP + "; required for a MiniMalloc CSV without --hardware")
  p.add_argument("--solver", default="msa", choices=SOLVERS + ("agent", "portfolio"),
                 help="a baseline, the trained agent (needs --checkpoint), or portfolio (the "
                 "better of the agent and msa)")
  p.add_argument("--checkpoint", help="agent / portfolio: a training work directory or its "
                 "checkpoint")
  p.add_argument("--simulations", type=_positive_int,
                 help="agent: simulations per move (default: twice the run's evaluation search)")
  p.add_argument("--attempts", type=_positive_int, default=DEFAULT_ATTEMPTS,
                 help=f"agent: trajectories played, the first greedy (default {DEFAULT_ATTEMPTS}); "
                 "the best is kept")
  p.add_argument("--out", help="write the validated mapping here (JSON)")
  p.add_argument("--plot", help="draw the memory map here (.png, .svg, .pdf, ...)")
  _add_solver_flags(p)
  p.set_defaults(func=cmd_solve)

  p = sub.add_parser("import-jax", help="compile a zoo model with XLA (CPU) into a workload")
  p.add_argument("model", help="zoo model name, e.g. resnet50, bert, gpt, lstm, mlp")
  p.add_argument("--batch", type=_positive_int, help="batch size (default: the model's first)")
  p.add_argument("--train", action="store_true", help="a full training step instead of inference")
  p.add_argument("--tiny", action="store_true", help="the model's tiny test version")
  p.add_argument("--out", required=True, help="workload file (.json or .json.gz)")
  p.set_defaults(func=cmd_import_jax)

  p = sub.add_parser("import-hlo", help="import an HLO text module (from any backend; an "
                     "unscheduled one is compiled with XLA on the CPU first)")
  p.add_argument("hlo", help="HLO text, as printed by compiled.as_text() or XLA's dump "
                 "(--xla_dump_to=DIR --xla_dump_hlo_as_text: the *after_optimizations.txt file)")
  p.add_argument("--name", help="workload name (default: the file's name)")
  p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                 help="compile the module with XLA on the CPU before importing it (default: "
                 "only when it is not scheduled); --no-compile keeps the print order of an "
                 "unscheduled module as its schedule")
  p.add_argument("--out", required=True, help="workload file (.json or .json.gz)")
  p.set_defaults(func=cmd_import_hlo)

  p = sub.add_parser("suite", help="list the built-in suites or show one")
  p.add_argument("action", choices=("list", "show"))
  p.add_argument("name", nargs="?", help="suite to show")
  p.set_defaults(func=cmd_suite)

  p = sub.add_parser("evaluate", help="run solvers and trained checkpoints on every entry of a "
                     "suite; tables, CSV, JSON, Markdown and pictures")
  p.add_argument("--suite", required=True, help="suite name (see 'malloczero suite list')")
  p.add_argument("--checkpoint", nargs="+", metavar="DIR",
                 help="training work directories (or their checkpoints) to evaluate as agents; "
                 "several give a checkpoint-by-quality table")
  p.add_argument("--solvers", default="msa,greedy,evo,cpsat",
                 help="comma-separated baselines (default msa,greedy,evo,cpsat; msa always runs)")
  p.add_argument("--simulations", type=_positive_int,
                 help="agents: search simulations per move (default: twice the run's evaluation "
                 "search)")
  p.add_argument("--attempts", type=_positive_int, default=DEFAULT_ATTEMPTS,
                 help=f"agents: trajectories per program, the first greedy (default "
                 f"{DEFAULT_ATTEMPTS})")
  p.add_argument("--batch-agents", action="store_true",
                 help="agents: play all programs in one batch (faster; per-program solve times "
                 "are then shares of the batch)")
  p.add_argument("--split", default="all", choices=("all",) + SPLITS)
  p.add_argument("--limit", type=_positive_int, help="only the first N entries")
  p.add_argument("--out", default="evaluation", help="output directory (default ./evaluation)")
  _add_solver_flags(p)
  p.set_defaults(func=cmd_evaluate)

  p = sub.add_parser("bench", help="measure game steps/s, cost-model evaluations/s, search moves/s "
                     "and learner updates/s")
  p.add_argument("--quick", action="store_true", help="short run (about a minute)")
  p.add_argument("--no-agent", action="store_true",
                 help="only the game and the cost model (skip search, acting and learner)")
  p.add_argument("--out", help="write the results as JSON to this file")
  p.set_defaults(func=cmd_bench)

  p = sub.add_parser("train", help="train the MuZero agent on a suite's train programs")
  p.add_argument("--config", default="small", choices=tuple(CONFIG_PRESETS),
                 help="preset (default small: minutes on a laptop; tiny: tests)")
  p.add_argument("--launch", default="local_mp",
                 choices=("local_mp", "local_mt", "vertex_ai", "single"),
                 help="local_mp: one process per node (default); local_mt: nodes as threads of "
                 "this process; vertex_ai: Google Cloud (see README); single: one actor and the "
                 "learner in this process, in-process Reverb")
  p.add_argument("--num-actors", type=_positive_int,
                 help="actor nodes (default: the config's; local_mp and vertex_ai)")
  p.add_argument("--oversubscribe", action="store_true",
                 help="local launches: start --num-actors actors even beyond what this machine's "
                 "cores and memory can run")
  p.add_argument("--suite", help="suite to train on (default: the config's; with --workload, "
                 "its training programs are trained on too)")
  p.add_argument("--workload", help="optimise this program (workload file): train on it (and "
                 "on --suite's training programs if given); its fastest mapping so far is kept "
                 "in WORKDIR/best/, and the last line compares it with msa, bestfit and evo")
  p.add_argument("--hardware", help=f"with --workload: preset ({', '.join(PRESETS)}) or "
                 "hardware JSON file")
  p.add_argument("--capacity", type=_capacity, action="append", metavar="[LEVEL=]BYTES",
                 help="with --workload: " + CAPACITY_HELP)
  p.add_argument("--workdir", help="checkpoints, logs, the learning curve and the report "
                 "(default runs/train-CONFIG); an existing one is resumed")
  p.add_argument("--max-steps", "--max-learner-steps", dest="max_steps", type=_positive_int,
                 help="stop when the learner reaches this step (default: the config's)")
  p.add_argument("--max-seconds", type=_positive_float, help="stop after this much wall time")
  p.add_argument("--eval-every", type=_positive_int,
                 help="learner steps between greedy evaluations (default: the config's)")
  p.add_argument("--node-output", default="files", choices=("files", "terminal"),
                 help="local_mp: node output to WORKDIR/nodes/*.log (default) or to this "
                 "terminal, each line prefixed with its node")
  p.add_argument("--seed", type=_seed, help="override the config's seed (0 to 2**31-1)")
  p.add_argument("--skip-below", type=_fraction, metavar="FRACTION",
                 help="the game plays msa's own choice at decisions whose best option saves "
                 "less than this fraction of the all-slow time (default: the config's, 0)")
  p.add_argument("--demonstrations", type=_fraction, metavar="FRACTION",
                 help="share of each learner batch drawn from the best known game per training "
                 "program, msa's own at first (default: the config's, 0.25; 0 turns them off)")
  p.add_argument("--q-spread-floor", type=_non_negative_float, metavar="RETURN",
                 help="the search rescales a node's Q-values by at least this spread, in "
                 "return units (default: the config's, 0.1)")
  p.add_argument("--eval-msa-prior", type=_non_negative_float, metavar="LOGIT",
                 help="evaluation searches add this to the root prior's logit of msa's own move "
                 "(default: the config's, 2; 0 leaves the prior to the network)")
  p.add_argument("--quiet", action="store_true", help="no periodic log lines")
  p.set_defaults(func=cmd_train)
  return parser


# Compiled programs kept on disk: a run's actors, learner and evaluator compile the same searches
# and learner step, and runs of one config repeat them (tiny `train`, 30 steps: 66 s, then 31 s).
# Unbounded (a size limit needs the `filelock` package): a few MB per config; delete it freely.
COMPILATION_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"


def default_compilation_cache_dir() -> str:
  """$XDG_CACHE_HOME/malloczero/jax (default ~/.cache/malloczero/jax)."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "malloczero", "jax")


def use_compilation_cache() -> None:
  """Turns on JAX's persistent compilation cache for this process and the nodes it launches
  (they inherit the environment), at `default_compilation_cache_dir()` unless the user set
  JAX_COMPILATION_CACHE_DIR (empty turns it off). The cache key covers the program, the jax and
  XLA versions and the machine, so a hit is the same executable a compile would give."""
  path = os.environ.setdefault(COMPILATION_CACHE_ENV, default_compilation_cache_dir())
  if "jax" in sys.modules:  # JAX read its environment when imported: tell it directly.
    import jax
    if jax.config.jax_compilation_cache_dir is None and path:
      jax.config.update("jax_compilation_cache_dir", path)


def main(argv: Sequence[str] | None = None) -> int:
  args = build_parser().parse_args(argv)
  if args.func is not cmd_bench:  # bench measures compile times: it compiles.
    use_compilation_cache()
  try:
    return args.func(args)
  except MalloczeroError as e:
    print(f"malloczero: error: {e}", file=sys.stderr)
    return EXIT_INPUT_ERROR
  except OSError as e:  # A file that vanished or a disk that filled up mid-run: still one line.
    where = f"{e.filename}: " if e.filename else ""
    print(f"malloczero: error: {where}{e.strerror or e}", file=sys.stderr)
    return EXIT_INPUT_ERROR
  except KeyboardInterrupt:
    print("malloczero: interrupted", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
