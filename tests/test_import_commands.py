"""`import-jax` and `import-hlo` end to end: a workload written, an unknown model or a malformed
module refused in one line, an unscheduled module compiled unless told not to."""

import pytest

from tests.command_line import run_cli


@pytest.mark.slow
def test_import_jax_writes_a_workload_and_rejects_unknown_models(tmp_path):
  from malloczero.env import load_workload

  out = tmp_path / "mlp.json.gz"
  result = run_cli("import-jax", "mlp", "--tiny", "--train", "--batch", "2", "--out", str(out))
  assert result.returncode == 0, result.stderr
  workload = load_workload(out)
  assert workload.name == "tiny-mlp-b2-train" and workload.source.startswith("xla-hlo")
  assert "XLA's memory analysis" in result.stdout
  bad = run_cli("import-jax", "alexnet", "--out", str(tmp_path / "x.json"))
  assert bad.returncode == 1 and bad.stderr.count("\n") == 1
  assert "unknown model 'alexnet'" in bad.stderr and "resnet50" in bad.stderr


@pytest.mark.slow
def test_import_hlo_round_trip_and_malformed_text(tmp_path):
  from malloczero.env import load_workload
  from malloczero.env.programs.zoo import compiled_hlo_text

  hlo = tmp_path / "gpt.hlo"
  hlo.write_text(compiled_hlo_text("gpt", 1, False, tiny=True))
  out = tmp_path / "gpt.json"
  result = run_cli("import-hlo", str(hlo), "--out", str(out))
  assert result.returncode == 0, result.stderr
  assert load_workload(out).num_ops > 5
  truncated = tmp_path / "cut.hlo"
  truncated.write_text(hlo.read_text()[: len(hlo.read_text()) // 2])
  bad = run_cli("import-hlo", str(truncated), "--out", str(out))
  assert bad.returncode == 1 and bad.stderr.startswith("malloczero: error: ")
  assert bad.stderr.count("\n") == 1


@pytest.mark.slow  # Integration-sized: subprocesses, compiles or every solver.
def test_import_hlo_compiles_an_unscheduled_module_unless_told_not_to(tmp_path):
  from malloczero.env import load_workload

  hlo = tmp_path / "eager.hlo"
  hlo.write_text(
    "HloModule eager\n\nENTRY %main (a: f32[64,32], b: f32[64,32]) -> f32[64,32] {\n"
    "  %a = f32[64,32]{1,0} parameter(0)\n  %b = f32[64,32]{1,0} parameter(1)\n"
    "  %add = f32[64,32]{1,0} add(%a, %b)\n"
    "  ROOT %neg = f32[64,32]{1,0} negate(%add)\n}\n"
  )
  out = tmp_path / "eager.json"
  result = run_cli("import-hlo", str(hlo), "--out", str(out))
  assert result.returncode == 0, result.stderr
  assert result.stderr.count("\n") == 1 and "not scheduled: compiled it with XLA" in result.stderr
  assert load_workload(out).num_ops == 1  # One fusion.
  result = run_cli("import-hlo", str(hlo), "--no-compile", "--out", str(out))
  assert result.returncode == 0, result.stderr
  assert result.stderr.count("\n") == 1 and "print order is taken as the schedule" in result.stderr
  assert [o.name for o in load_workload(out).ops] == ["add", "neg"]
