"""What a user meets first: `solve`'s hardware flags say what they need, memory maps label
addresses in the level's own unit and list only the kinds drawn, the bench table fits a terminal,
and the help names every solver."""

import io

import matplotlib.pyplot as plt
import pytest
from rich.console import Console

from malloczero.env.hardware import PRESETS
from malloczero.env.mapping import Mapping
from malloczero.env.programs.synthetic import random_workload
from malloczero.env.solvers import solve
from malloczero.env.workload_json import load_workload, save_workload
from malloczero.launch import cli


def _run(capsys, *argv):
  code = cli.main([str(a) for a in argv])
  captured = capsys.readouterr()
  return code, captured.out, captured.err


@pytest.fixture
def workload_file(tmp_path):
  path = tmp_path / "prog.json"
  save_workload(random_workload(3, 30), path)
  return path


def test_solve_a_workload_file_says_it_needs_hardware(capsys, workload_file):
  code, out, err = _run(capsys, "solve", workload_file)
  assert code == 1 and out == "" and err.count("\n") == 1
  assert "a workload file records no hardware: pass --hardware (tpu-v4i-like" in err
  code, out, err = _run(capsys, "solve", workload_file, "--capacity", "65536")
  assert code == 1 and out == "" and err.count("\n") == 1
  assert "--capacity alone is for MiniMalloc CSVs; add --hardware" in err  # Not "and/or".
  code, out, err = _run(
    capsys, "solve", workload_file, "--hardware", "tpu-v4i-like", "--capacity", "65536"
  )
  assert code == 0 and "validated" in out, err


def test_capacity_sets_the_fast_levels_together_or_one_level_and_says_which(
  capsys, workload_file, tmp_path
):
  out_map = tmp_path / "map.json"
  code, out, err = _run(
    capsys,
    "solve",
    workload_file,
    "--hardware",
    "nnpi-like",
    "--capacity",
    14 << 20,
    "--out",
    out_map,
  )
  assert code == 0, err
  assert "fast memory (--capacity): SRAM 2.00 MiB + LLC 12.00 MiB" in out
  # validate starts from the mapping's recorded machine (SRAM 2 MiB) and changes the LLC only.
  code, out, err = _run(capsys, "validate", workload_file, out_map, "--capacity", "LLC=65536")
  assert "fast memory (--capacity): SRAM 2.00 MiB + LLC 64.00 KiB" in out
  code, out, err = _run(
    capsys,
    "solve",
    workload_file,
    "--hardware",
    "nnpi-like",
    "--capacity",
    "SRAM=4096",
    "--capacity",
    "LLC=8192",
  )
  assert code == 0 and "SRAM 4.00 KiB + LLC 8.00 KiB" in out, err
  for flags, message in (
    (
      ("--capacity", "100", "--capacity", "LLC=5"),
      "give either --capacity BYTES (the fast "
      "levels together) or --capacity LEVEL=BYTES per level, not both",
    ),
    (("--capacity", "100", "--capacity", "200"), "--capacity BYTES given twice"),
    (("--capacity", "LLC=1", "--capacity", "LLC=2"), "--capacity LLC=... given twice"),
    (("--capacity", "L3=4096"), "no fast level 'L3' (fast levels: SRAM, LLC)"),
  ):
    code, out, err = _run(capsys, "solve", workload_file, "--hardware", "nnpi-like", *flags)
    assert code == 1 and out == "" and err.count("\n") == 1 and message in err, err
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["solve", str(workload_file), "--hardware", "nnpi-like", "--capacity", "=5"])
  assert exit_info.value.code == 2
  assert "expected BYTES or LEVEL=BYTES, got '=5'" in capsys.readouterr().err


def test_solve_help_and_synopsis_agree_on_hardware(capsys):
  with pytest.raises(SystemExit):
    cli.main(["solve", "--help"])
  text = " ".join(capsys.readouterr().out.split())
  assert "required for a workload JSON" in text and "required for a MiniMalloc CSV" in text


def test_help_names_the_agent_as_a_solver(capsys):
  with pytest.raises(SystemExit):
    cli.main(["--help"])
  text = " ".join(capsys.readouterr().out.split())
  assert "baseline solver" not in text
  assert "map one program with a baseline, the trained agent or the better of both" in text


def _mapped(workload, capacity, hardware="tpu-v4i-like"):
  hw = PRESETS[hardware].with_fast_capacity(capacity)
  return hw, solve(workload, hw, "msa").mapping


@pytest.mark.parametrize(
  "capacity, unit, shown",
  [
    (512, "B", "512 B"),
    (64 * 1024, "KiB", "64 KiB"),
    (3 * 2**20 // 2, "MiB", "1.5 MiB"),
    (2 * 2**30, "GiB", "2 GiB"),
  ],
)
def test_memory_map_labels_addresses_in_the_capacity_s_unit(capacity, unit, shown):
  from malloczero.evaluation.plots import address_unit, memory_map_figure

  assert address_unit(capacity)[0] == unit
  workload = random_workload(3, 30)
  hw, mapping = _mapped(workload, capacity)
  fig = memory_map_figure(workload, hw, [mapping], "t")
  try:
    ax = fig.axes[0]
    assert ax.get_ylabel() == f"{hw.levels[0].name} address ({unit})"
    assert ax.get_title(loc="left").endswith(f"capacity {shown}")
    assert ax.get_ylim()[1] == pytest.approx(capacity / address_unit(capacity)[1])
  finally:
    plt.close(fig)


def test_memory_map_legend_lists_only_the_kinds_drawn(tmp_path):
  from malloczero.evaluation.plots import memory_map_figure

  csv = tmp_path / "prog.csv"  # A MiniMalloc CSV: activations only.
  csv.write_text("id,lower,upper,size\n0,0,4,300\n1,1,3,500\n2,3,6,400\n")
  workload = load_workload(csv)
  hw, mapping = _mapped(workload, 4096, "minimalloc")
  figures = [memory_map_figure(workload, hw, [mapping], "csv")]
  legend = lambda fig: [t.get_text() for t in fig.legends[0].get_texts()] if fig.legends else []
  try:
    assert legend(figures[0]) == ["activation"]
    empty = Mapping(
      mapping.workload, hw, "none", (), mapping.slow_only_time_s, mapping.slow_only_time_s
    )
    figures.append(memory_map_figure(workload, hw, [empty], "nothing placed"))
    assert legend(figures[1]) == []
    mixed = random_workload(3, 30, num_parameters=5)
    hw, mapping = _mapped(mixed, 10**9)  # Room for all: parameters and activations drawn.
    figures.append(memory_map_figure(mixed, hw, [mapping], "all"))
    kind = {b.id: b.kind for b in mixed.buffers}
    kinds = {kind[a["buffer"]] for a in mapping.allocations}
    assert kinds >= {"activation", "parameter"}
    # Parameters arrive by prefetch: their copies in flight are hatched and named too.
    copies = {
      f"{c} in flight" for a in mapping.allocations for c in ("prefetch", "eviction") if c in a
    }
    assert "prefetch in flight" in copies
    assert set(legend(figures[2])) == kinds | copies
    assert len(legend(figures[2])) == len(kinds) + len(copies)
  finally:
    for fig in figures:
      plt.close(fig)


def test_bench_table_fits_a_hundred_columns():
  from malloczero.launch.benchmarks import NOTE, report_table

  report = {
    "quick": True,
    "python": "3.10.13",
    "numpy": "1.26.4",
    "cpu_count": 2,
    "machine": "x86_64",
    "note": NOTE,
    "game_program": "random-7-700",
    "game_hardware": "tpu-v4i-like",
    "cost_model_incremental_updates_per_s": 102761.3,
    "e2e_2_actors_learner_updates_per_s": 1.25,
    "search_small_simulations_per_s": 5e4,
  }
  buffer = io.StringIO()
  Console(file=buffer, width=240).print(report_table(report, "malloczero bench --quick"))
  lines = buffer.getvalue().splitlines()
  assert max(map(len, lines)) <= 100
  text = " ".join(" ".join(lines).split())
  for key in report:
    assert key in text
  assert "102,761.3" in text and " ".join(NOTE.split()[:4]) in text


def test_msa_options_reach_the_solver_from_the_command_line(capsys, workload_file):
  base = ["solve", workload_file, "--hardware", "tpu-v4i-like", "--capacity", 4096]
  code, default, err = _run(capsys, *base)
  assert code == 0, err
  # No prefetch may be outstanding: msa places fewer segments (it keeps only what needs no copy).
  code, limited, err = _run(capsys, *base, "--msa-option", "max_outstanding_prefetches=0")
  assert code == 0, err
  segments = lambda out: int(out.split(" segments")[0].split()[-1])
  assert segments(limited) < segments(default)
  for option, message in (
    ("nope=1", "unknown --msa-option 'nope' (choose from min_overlap_to_async_copy_ratio"),
    ("use_copy_resource=maybe", "--msa-option use_copy_resource needs true or false"),
    ("max_outstanding_prefetches=1.5", "max_outstanding_prefetches needs an integer"),
    ("picker=zzz", "unknown picker 'zzz'"),
    ("min_overlap_to_async_copy_ratio=-1", "must be a positive number, got -1.0"),
    ("max_outstanding_prefetches=-2", "must be -1 (no limit) or a count >= 0, got -2"),
  ):
    code, out, err = _run(capsys, *base, "--msa-option", option)
    # A flag error: exit 2, as argparse's, naming the command's help.
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err
    assert "(see 'malloczero solve --help')" in err
  # Solvers that do not read msa's options refuse them rather than ignore them.
  code, out, err = _run(capsys, *base, "--solver", "greedy", "--msa-option", "picker=cost")
  assert code == 2 and out == "" and "--msa-option is for msa, evo-msa, not greedy" in err, err
