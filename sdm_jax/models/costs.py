"""What a model config costs, from shapes alone: parameters, training FLOPs per token and the recurrent state.

The state is what each layer carries from one token to the next for one sequence, its decoding cache without the
short convolutions' last inputs (a few tokens of width, the same for every mixer): a dense mixer's S
(H x d_k x d_v), the SDM table (H x N x d_v), the keys and values attention keeps (its window for sliding-window
attention, the whole sequence for full attention). Zoology puts recall accuracy against this number.
"""

import math

import jax
from flax import nnx

# The entries of a layer's decoding cache that are its memory (the rest are conv histories).
STATE_ENTRIES = ("S", "M", "k", "v")


def _abstract_model(model_config):
  from sdm_jax.models.lm import LanguageModel
  return nnx.eval_shape(lambda: LanguageModel(model_config, rngs=nnx.Rngs(0)))


def state_per_layer(model_config, seq_len):
  """[(layer letter, elements, bytes)] of each layer's state for one sequence of seq_len tokens."""
  from sdm_jax.models.lm import layer_letters
  graphdef, params = nnx.split(_abstract_model(model_config))
  caches = jax.eval_shape(lambda p: nnx.merge(graphdef, p).init_cache(1, seq_len), params)
  layers = []
  for letter, cache in zip(layer_letters(model_config.pattern, model_config.num_layers), caches):
    entries = [cache[name] for name in STATE_ENTRIES if name in cache]
    layers.append((letter, sum(math.prod(x.shape) for x in entries),
                   sum(math.prod(x.shape) * x.dtype.itemsize for x in entries)))
  return layers


def mixer_flops_per_token(model_config, seq_len):
  """The token mixers' own FLOPs per token, forward + backward (3x forward), over all layers: what
  6 x parameters leaves out; each layer kind's own count is its `layer_kinds.LayerKind.flops`."""
  from sdm_jax.models.layer_kinds import LAYERS
  from sdm_jax.models.lm import layer_letters
  return sum(3 * LAYERS[letter].flops(model_config, seq_len)
             for letter in layer_letters(model_config.pattern, model_config.num_layers))


def param_counts(model_config):
  """{"params": all of them, "embedding": the token embedding, "head": the output head, "tables": the SDM layers'
  learned initial tables m0 (H x N x d_v each: memory, not weights a token multiplies), "blocks": the rest (the
  mixers, MLPs and norms)}."""
  state = nnx.state(_abstract_model(model_config), nnx.Param)
  counts = {"params": 0, "embedding": 0, "head": 0, "tables": 0, "blocks": 0}
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    names = [getattr(key, "key", getattr(key, "name", None)) for key in path]
    size = math.prod(leaf.shape)
    part = ("embedding" if names[0] == "embed" else "head" if names[0] == "head" else
            "tables" if "m0" in names else "blocks")
    counts[part] += size
    counts["params"] += size
  return counts


def flops_per_token(model_config, seq_len, counts=None):
  """Training (forward + backward) FLOPs per token: 6 x every parameter a token multiplies (blocks and head; not the
  embedding lookup, not the SDM tables, whose row work mixer_flops_per_token counts) plus the token mixers' own
  work at seq_len (the count benchmarking's MFU is taken with)."""
  counts = counts or param_counts(model_config)
  head = counts["embedding"] if model_config.get("tie_embeddings", False) else counts["head"]  # a tied head multiplies
  return 6 * (counts["blocks"] + head) + mixer_flops_per_token(model_config, seq_len)


def model_numbers(model_config, seq_len):
  """{"params", "block_params", "table_params", "flops_per_token", "state_elements", "state_bytes",
  "state_per_layer"} of a model config at seq_len."""
  counts = param_counts(model_config)
  layers = state_per_layer(model_config, seq_len)
  return {"params": counts["params"], "block_params": counts["blocks"], "table_params": counts["tables"],
          "flops_per_token": flops_per_token(model_config, seq_len, counts),
          "state_elements": sum(elements for _, elements, _ in layers),
          "state_bytes": sum(size for _, _, size in layers),
          "state_per_layer": [{"layer": letter, "elements": elements, "bytes": size}
                              for letter, elements, size in layers]}
