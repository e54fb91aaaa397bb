r"""The CPU probe of benchmarks/recall/README.md: an MQAR config trained in this process with the training loop's
model, optimizer and data, and the train batch's loss, accuracy and gradient norm printed every --every steps;
no checkpoints or evaluations. Only the scored positions (num_queries a row) reach the head: the loss is the
loss_fn's, for a fraction of the logits. Stops once two logged accuracies in a row pass 0.95.

  .venv/bin/python benchmarks/recall/mqar_probe.py --variant=gdn2 --set=data.vocab_size=8192 \
      --set=model.tie_embeddings=True --set=train.steps=1500
"""

import argparse
import ast
import sys
import time

sys.path.insert(0, ".")


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--variant", default="gdn2", help="a variant of experiments/configs/mqar.py")
  parser.add_argument("--set", action="append", default=[], help="section.field=value, any number of times")
  parser.add_argument("--every", type=int, default=25)
  args = parser.parse_args()

  import jax
  import jax.numpy as jnp
  import optax
  from flax import nnx

  from experiments.configs import mqar
  from sdm_jax.data import make_iterator
  from sdm_jax.models import LanguageModel
  from sdm_jax.models.loss import masked_metrics, token_scores
  from sdm_jax.training.optimizer import make_optimizer

  config = mqar.get_config(args.variant)
  config.model.impl = "scan"  # the quickest on a CPU at these lengths; the same numbers as "chunk"
  for item in args.set:
    field, _, text = item.partition("=")
    section, name = field.split(".")
    current = config[section][name]
    config[section][name] = text if isinstance(current, str) else type(current)(ast.literal_eval(text))
  config.model.vocab_size = config.data.vocab_size
  model = LanguageModel(config.model, rngs=nnx.Rngs(config.seed))
  optimizer = make_optimizer(model, config.train)
  batches = make_iterator(config, "train")
  queries = config.data.num_queries

  def loss(model, batch):
    features = model.features(batch["inputs"])
    scored = jnp.argsort(-batch["mask"], axis=1, stable=True)[:, :queries]
    take = lambda x: jnp.take_along_axis(x, scored.reshape(scored.shape + (1,) * (x.ndim - 2)), axis=1)
    nll, correct = token_scores(take(features), model.head.kernel[...], take(batch["targets"]))
    return masked_metrics(nll, correct, take(batch["mask"]))

  @nnx.jit
  def step(model, optimizer, batch):
    (_, metrics), grads = nnx.value_and_grad(loss, has_aux=True)(model, batch)
    optimizer.update(model, grads)
    return {**metrics, "grad_norm": optax.tree.norm(grads)}

  start, accuracies = time.time(), []
  for i in range(1, config.train.steps + 1):
    metrics = step(model, optimizer, next(batches))
    if i % args.every == 0:
      metrics = jax.device_get(metrics)
      accuracies.append(float(metrics["accuracy"]))
      print(f"step {i} loss {float(metrics['loss']):.3f} acc {accuracies[-1]:.3f} "
            f"gn {float(metrics['grad_norm']):.2f} t {time.time() - start:.0f}s", flush=True)
      if len(accuracies) >= 2 and min(accuracies[-2:]) > 0.95:
        print("reached", i, flush=True)
        break


if __name__ == "__main__":  # grain's workers import this module again
  main()
