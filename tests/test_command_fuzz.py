"""Fuzzing every command with bad input, as a hostile or careless user would give it: mutated
workloads, mappings, CSVs, hardware files, HLO modules and checkpoints, files that are not regular
files, names with control characters, numbers out of range, damaged work directories.

Each command line runs in this process (`cli.main`), so a traceback is an exception here. Every
run must end with exit 0, 1 or 2; a refusal is one line `malloczero: error: ...`, the last on
stderr, with no traceback; a refused command leaves no output file behind, and an output a
command wrote whole loads again. `train`, `evaluate` and `bench` lines always carry a bad part,
so that a generated line never starts a training run or a whole benchmark.

CI runs 40 generated command lines (the "ci" hypothesis profile); `HYPOTHESIS_PROFILE=thorough`
runs 1,000 (32 s on 2 cores).
"""

from __future__ import annotations

import gzip
import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from malloczero.env import load_mapping, load_workload
from malloczero.env.solvers import solve
from malloczero.env.workload_json import workload_to_dict
from tests.command_line import run_main
from tests.test_loader_fuzz import CSV, HARDWARE, WORKLOAD, mutated_bytes, mutated_csv, mutated_json

pytestmark = pytest.mark.slow

FUZZ = settings(
  suppress_health_check=[
    HealthCheck.too_slow,
    HealthCheck.data_too_large,
    HealthCheck.function_scoped_fixture,
  ]
)

# Numbers a flag may be given: out of range, not numbers, or fine.
NUMBERS = st.sampled_from(
  ["-1", "0", "nan", "inf", "-inf", "1e308", "1e400", "10**12", "x", "", "2.5", "9" * 30]
  + ["1", "3", "0.5", "1000000000000", "2147483648", "-0"]
)
NAMES = st.sampled_from(
  ["tiny", "default", "foreign", "nope", "a\nb", "\x1b[31mred", "../..", "", "tpu-v4", "h200"]
)
SOLVERS = st.sampled_from(
  ["msa", "greedy", "bestfit", "random", "evo", "evo-msa", "cpsat", "pack", "msa-simple"]
  + ["agent", "portfolio", "nope"]
)
FILES = (
  "workload.json",
  "workload.json.gz",
  "program.csv",
  "hardware.json",
  "mapping.json",
  "module.hlo",
  "checkpoint.npz",
  "directory",
  "missing.json",
  "empty.json",
  "fifo.json",
  "/dev/null",
  "name\nwith\x1b[2Jescape.json",
)


@pytest.fixture(scope="module")
def hlo_text() -> bytes:
  import jax

  from tests.hlo_programs import _mlp, _mlp_args

  params, x, _ = _mlp_args()
  return jax.jit(_mlp).lower(params, x).compile().as_text().encode("utf-8")


@pytest.fixture(scope="module")
def mapping_json() -> dict:
  return solve(WORKLOAD, HARDWARE, "bestfit").mapping.to_dict()


@st.composite
def file_inputs(draw, folder: str, hlo: bytes, mapping: dict) -> dict[str, str]:
  """Each kind of input file, written anew: valid or mutated, and the odd kinds of path."""
  paths = {}

  def write(name: str, data: bytes, compressed: bool = False) -> str:
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
      f.write(gzip.compress(data) if compressed else data)
    return path

  workload = draw(mutated_json(workload_to_dict(WORKLOAD)))
  paths["workload.json"] = write("workload.json", workload)
  paths["workload.json.gz"] = write("workload.json.gz", workload, compressed=True)
  paths["program.csv"] = write("program.csv", draw(st.just(CSV.encode()) | mutated_csv()))
  paths["hardware.json"] = write("hardware.json", draw(mutated_json(HARDWARE.to_dict())))
  paths["mapping.json"] = write("mapping.json", draw(mutated_json(mapping)))
  paths["module.hlo"] = write("module.hlo", draw(mutated_bytes(hlo)))
  paths["checkpoint.npz"] = write(
    "checkpoint.npz", draw(st.sampled_from([b"", b"PK\x03\x04", b"\x80\x04K\x01."]))
  )
  paths["empty.json"] = write("empty.json", b"")
  os.makedirs(os.path.join(folder, "directory"), exist_ok=True)
  paths["directory"] = os.path.join(folder, "directory")
  paths["missing.json"] = os.path.join(folder, "missing.json")
  fifo = os.path.join(folder, "fifo.json")
  if not os.path.exists(fifo):
    os.mkfifo(fifo)
  paths["fifo.json"] = fifo
  paths["/dev/null"] = "/dev/null"
  odd = "name\nwith\x1b[2Jescape.json"
  paths[odd] = write(odd, workload)
  return paths


@st.composite
def command_lines(draw, files: dict[str, str], out: str) -> tuple[list[str], str]:
  """(argv, its output path or "")."""
  pick = lambda *kinds: files[draw(st.sampled_from(kinds or FILES))]  # noqa: E731
  command = draw(
    st.sampled_from(
      ["solve", "validate", "import-jax", "import-hlo", "suite", "hardware", "evaluate"]
      + ["bench", "train", "convert-checkpoint"]
    )
  )
  hardware = draw(st.sampled_from(["tpu-v4i-like", "nnpi-like", "minimalloc", "bad", "file"]))
  hardware = files["hardware.json"] if hardware == "file" else hardware
  maybe = lambda flag, values: (  # noqa: E731
    [flag, draw(values)] if draw(st.booleans()) else []
  )
  if command == "solve":
    target = os.path.join(out, draw(st.sampled_from(["map.json", "map.png", "directory"])))
    argv = ["solve", pick(), "--hardware", hardware, "--solver", draw(SOLVERS)]
    argv += ["--out", target, "--time-limit", draw(st.sampled_from(["2", "0.5", "-1", "1e308"]))]
    argv += maybe("--capacity", NUMBERS) + maybe("--seed", NUMBERS)
    argv += maybe("--evaluations", st.sampled_from(["50", "0", "1e9", "10**12", "x"]))
    argv += maybe("--workers", st.sampled_from(["1", "0", "100000", "-3"]))
    argv += maybe("--simulations", NUMBERS) + maybe("--attempts", NUMBERS)
    argv += maybe("--checkpoint", st.sampled_from([files["checkpoint.npz"], files["directory"]]))
    argv += maybe("--plot", st.sampled_from([target, os.path.join(out, "p.png")]))
    return argv, target
  if command == "validate":
    return ["validate", pick(), pick(), "--hardware", hardware] + maybe("--capacity", NUMBERS), ""
  if command == "import-jax":
    target = os.path.join(out, draw(st.sampled_from(["w.json", "w.txt", "directory"])))
    model = draw(st.sampled_from(["mlp", "nope", "a\nb"]))
    return ["import-jax", model, "--tiny", "--batch", draw(NUMBERS), "--out", target], target
  if command == "import-hlo":
    target = os.path.join(out, draw(st.sampled_from(["w.json", "w.json.gz", "w.csv"])))
    hlo = pick("module.hlo", "module.hlo", "empty.json", "fifo.json", "directory", "/dev/null")
    return ["import-hlo", hlo, "--out", target], target
  if command == "suite":
    return ["suite", draw(st.sampled_from(["list", "show", "drop"])), draw(NAMES)], ""
  if command == "hardware":
    name = draw(NAMES | st.sampled_from([files["hardware.json"], files["fifo.json"]]))
    return ["hardware", draw(st.sampled_from(["list", "show"])), name], ""
  if command == "evaluate":
    # Always one bad part: a valid evaluation of a whole suite is not a fuzz case.
    bad = draw(
      st.sampled_from(
        [
          ["--suite", draw(NAMES.filter(lambda n: n not in ("tiny", "default", "foreign")))],
          ["--suite", "tiny", "--checkpoint", draw(st.sampled_from([pick(), "missing"]))],
          ["--suite", "tiny", "--solvers", draw(st.sampled_from(["msa,nope", "", ",,"]))],
          ["--suite", "tiny", "--limit", draw(st.sampled_from(["0", "-1", "x", "10**12"]))],
          ["--suite", "tiny", "--out", files["workload.json"]],
          ["--suite", "tiny", "--time-limit", draw(st.sampled_from(["0", "-1", "nan", "1e400"]))],
        ]
      )
    )
    return ["evaluate", *bad], ""
  if command == "bench":
    target = draw(st.sampled_from([files["directory"], os.path.join(out, "no", "b.json")]))
    return ["bench", "--quick", "--out", target], target
  if command == "train":
    workdir = os.path.join(out, "run")
    bad = draw(
      st.sampled_from(
        [
          ["--suite", "foreign"],
          ["--suite", draw(NAMES.filter(lambda n: n not in ("tiny", "default")))],
          ["--set", f"actor.num_games={draw(NUMBERS.filter(lambda n: n not in ('1', '3')))}"],
          ["--set", f"learner.batch_size={draw(st.sampled_from(['0', '65537', 'x', '1e9']))}"],
          ["--max-seconds", draw(st.sampled_from(["0", "-1", "nan", "1e308"]))],
          ["--workload", pick("missing.json", "directory", "fifo.json", "empty.json")],
          ["--num-actors", draw(st.sampled_from(["0", "100000", "x"]))],
          ["--config", "huge"],
          ["garbage-config"],
        ]
      )
    )
    if bad == ["garbage-config"]:
      os.makedirs(workdir, exist_ok=True)
      with open(os.path.join(workdir, "config.json"), "wb") as f:
        f.write(draw(st.sampled_from([b"{", b"[]", b'{"learner": 3}', b"\xff\xfe"])))
      bad = []
    return ["train", "--config", "tiny", "--launch", "single", "--workdir", workdir, *bad], ""
  target = os.path.join(out, "converted.npz")
  return ["convert-checkpoint", pick(), "--out", target] + (["--trust"] * draw(st.booleans())), (
    target
  )


def _check_output(argv: list[str], target: str, code: int) -> None:
  """A refused command leaves nothing at `target`; a finished one, its whole output."""
  if not target or os.path.isdir(target):
    return
  if code != 0:
    assert not os.path.exists(target), f"{argv}: left {target} behind"
    return
  if target.endswith((".json", ".json.gz")) and os.path.exists(target):
    if argv[0] == "solve":
      load_mapping(target)
    elif argv[0] in ("import-jax", "import-hlo"):
      load_workload(target)


def _leftovers(folder: str) -> list[str]:
  """Temporary files an atomic write would leave if it were not cleaned up."""
  found = []
  for root, _, names in os.walk(folder):
    found += [os.path.join(root, n) for n in names if ".tmp" in n or n.startswith(".")]
  return found


@FUZZ
@given(data=st.data())
def test_every_command_refuses_bad_input_in_one_line_and_leaves_nothing_behind(
  tmp_path, capsys, monkeypatch, hlo_text, mapping_json, data
):
  monkeypatch.setenv("MALLOCZERO_IMPORT_CACHE_DIR", str(tmp_path / "imports"))
  inputs = tmp_path / "inputs"
  out = tmp_path / "out"
  for folder in (inputs, out):
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
  (out / "directory").mkdir()
  files = data.draw(file_inputs(str(inputs), hlo_text, mapping_json))
  argv, target = data.draw(command_lines(files, str(out)))
  try:
    code, _, err = run_main(capsys, *argv)
  except BaseException as e:  # noqa: BLE001 - any escape is the defect under test.
    pytest.fail(f"{argv!r}: {type(e).__name__}: {e}")
  assert code in (0, 1, 2), (argv, code, err[-2000:])
  assert "Traceback" not in err, (argv, err[-3000:])
  if code != 0:
    lines = err.rstrip("\n").split("\n")
    assert lines[-1].startswith("malloczero: error: "), (argv, err[-2000:])
    assert sum(line.startswith("malloczero: error: ") for line in lines) == 1, (argv, err)
  _check_output(argv, target, code)
  assert _leftovers(str(out)) == [], argv
  if os.environ.get("MALLOCZERO_FUZZ_LOG"):  # What was run, for a look at the mix.
    with open(os.environ["MALLOCZERO_FUZZ_LOG"], "a", encoding="utf-8") as f:
      f.write(f"{code}\t{argv[0]}\t{(err.strip().splitlines() or [''])[-1][:150]!r}\n")
