"""Host time to dispatch one training step: nnx.jit(step)(model, optimizer, batch), which traverses both module
graphs on every call, against `training.steps.TrainStep`, which passes their arrays as one pytree. The model
has the reference model's graph (paper.py:kda_ref, 8 KDA blocks) at tiny widths, so compute is small.

  python benchmarks/scripts/train_step_dispatch.py   # from the repository root; the CPU is enough
"""

import statistics
import sys
import time

import jax
import jax.numpy as jnp
from flax import nnx

sys.path.insert(0, ".")
from experiments.configs import paper  # noqa: E402
from sdm_jax.models import LanguageModel  # noqa: E402
from sdm_jax.training.optimizer import make_optimizer  # noqa: E402
from sdm_jax.models.loss import loss_fn  # noqa: E402
from sdm_jax.training.steps import TrainStep  # noqa: E402

CALLS, REPEATS = 50, 5


@nnx.jit
def nnx_step(model, optimizer, batch):
  (_, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, batch)
  optimizer.update(model, grads)
  return metrics


def dispatch_us(step):
  """Median over REPEATS of the host time per call of CALLS calls issued back to back (warm)."""
  jax.block_until_ready(step())
  times = []
  for _ in range(REPEATS):
    start = time.perf_counter()
    outs = [step() for _ in range(CALLS)]
    times.append((time.perf_counter() - start) / CALLS * 1e6)
    jax.block_until_ready(outs)
  return statistics.median(times)


def main():
  config = paper.get_config("kda_ref")
  config.model.update(width=64, num_heads=2, head_dim=16, value_dim=16, vocab_size=64, dtype="float32",
                      chunk_size=16, remat="none")
  batch = {"inputs": jnp.zeros((1, 16), jnp.int32), "targets": jnp.zeros((1, 16), jnp.int32),
           "mask": jnp.ones((1, 16))}
  fresh = lambda: (lambda m: (m, make_optimizer(m, config.train)))(LanguageModel(config.model, rngs=nnx.Rngs(0)))
  model, optimizer = fresh()
  old = dispatch_us(lambda: nnx_step(model, optimizer, batch))
  model, optimizer = fresh()
  step = TrainStep(model, optimizer)
  new = dispatch_us(lambda: step(batch))
  variables = len(jax.tree.leaves(nnx.state((model, optimizer))))
  print(f"{variables} arrays; host time per step call: nnx.jit {old:.0f} us, TrainStep {new:.0f} us")


if __name__ == "__main__":
  main()
