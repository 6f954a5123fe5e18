"""HLO modules taken directly by `solve`, `validate` and `train --workload`: imported on first use,
kept in the import cache by content and importer, used from there the next time without
importing, imported again when the entry is damaged, the importer changed or --reimport says so;
files that are not readable HLO text, or too large to import here, are refused in one line."""

import gzip
import os

import jax
import pytest

from malloczero.common.errors import WorkloadError
from malloczero.env.workload_json import load_workload, workload_format
from malloczero.launch.cli import build_parser, main
from tests import hlo_programs


@pytest.fixture(scope="module")
def module_text() -> str:
  """A three-layer MLP as XLA compiles it on this CPU: optimised and scheduled."""
  params, x, _ = hlo_programs._mlp_args()
  return jax.jit(hlo_programs._mlp).lower(params, x).compile().as_text()


@pytest.fixture
def cache(tmp_path, monkeypatch):
  directory = tmp_path / "imports"
  monkeypatch.setenv("MALLOCZERO_IMPORT_CACHE_DIR", str(directory))
  return directory


@pytest.fixture
def hlo(tmp_path, module_text):
  path = tmp_path / "mlp.hlo"
  path.write_text(module_text)
  return path


def entry_files(cache) -> tuple:
  (workload_file,) = cache.glob("*.json.gz")
  (meta_file,) = cache.glob("*.meta.json")
  return workload_file, meta_file


def count_imports(monkeypatch) -> list:
  """Every call of the importer, which still runs."""
  from malloczero.env.programs import hlo_import

  calls, real = [], hlo_import.import_hlo_text

  def counted(*args, **kwargs):
    calls.append(args[1])
    return real(*args, **kwargs)

  monkeypatch.setattr(hlo_import, "import_hlo_text", counted)
  return calls


def solve(hlo, capsys, *extra) -> tuple[int, str, str]:
  code = main(["solve", str(hlo), "--hardware", "tpu-v4i-like", "--capacity", "20000", *extra])
  out, err = capsys.readouterr()
  return code, out, err


def test_solve_imports_a_module_once_and_then_uses_the_cached_import(
  hlo, cache, capsys, monkeypatch, tmp_path
):
  calls = count_imports(monkeypatch)
  mapping = tmp_path / "map.json"
  code, first, err = solve(hlo, capsys, "--out", str(mapping))
  assert code == 0, err
  assert calls == ["mlp"] and first.startswith("msa: ")
  workload_file, meta_file = entry_files(cache)
  assert f"import-hlo: imported {hlo} in " in err and f"kept in {workload_file}" in err
  assert load_workload(workload_file).name == "mlp"  # A workload file like any other.
  stamps = (workload_file.stat().st_mtime_ns, meta_file.stat().st_mtime_ns)

  code, again, err = solve(hlo, capsys, "--out", str(mapping))
  assert code == 0, err
  assert calls == ["mlp"]  # Not imported again.
  assert err.count("\n") == 1 and err.startswith(
    f"import-hlo: using the import of {hlo} cached in {workload_file} (imported "
  )
  assert (workload_file.stat().st_mtime_ns, meta_file.stat().st_mtime_ns) == stamps
  assert again.split(" in ")[0] == first.split(" in ")[0]  # The same mapping, the same time.

  assert main(["validate", str(hlo), str(mapping)]) == 0
  out, err = capsys.readouterr()
  assert out.startswith("valid: ") and "cached in" in err and calls == ["mlp"]


def test_a_damaged_or_stale_entry_is_imported_again_and_rewritten(hlo, cache, capsys, monkeypatch):
  from malloczero.env.programs import import_cache

  calls = count_imports(monkeypatch)
  assert solve(hlo, capsys)[0] == 0
  workload_file, meta_file = entry_files(cache)
  damages = (
    lambda: workload_file.write_bytes(gzip.compress(b'{"ops": [')),
    lambda: workload_file.write_bytes(b"\x1f\x8b not gzip"),
    lambda: meta_file.write_text("{"),
    lambda: meta_file.unlink(),
    lambda: workload_file.unlink(),
  )
  for damage in damages:
    damage()
    code, _, err = solve(hlo, capsys)
    assert code == 0, err
    assert "import-hlo: the cached import could not be used (" in err
    assert "imported it again" in err and f"kept in {workload_file}" in err
    assert load_workload(workload_file).name == "mlp" and meta_file.exists()
  assert len(calls) == 1 + len(damages)
  # --reimport imports a sound entry again; a changed importer (or XLA) is another key.
  assert solve(hlo, capsys, "--reimport")[0] == 0 and len(calls) == 2 + len(damages)
  monkeypatch.setattr(import_cache, "importer_stamp", lambda: "another importer")
  code, _, err = solve(hlo, capsys)
  assert code == 0 and "import-hlo: imported" in err and len(calls) == 3 + len(damages)
  assert len(list(cache.glob("*.json.gz"))) == 2


def test_a_cache_that_cannot_be_written_costs_solve_nothing_but_train_needs_it(
  hlo, tmp_path, capsys, monkeypatch
):
  blocker = tmp_path / "a-file"
  blocker.write_text("")
  monkeypatch.setenv("MALLOCZERO_IMPORT_CACHE_DIR", str(blocker / "imports"))
  code, out, err = solve(hlo, capsys)
  assert code == 0 and out.startswith("msa: ") and "not kept: the cache" in err
  code = main(["train", "--config", "tiny", "--workload", str(hlo), "--hardware", "tpu-v4i-like"])
  err = capsys.readouterr().err
  assert code == 1 and err.splitlines()[-1].startswith("malloczero: error: ")
  assert "MALLOCZERO_IMPORT_CACHE_DIR" in err.splitlines()[-1]


def test_train_takes_a_module_as_its_workload(hlo, cache):
  """The flags are checked and the program loaded before anything trains: the run's program file
  is the cache's entry, which its nodes load."""
  from malloczero.launch.commands.train import train_config

  args = ["train", "--config", "tiny", "--workload", str(hlo), "--hardware", "tpu-v4i-like"]
  config = train_config(build_parser().parse_args([*args, "--capacity", "20000"]))
  (program,) = config.programs
  workload_file, _ = entry_files(cache)
  assert program.name == "mlp" and program.workload == str(workload_file)
  assert program.hardware.fast_capacity_bytes == 20000 and config.suite == ""
  assert load_workload(program.workload).num_ops > 3
  # A second run resumes with the same program: the same entry.
  again = train_config(build_parser().parse_args([*args, "--capacity", "20000"]))
  assert again.programs == config.programs


@pytest.mark.parametrize(
  "name,content,message",
  [
    ("w.txt", b'{"ops": []}', "not an HLO text module (no 'HloModule' line and no ENTRY"),
    ("bad.hlo", b"HloModule m\n\xff\xfe", "not UTF-8 text (byte 0xff at offset 12)"),
    ("empty.hlo", b"", "empty file: an HLO module was expected"),
    ("cut.hlo", b"HloModule m, is_scheduled=true\n\nENTRY %main (", "cut: "),
    ("none.hlo", None, "no such HLO file"),
  ],
)
def test_files_that_are_not_hlo_text_are_refused_in_one_line(
  tmp_path, cache, capsys, name, content, message
):
  path = tmp_path / name
  if content is not None:
    path.write_bytes(content)
  for command in (["solve", str(path), "--hardware", "tpu-v4i-like"], ["validate", str(path), "m"]):
    assert main(command) == 1
    err = capsys.readouterr().err
    assert err.startswith("malloczero: error: ") and err.count("\n") == 1 and message in err
  assert not cache.exists() or not list(cache.iterdir())


def test_a_module_too_large_to_import_here_is_refused_before_it_is_read(
  hlo, cache, capsys, monkeypatch
):
  from malloczero.env.programs import hlo_import, import_cache

  monkeypatch.setattr(import_cache, "available_bytes", lambda: import_cache.IMPORT_BASE_BYTES)

  def never(*args, **kwargs):
    raise AssertionError("imported")

  monkeypatch.setattr(hlo_import, "import_hlo_text", never)
  code, _, err = solve(hlo, capsys)
  assert code == 1 and err.count("\n") == 1
  assert "of HLO text needs about" in err and "malloczero import-hlo` on a larger machine" in err


def test_the_loader_tells_hlo_text_from_workload_files(tmp_path, module_text):
  odd = tmp_path / "dump.after_optimizations"  # No known extension: the content decides.
  odd.write_text(module_text)
  assert workload_format(odd) == "hlo" and workload_format(tmp_path / "x.json.gz") == "json"
  assert workload_format("x.csv") == "csv" and workload_format("m.txt") == "hlo"
  with pytest.raises(WorkloadError, match="an HLO text module, not a workload file") as info:
    load_workload(odd)
  assert "\n" not in str(info.value) and "import it on first use" in str(info.value)
  assert os.path.exists(odd)
