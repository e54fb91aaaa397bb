"""Runs that differ in their seeds alone, trained in lockstep by one vmapped step (sdm_jax/training/ensemble.py):
each run's directory ends as training it alone leaves it (its losses to the rounding of batched products, its
evaluations, checkpoints and files), a run stops alone at its target accuracy or when it diverges, a second call
trains nothing, and what cannot be trained together is refused before anything is written."""

import numpy as np
import pytest

from sdm_jax.training import ensemble, loop, sweep
from sdm_jax.training.metrics import MetricsLog
from sdm_jax.training.workdir import checkpoint_steps
from training_helpers import attention_config, train_losses


def _configs(steps=6, seeds=(0, 1)):
  config = attention_config(steps)
  config.train.log_every, config.train.eval_every, config.train.checkpoint_every = 2, 3, 3
  return [sweep.seeded(config, seed) for seed in seeds]


def test_each_member_ends_as_its_run_alone(tmp_path):
  configs = _configs()
  alone = [tmp_path / "alone" / f"seed_{i}" for i in range(2)]
  together = [tmp_path / "together" / f"seed_{i}" for i in range(2)]
  for config, workdir in zip(configs, alone):
    loop.train(config, workdir, log=lambda _: None)
  lines = []
  assert ensemble.train_ensemble(configs, together, log=lines.append) == {str(w): 6 for w in together}
  for one, other in zip(alone, together):
    got, want = train_losses(other), train_losses(one)
    assert sorted(got) == sorted(want) == [2, 4, 6]
    np.testing.assert_allclose([got[s] for s in want], [want[s] for s in want], rtol=1e-5)
    evals = lambda w: [(r["step"], r["accuracy"], r["loss"]) for r in MetricsLog(w).read() if r["split"] == "eval"]
    assert [s for s, *_ in evals(other)] == [3, 6]
    np.testing.assert_allclose(np.array(evals(other)), np.array(evals(one)), rtol=1e-5)
    assert checkpoint_steps(other) == checkpoint_steps(one) == [3, 6]
    assert (other / "config.json").exists() and (other / "metrics.png").exists()
  assert train_losses(together[0]) != train_losses(together[1])  # the seeds differ
  assert any(line.startswith("[together/seed_1] eval at step 3") for line in lines)
  # A second call trains nothing.
  records = MetricsLog(together[0]).read()
  assert ensemble.train_ensemble(configs, together, log=lambda _: None) == {str(w): 6 for w in together}
  assert MetricsLog(together[0]).read() == records


def test_a_member_stops_alone_at_its_target_or_when_it_diverges(tmp_path, monkeypatch):
  configs = _configs(steps=9, seeds=(0, 1, 2))
  for config in configs:
    config.train.stop_at_accuracy = 0.9
  workdirs = [tmp_path / f"seed_{i}" for i in range(3)]
  # Evaluations in member order at steps 3, 6, 9: member 0 reaches the target at step 3, the others never.
  scripted = iter([0.95, 0.1, 0.1, 0.2, 0.2, 0.3, 0.3])

  def evaluate(model, config, mesh):
    return {"loss": 1.0, "accuracy": next(scripted), "perplexity": 2.7, "exact_match": 0.0}
  monkeypatch.setattr(loop, "evaluate", evaluate)
  check_finite = loop._check_finite

  def diverge_member_2_after_step_4(fetched, checkpoints):
    if checkpoints.directory.parent.name == "seed_2" and fetched[-1][0] > 4:
      raise loop.TrainingDiverged(f"non-finite loss at step {fetched[-1][0]}")
    check_finite(fetched, checkpoints)
  monkeypatch.setattr(loop, "_check_finite", diverge_member_2_after_step_4)
  outcomes = ensemble.train_ensemble(configs, workdirs, log=lambda _: None)
  assert outcomes[str(workdirs[0])] == 3 and outcomes[str(workdirs[1])] == 9
  assert isinstance(outcomes[str(workdirs[2])], loop.TrainingDiverged)
  assert checkpoint_steps(workdirs[0]) == [3] and loop.final_step(workdirs[0], configs[0].train) == 3
  assert max(r["step"] for r in MetricsLog(workdirs[0]).read()) == 3  # nothing recorded after its end
  assert checkpoint_steps(workdirs[1]) == [3, 6, 9]
  assert checkpoint_steps(workdirs[2]) == [3]  # its last good checkpoint kept


def test_what_cannot_train_together_is_refused_before_anything_is_written(tmp_path):
  configs = _configs()
  other = attention_config(6)
  other.model.width = 64
  with pytest.raises(ValueError, match="differ in seed and data.seed alone; .*seed_1's differs"):
    ensemble.train_ensemble([configs[0], other], [tmp_path / "seed_0", tmp_path / "seed_1"])
  with pytest.raises(ValueError, match="one workdir per config"):
    ensemble.train_ensemble(configs, [tmp_path / "seed_0"])
  with pytest.raises(ValueError, match="distinct directories"):
    ensemble.train_ensemble(configs, [tmp_path / "a", tmp_path / "a"])
  assert not any(tmp_path.iterdir())
  loop.train(configs[0], tmp_path / "seed_0", stop_after=3, log=lambda _: None)  # seed 0 at step 3, seed 1 new
  with pytest.raises(ValueError, match="resume from different steps"):
    ensemble.train_ensemble(configs, [tmp_path / "seed_0", tmp_path / "seed_1"], log=lambda _: None)


def test_a_sweep_trains_each_point_s_seeds_together_and_evaluates_them(tmp_path):
  config = _configs(steps=4)[0]
  lines = []
  outcomes = sweep.sweep(config, config_file="experiments/configs/mqar.py:demo", overrides={},
                         grid="", eval_grid="", seeds=[0, 1], workdir=tmp_path, in_process=True, ensemble=True,
                         log=lines.append)
  assert set(outcomes.values()) == {"done"} and len(outcomes) == 2
  assert sum("trained together" in line for line in lines) == 1
  assert "ensemble: seed_0, seed_1 trained together" in lines
  for name in outcomes:
    assert sweep._read_json(tmp_path / name / sweep.EVAL)["step"] == 4
    assert checkpoint_steps(tmp_path / name)[-1] == 4
  assert not any(line.strip().startswith("model:") for line in lines)  # train() alone never ran: each run evaluated


def test_ensemble_shards_keep_a_point_s_seeds_together(tmp_path, monkeypatch):
  groups, calls = [], []
  monkeypatch.setattr(sweep, "ensemble_trainer", lambda eval_batches=None: lambda runs, log: groups.append(
      [run.name for run in runs]))
  config = _configs(steps=4)[0]
  for index in (0, 1):
    sweep.sweep(config, config_file="experiments/configs/mqar.py:demo", overrides={}, grid="model.num_heads=1|2",
                eval_grid="", seeds=[0, 1], workdir=tmp_path, in_process=True, ensemble=True, shard=(index, 2),
                runner=lambda run_dir, log: calls.append(run_dir.name), log=lambda _: None)
  assert groups == [["num_heads-1/seed_0", "num_heads-1/seed_1"], ["num_heads-2/seed_0", "num_heads-2/seed_1"]]
  with pytest.raises(sweep.ConfigError, match="--ensemble: .* expected --in_process"):
    sweep.sweep(config, config_file="experiments/configs/mqar.py:demo", overrides={}, grid="", eval_grid="",
                seeds=[0, 1], workdir=tmp_path, ensemble=True, log=lambda _: None)


def test_the_pallas_op_vmapped_over_members_lowers_for_cuda(monkeypatch):
  """The ensemble's step vmaps the Pallas launches (a grid axis more, custom_vjp included): the batched gradient of
  the GDN-2 op lowers for an abstract H200 with the launches of one member's."""
  import jax
  import jax.numpy as jnp
  from sdm_jax.testing.inputs import make_inputs
  from sdm_jax.testing.lowering import TRITON_CALL, lower_for_h200
  from sdm_jax.ops import pallas
  from sdm_jax.testing.runs import call
  monkeypatch.setattr(pallas, "interpret", lambda: False)  # the launches as a GPU runs them, lowered on the CPU
  inputs = make_inputs("gdn2", 1, 64, 2, 16, 16, 1.0, "random", 0, jnp.bfloat16, initial_state=False)

  def loss(inputs):
    return jnp.sum(call("gdn2", inputs, impl="pallas", chunk_size=32)[0].astype(jnp.float32))

  one = lower_for_h200(jax.grad(loss), jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), inputs))
  members = lower_for_h200(jax.vmap(jax.grad(loss)), jax.tree.map(
      lambda x: jax.ShapeDtypeStruct((3, *x.shape), x.dtype), inputs))
  assert members.count(TRITON_CALL) == one.count(TRITON_CALL) > 0
