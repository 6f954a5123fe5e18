"""The model zoo: every tiny model compiles with XLA for inference and for a full training step.

Only the `tiny=True` versions are compiled here (seconds each); the full-size models are checked
by hand (their compile times are in the zoo's report), as compiling all of them takes minutes.
"""

import jax
import numpy as np
import pytest

from malloczero.common.errors import WorkloadError
from malloczero.env.programs import zoo

BATCH = 2


def _shapes(tree):
  return jax.tree_util.tree_map(lambda x: (tuple(x.shape), str(x.dtype)), tree)


def test_registry_has_at_least_ten_models_covering_the_main_families():
  assert len(zoo.MODELS) >= 10
  families = {spec.family for spec in zoo.MODELS.values()}
  assert {"convnet", "transformer", "recurrent", "mlp"} <= families
  for name, spec in zoo.MODELS.items():
    assert spec.name == name
    assert spec.description and "\n" not in spec.description
    assert len(spec.default_batches) == 2 and all(b >= 1 for b in spec.default_batches)
  for name in ("resnet50", "mobilenet", "bert", "gpt", "unet", "lstm", "mlp"):
    assert name in zoo.MODELS
  assert "vit" in zoo.MODELS or "mlp_mixer" in zoo.MODELS
  assert set(zoo.TINY_MODELS) == set(zoo.MODELS) | set(zoo.EXTRA_MODELS)
  assert not set(zoo.MODELS) & set(zoo.EXTRA_MODELS)


def test_unknown_model_raises_one_line_workload_error_listing_known_names():
  with pytest.raises(WorkloadError) as info:
    zoo.build_program("no_such_model", 1, train=False)
  message = str(info.value)
  assert "\n" not in message
  assert "no_such_model" in message
  for name in zoo.MODELS:
    assert name in message


def test_config_overrides_apply_and_an_unknown_setting_is_one_line():
  assert zoo.model_config("gpt", overrides={"layers": 12})["layers"] == 12
  assert zoo.model_config("gpt")["layers"] == 4
  with pytest.raises(WorkloadError, match="no setting depth") as info:
    zoo.model_config("gpt", overrides={"depth": 12})
  assert "\n" not in str(info.value)


def test_bad_batch_raises_workload_error():
  with pytest.raises(WorkloadError):
    zoo.build_program("mlp", 0, train=False, tiny=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(zoo.TINY_MODELS))
def test_tiny_model_compiles_for_inference_and_training(name):
  # Inference: fn(params, inputs) -> outputs with the batch dimension first.
  fn, args = zoo.build_program(name, BATCH, train=False, tiny=True)
  assert len(args) == 2
  variables = args[0]
  trainable = variables["params"] if set(variables) == {"params", "state"} else variables
  param_leaves = jax.tree_util.tree_leaves(trainable)
  assert param_leaves and all(leaf.dtype == np.float32 for leaf in param_leaves)
  compiled = jax.jit(fn).lower(*args).compile()
  outputs = compiled(*args)
  for leaf in jax.tree_util.tree_leaves(outputs):
    assert leaf.shape[0] == BATCH
    assert np.all(np.isfinite(np.asarray(leaf)))

  if not zoo.TINY_MODELS[name].supports_training:
    return
  # Training: fn(params, opt_state, inputs, targets) -> (new_params, new_opt_state, loss).
  fn, args = zoo.build_program(name, BATCH, train=True, tiny=True)
  assert len(args) == 4
  params, opt_state = args[0], args[1]
  compiled = jax.jit(fn).lower(*args).compile()
  hlo = compiled.as_text()
  assert "ENTRY" in hlo
  new_params, new_opt_state, loss = compiled(*args)
  assert jax.tree_util.tree_structure(new_params) == jax.tree_util.tree_structure(params)
  assert _shapes(new_params) == _shapes(params)
  assert jax.tree_util.tree_structure(new_opt_state) == jax.tree_util.tree_structure(opt_state)
  assert _shapes(new_opt_state) == _shapes(opt_state)
  assert np.shape(loss) == () and np.isfinite(float(loss))
  # A real step: the parameters move.
  moved = jax.tree_util.tree_map(
    lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), new_params, params
  )
  assert any(jax.tree_util.tree_leaves(moved))


def test_programs_are_deterministic_in_the_seed():
  _, args_a = zoo.build_program("mlp", 1, train=False, seed=3, tiny=True)
  _, args_b = zoo.build_program("mlp", 1, train=False, seed=3, tiny=True)
  for a, b in zip(jax.tree_util.tree_leaves(args_a), jax.tree_util.tree_leaves(args_b)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_compiled_hlo_text_is_a_scheduled_module():
  text = zoo.compiled_hlo_text("gpt", 1, train=False, tiny=True)
  assert "is_scheduled=true" in text and "ENTRY" in text
