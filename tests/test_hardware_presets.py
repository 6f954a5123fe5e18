"""The hardware presets (today's accelerators beside the built-in suites' machines): each is a
valid machine that round-trips through its JSON form and names its source, a program too big for
a machine is refused naming the presets that hold it (or, when none does, a hardware file), and
`malloczero hardware list | show` print them."""

import json
import re

import pytest

from malloczero.common.errors import HardwareError
from malloczero.env.hardware import (
  NOT_MACHINES,
  PRESET_SOURCES,
  PRESETS,
  Hardware,
  load_hardware,
  presets_holding,
  resolve_hardware,
)
from malloczero.env.programs.synthetic import contended
from malloczero.env.workload_json import save_workload, workload_from_ops

GiB = 1 << 30
# The built-in suites name these by their names and sizes: they must not change.
SUITE_MACHINES = {
  "tpu-v4i-like": [(128 << 20, 4 * 614e9), (8 * GiB, 614e9)],
  "nnpi-like": [(4 << 20, 4e12), (24 << 20, 4e11), (32 * GiB, 4e10)],
}


def program(peak_bytes: int, name: str = "llm-step"):
  """One op writing one buffer of `peak_bytes` that a second op reads: peak live = its size."""
  return workload_from_ops(
    name,
    "test",
    [1e12, 1e12],
    [{"id": 0, "name": "h", "size": peak_bytes, "def": 0, "uses": [1], "kind": "activation"}],
  )


def named_presets(message: str) -> list[str]:
  """The presets a refusal proposes, in its order."""
  found = re.search(r"presets that hold it: (.*?); pass --hardware NAME", message)
  assert found, message
  return [item.split(" (")[0] for item in found.group(1).split(", ")]


def test_the_suites_machines_are_unchanged():
  for name, levels in SUITE_MACHINES.items():
    assert [(lv.capacity_bytes, lv.bandwidth_bytes_per_s) for lv in PRESETS[name].levels] == levels


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_a_valid_machine_that_round_trips_and_names_its_source(name, tmp_path):
  hw = PRESETS[name]
  assert hw.name == name and PRESET_SOURCES[name]
  # The constructor's checks, again from the JSON form a user would edit.
  assert Hardware.from_dict(hw.to_dict(), where=name) == hw
  path = tmp_path / f"{name}.json"
  path.write_text(json.dumps(hw.to_dict()))
  assert load_hardware(str(path)) == hw
  slow = hw.levels[-1]
  assert all(lv.capacity_bytes < slow.capacity_bytes for lv in hw.levels[:-1])
  if name not in NOT_MACHINES:
    # A device: its copy engine is no faster than its fast memory, and no slower than its HBM.
    assert slow.bandwidth_bytes_per_s <= hw.copy_bandwidth_bytes_per_s
    assert hw.copy_bandwidth_bytes_per_s < hw.levels[0].bandwidth_bytes_per_s


def test_the_new_presets_cover_todays_accelerators():
  for name in ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "h100-sxm", "h200", "b200", "mi300x"):
    assert name in PRESETS, name
  # A 60-92 GiB training step fits some of them, largest memory last.
  holders = [h.name for h in presets_holding(92 * GiB)]
  assert holders[0] == "tpu-v5p" and "mi300x" in holders and "tpu-v4i-like" not in holders
  assert "minimalloc" not in [h.name for h in presets_holding(1)]  # Not a machine to propose.


@pytest.mark.parametrize("machine", ["tpu-v4i-like", "nnpi-like"])
def test_a_program_too_big_for_a_machine_names_the_presets_that_hold_it(machine):
  workload = program(92 * GiB)
  with pytest.raises(HardwareError) as info:
    resolve_hardware(workload, machine, [])
  message = str(info.value)
  assert "\n" not in message and message.startswith("llm-step: peak live bytes 98784247808")
  named = named_presets(message)
  assert named and machine not in named
  assert set(named) == {h.name for h in presets_holding(92 * GiB)}
  assert all(PRESETS[name].levels[-1].capacity_bytes >= 92 * GiB for name in named)
  # The suite path: a fraction of the program's peak on the machine.
  with pytest.raises(HardwareError) as info:
    contended(PRESETS[machine], workload, 0.25)
  assert named_presets(str(info.value)) == named
  # On one of the machines proposed, the same program is accepted.
  assert resolve_hardware(workload, named[0], [(None, 23 * GiB)]).fast_capacity_bytes == 23 * GiB


def test_a_fast_capacity_beyond_the_slow_memory_names_the_presets_that_hold_it():
  with pytest.raises(HardwareError) as info:
    resolve_hardware(program(4 * GiB), "tpu-v4i-like", [(None, 20 * GiB)])
  message = str(info.value)
  assert "fast capacity 20.00 GiB" in message and "give at most 8589934592 bytes" in message
  assert named_presets(message)[0] == "nnpi-like" and "tpu-v6e" in named_presets(message)


def test_a_program_no_preset_holds_is_pointed_to_a_hardware_file():
  with pytest.raises(HardwareError) as info:
    resolve_hardware(program(300 * GiB), "h200", [])
  message = str(info.value)
  assert "\n" not in message and "no preset holds it" in message
  assert "pass --hardware FILE.json" in message and "malloczero hardware show mi300x" in message


def test_solve_refuses_a_program_too_big_for_the_machine_in_one_line(tmp_path, capsys):
  from malloczero.launch.cli import main

  path = tmp_path / "llm.json"
  save_workload(program(60 * GiB), path)
  assert main(["solve", str(path), "--hardware", "tpu-v4i-like"]) == 1
  err = capsys.readouterr().err
  assert err.startswith("malloczero: error: llm-step: peak live bytes") and err.count("\n") == 1
  assert named_presets(err)[0] == "h100-sxm"


def test_hardware_list_and_show(capsys):
  from malloczero.launch.cli import main

  assert main(["hardware", "list"]) == 0
  out = capsys.readouterr().out
  for name in PRESETS:
    assert name in out and PRESET_SOURCES[name] in out
  assert "HBM 32.00 GiB @ 1.64 TB/s" in out and "918 TFLOP/s" in out  # tpu-v6e
  assert main(["hardware", "show", "b200"]) == 0
  assert Hardware.from_dict(json.loads(capsys.readouterr().out)) == PRESETS["b200"]
  assert main(["hardware", "show"]) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "needs a preset name" in err
  assert main(["hardware", "show", "tpu-v9"]) == 1
  assert "unknown hardware 'tpu-v9'" in capsys.readouterr().err
