"""Output paths: every command refuses an output it cannot write before it does any work (one line,
exit 1, no file left behind), and every file is written atomically (common/files.py)."""

import json
import os

import pytest

from malloczero.common.files import (
  OutputError,
  atomic_write,
  check_output_dir,
  check_output_file,
  write_text,
)
from malloczero.launch import cli

PROC = "/proc"


def _run(capsys, *argv):
  """(exit status, stdout, stderr) of the command line, in this process."""
  code = cli.main([str(a) for a in argv])
  captured = capsys.readouterr()
  return code, captured.out, captured.err


def _one_line_error(err: str, *fragments: str) -> None:
  assert err.startswith("malloczero: error: ") and err.count("\n") == 1, err
  for fragment in fragments:
    assert fragment in err, err


def _tree(root) -> list[str]:
  return sorted(
    os.path.relpath(os.path.join(d, f), root)
    for d, dirs, files in os.walk(root)
    for f in files + dirs
  )


@pytest.fixture
def program(tmp_path):
  """A MiniMalloc CSV (solved with --capacity 800) in a folder of its own."""
  folder = tmp_path / "in"
  folder.mkdir()
  csv = folder / "prog.csv"
  csv.write_text("id,lower,upper,size\n0,0,4,300\n1,1,3,500\n2,3,6,400\n3,2,5,200\n")
  return csv


# The helper.


def test_check_output_file_refuses_what_cannot_be_written(tmp_path):
  assert check_output_file(tmp_path / "new.json") == str(tmp_path / "new.json")
  (tmp_path / "old.json").write_text("{}")
  check_output_file(tmp_path / "old.json")  # Replaced in the end: fine.
  (tmp_path / "file").write_text("")
  for path, message in (
    (tmp_path, "is a directory"),
    (tmp_path / "missing" / "x.json", "does not exist"),
    (tmp_path / "file" / "x.json", "is not a directory"),
    ("", "empty path"),
  ):
    with pytest.raises(OutputError, match=message):
      check_output_file(path)
  with pytest.raises(OutputError, match=r"'\.xyz'; a picture needs one of .*\.png"):
    check_output_file(tmp_path / "map.xyz", "--plot", extensions=("png", "svg"))
  with pytest.raises(OutputError, match="no extension"):
    check_output_file(tmp_path / "map", "--plot", extensions=("png", "svg"))
  check_output_file(tmp_path / "map.SVG", "--plot", extensions=("png", "svg"))
  check_output_file(os.devnull)  # A device is written in place.
  assert _tree(tmp_path) == ["file", "old.json"]  # The checks leave nothing behind.


def test_check_output_paths_probe_by_creating_a_file():
  """Root passes os.access on /proc; only creating a file tells."""
  with pytest.raises(OutputError, match="cannot create a file in /proc"):
    check_output_file("/proc/x.json")
  with pytest.raises(OutputError, match="cannot create it"):
    check_output_dir("/proc/run")


def test_check_output_dir_accepts_existing_or_creatable_directories(tmp_path):
  check_output_dir(tmp_path)
  check_output_dir(tmp_path / "a" / "b")
  assert not (tmp_path / "a").exists()  # Checked, not created.
  (tmp_path / "file").write_text("")
  with pytest.raises(OutputError, match="is a file, not a directory"):
    check_output_dir(tmp_path / "file")
  with pytest.raises(OutputError, match="cannot create it: .*file is a file"):
    check_output_dir(tmp_path / "file" / "sub")


def test_atomic_write_replaces_whole_or_leaves_the_old_file(tmp_path):
  path = tmp_path / "result.json"
  write_text(path, "old")
  with pytest.raises(RuntimeError):
    with atomic_write(path) as f:
      f.write("half of the new")
      raise RuntimeError("the work failed mid-write")
  assert path.read_text() == "old" and _tree(tmp_path) == ["result.json"]
  with atomic_write(path, "wb") as f:
    f.write(b"new")
  assert path.read_bytes() == b"new" and _tree(tmp_path) == ["result.json"]
  assert oct(os.stat(path).st_mode & 0o777) != oct(0o600)  # Not mkstemp's private mode.


def test_atomic_write_failure_is_an_output_error_naming_the_path(tmp_path):
  with pytest.raises(OutputError, match="missing/x.json: cannot write"):
    write_text(tmp_path / "missing" / "x.json", "x")
  with pytest.raises(OutputError, match="cannot write"):
    with atomic_write(tmp_path / "x.json") as f:
      f.write("x")
      raise OSError(28, "No space left on device")
  assert _tree(tmp_path) == []


def test_atomic_write_writes_a_device_in_place():
  with atomic_write(os.devnull) as f:
    f.write("discarded")
  assert not os.path.isfile(os.devnull)  # Still the device, not a file renamed over it.


# The commands: a bad output is refused first, in one line, exit 1, nothing written.


@pytest.mark.parametrize(
  "flags, message",
  [
    (["--out", "{tmp}/missing/map.json"], "does not exist"),
    (["--out", "{tmp}"], "is a directory"),
    (["--out", "{tmp}/map.json", "--plot", "{tmp}/map.xyz"], "a picture needs one of"),
    (["--out", "{tmp}/map.json", "--plot", "{tmp}/missing/map.png"], "does not exist"),
  ],
)
def test_solve_refuses_bad_outputs_before_solving(tmp_path, capsys, program, flags, message):
  out = tmp_path / "out"
  out.mkdir()
  code, stdout, err = _run(
    capsys, "solve", program, "--capacity", "800", *(f.format(tmp=out) for f in flags)
  )
  assert code == 1 and stdout == ""  # Refused before the solver ran.
  _one_line_error(err, message)
  assert _tree(out) == []  # In particular, no map.json beside a refused --plot.


def test_solve_refuses_an_output_on_proc(capsys, program):
  code, stdout, err = _run(capsys, "solve", program, "--capacity", "800", "--out", "/proc/m.json")
  assert code == 1 and stdout == ""
  _one_line_error(err, "--out /proc/m.json: cannot create a file in /proc")


def test_solve_writes_what_it_checked(tmp_path, capsys, program):
  code, stdout, err = _run(
    capsys,
    "solve",
    program,
    "--capacity",
    "800",
    "--out",
    tmp_path / "map.json",
    "--plot",
    tmp_path / "map.svg",
  )
  assert code == 0, err
  assert json.loads((tmp_path / "map.json").read_text())["solver"] == "msa"
  assert (tmp_path / "map.svg").read_text().lstrip().startswith("<?xml")
  assert sorted(os.listdir(tmp_path)) == ["in", "map.json", "map.svg"]  # No temporary files.


@pytest.mark.parametrize("command", ["import-hlo", "import-jax"])
def test_imports_refuse_bad_outputs_before_reading_or_compiling(tmp_path, capsys, command):
  source = ["missing.hlo"] if command == "import-hlo" else ["mlp", "--tiny"]
  for out, message in (
    (tmp_path / "missing" / "w.json", "does not exist"),
    (tmp_path, "is a directory"),
  ):
    code, stdout, err = _run(capsys, command, *source, "--out", out)
    assert code == 1 and stdout == ""
    _one_line_error(err, f"--out {out}: ", message)  # Not "cannot read missing.hlo".
  assert _tree(tmp_path) == []


def test_evaluate_refuses_a_bad_out_before_evaluating(tmp_path, capsys):
  (tmp_path / "file").write_text("")
  for out, message in (
    (tmp_path / "file", "is a file, not a directory"),
    (tmp_path / "file" / "sub", "cannot create it"),
  ):
    code, stdout, err = _run(
      capsys, "evaluate", "--suite", "tiny", "--solvers", "msa", "--out", out
    )
    assert code == 1 and stdout == ""
    _one_line_error(err, f"--out {out}: {message}")
  assert _tree(tmp_path) == ["file"]


def test_bench_refuses_a_bad_out_before_measuring(tmp_path, capsys, monkeypatch):
  from malloczero.launch import benchmarks

  monkeypatch.setattr(benchmarks, "run_bench", lambda **_: pytest.fail("measured anyway"))
  for out, message in (
    (tmp_path / "missing" / "b.json", "does not exist"),
    (tmp_path, "is a directory"),
  ):
    code, _, err = _run(capsys, "bench", "--no-agent", "--out", out)
    assert code == 1
    _one_line_error(err, message)
  assert _tree(tmp_path) == []


def test_bench_prints_its_table_even_when_the_write_fails(tmp_path, capsys, monkeypatch):
  """The path was fine when checked and is a directory by the time the figures are in."""
  from malloczero.launch import benchmarks

  out = tmp_path / "b.json"

  def run_bench(**_):
    out.mkdir()
    return {"game_steps_per_s": 1234.5}

  monkeypatch.setattr(benchmarks, "run_bench", run_bench)
  code, stdout, err = _run(capsys, "bench", "--no-agent", "--out", out)
  assert code == 1 and "game_steps_per_s" in stdout and "1,234.5" in stdout
  _one_line_error(err, str(out))
  assert _tree(tmp_path) == ["b.json"]  # Only the directory that was in the way.


def test_train_refuses_a_workdir_that_is_a_file(tmp_path, capsys):
  (tmp_path / "file").write_text("")
  for launch in ("single", "local_mp"):
    code, stdout, err = _run(
      capsys, "train", "--launch", launch, "--config", "tiny", "--workdir", tmp_path / "file"
    )
    assert code == 1 and stdout == ""
    _one_line_error(err, "--workdir", "is a file, not a directory")
  assert _tree(tmp_path) == ["file"]
