"""The language model: token embedding, a stack of pre-norm blocks named by a pattern string, RMSNorm, head;
prefill and step for recurrent decoding, whose recurrent layers keep a cache that does not grow with the sequence."""

import jax
import jax.numpy as jnp
from flax import nnx

from sdm_jax.layers import Block, RMSNorm
from sdm_jax.layers.init import normal
from sdm_jax.models.layer_kinds import LAYERS
from sdm_jax.models.generate import generate
from sdm_jax.ops.product_key import SLOTS_NAME
from sdm_jax.ops.segments import document_positions

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# How the embedding, the MLPs and an own head start (config.init): "fla" as fla's models (`_init_weights`,
# initializer_range 0.02), "lecun" flax's defaults.
MODEL_INITS = {
    "fla": {"embed": normal(0.02), "linear": normal(0.02)},
    "lecun": {"embed": nnx.initializers.variance_scaling(1.0, "fan_in", "normal", out_axis=0),
              "linear": nnx.initializers.lecun_normal()},
}


_saves_slots = jax.checkpoint_policies.save_only_these_names(SLOTS_NAME)


def _dots_and_kernel_outputs(prim, *args, **params):
  # The matmuls' outputs and what the Pallas kernels write: a mixer's output and what its custom_vjp keeps
  # for the backward (0.68 GiB per KDA layer at B x T = 4 x 4096), which "dots" would form again by running
  # the op's forward in the backward. Also the slots product-key addressing selects (33.6 MB per SDM layer and
  # query at the reference shape), which the backward would otherwise select again with XLA's top-k sorts.
  return (prim.name == "pallas_call" or _saves_slots(prim, *args, **params)
          or jax.checkpoint_policies.dots_with_no_batch_dims_saveable(prim, *args, **params))


# What each block keeps for its backward (jax.checkpoint policies; none of them changes the result):
# "none" keeps everything, "block" only the block's input (the backward runs the block again), "dots" the
# outputs of the matmuls without batch dimensions (the projections and the MLP) and recomputes the rest,
# the mixer ops included, "dots_kernels" those, what the Pallas kernels write (the mixer ops do not run
# again) and the SDM layers' slots. Measured at the reference shape: benchmarks/train/.
REMAT_POLICIES = {"none": None, "block": jax.checkpoint_policies.nothing_saveable,
                  "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
                  "dots_kernels": _dots_and_kernel_outputs}


def layer_letters(pattern, num_layers):
  """The pattern repeated or truncated to num_layers letters, e.g. ("DDDA", 6) -> "DDDADD"."""
  if not pattern or set(pattern) - set(LAYERS):
    kinds = {letter: kind.doc for letter, kind in LAYERS.items()}
    raise ValueError(f"pattern: expected a non-empty string of {sorted(LAYERS)} ({kinds}), got {pattern!r}")
  return (pattern * -(-num_layers // len(pattern)))[:num_layers]


def mlp_hidden(config):
  """The SwiGLU's hidden width: config.mlp_hidden, or round(mlp_ratio * width) when it is None."""
  return config.get("mlp_hidden") or round(config.mlp_ratio * config.width)


class TiedHead(nnx.Module):
  """The output head that is the token embedding: logits = x E^T. `kernel` is E^T [width, vocab] (what the loss
  reads as model.head.kernel[...]); it owns no parameters of its own."""

  def __init__(self, embed, *, dtype):
    self.embed, self.dtype = embed, dtype
    self.out_features = embed.num_embeddings

  @property
  def kernel(self):
    return self.embed.embedding[...].T

  def __call__(self, x):
    return jnp.dot(x, self.kernel.astype(self.dtype), preferred_element_type=jnp.float32)


class LanguageModel(nnx.Module):
  """tokens: [B, T] int32 -> logits: [B, T, vocab_size] fp32.

  Parameters are fp32; activations run in config.dtype. The output head is its own Linear, or the token embedding
  with config.tie_embeddings (Zoology's models: a recalled value's logit is then its own embedding's dot product,
  which every position trains, instead of a head row that only that value's rare targets train).
  """

  def __init__(self, config, *, rngs):
    if config.dtype not in DTYPES:
      raise ValueError(f"dtype: expected one of {tuple(DTYPES)}, got {config.dtype!r}")
    dtype = DTYPES[config.dtype]
    remat = config.get("remat", "none")  # configs saved before the field existed
    if remat not in REMAT_POLICIES:
      raise ValueError(f"remat: expected one of {tuple(REMAT_POLICIES)}, got {remat!r}")
    init = config.get("init", "lecun")  # configs saved before the field existed
    if init not in MODEL_INITS:
      raise ValueError(f"init: expected one of {tuple(MODEL_INITS)}, got {init!r}")
    init, width, norm_eps = MODEL_INITS[init], config.width, config.get("norm_eps", 1e-6)
    self.embed = nnx.Embed(config.vocab_size, width, dtype=dtype, embedding_init=init["embed"], rngs=rngs)
    self.blocks = nnx.List([
        Block(LAYERS[letter].build(config, dtype, rngs), width, mlp_hidden=mlp_hidden(config),
              norm_eps=norm_eps, mlp_init=init["linear"], dtype=dtype, rngs=rngs)
        for letter in layer_letters(config.pattern, config.num_layers)])
    self.final_norm = RMSNorm(width, eps=norm_eps)
    if config.get("tie_embeddings", False):  # configs saved before the field existed
      self.head = TiedHead(self.embed, dtype=dtype)
    else:
      self.head = nnx.Linear(width, config.vocab_size, use_bias=False, dtype=dtype, kernel_init=init["linear"],
                             preferred_element_type=jnp.float32, rngs=rngs)
    self.remat = remat

  def __call__(self, tokens, segment_ids=None, positions=None):
    return self.head(self.features(tokens, segment_ids, positions)).astype(jnp.float32)

  def features(self, tokens, segment_ids=None, positions=None):
    """tokens: [B, T] -> the final norm's output [B, T, width], what the head maps to logits (the training
    loss scores it chunk by chunk, `models.loss.token_scores`).

    segment_ids, positions: None or int [B, T], documents packed into rows (DESIGN.md section 9; a batch's
    "segment_ids" and "positions"): every document is modelled as alone -- the recurrences restart, the convs
    and attention do not see across a boundary -- and RoPE takes positions (default: the position inside each
    document when packed, else 0 .. T - 1). Padding (id 0) affects no document."""
    if positions is None and segment_ids is not None:
      positions = document_positions(segment_ids)
    x = self.embed(tokens)
    run = lambda block, x, segment_ids, positions: block(x, segment_ids, positions)
    if self.remat != "none":
      run = nnx.remat(run, policy=REMAT_POLICIES[self.remat])
    for block in self.blocks:
      x = run(block, x, segment_ids, positions)
    return self.final_norm(x)

  def logits(self, x):
    return self.head(self.final_norm(x)).astype(jnp.float32)

  def init_cache(self, batch, max_len):
    """The decoding cache before any token: a list of the blocks' caches (dicts of arrays, a pytree).

    max_len bounds the sequence (prompt and generated tokens) that full attention keeps.
    """
    return [block.mixer.init_cache(batch, max_len) for block in self.blocks]

  def prefill(self, tokens, *, max_len):
    """tokens: [B, T1] (T1 may be 0) -> (logits [B, T1, vocab_size], the cache after them).

    The mixers run their chunked (training) paths over the prompt.
    """
    B, T1 = tokens.shape
    if T1 > max_len:
      raise ValueError(f"max_len: expected at least the prompt length {T1}, got {max_len}")
    if T1 == 0:
      return jnp.zeros((B, 0, self.head.out_features), jnp.float32), self.init_cache(B, max_len)
    x = self.embed(tokens)
    cache = []
    for block in self.blocks:
      x, block_cache = block.prefill(x, max_len)
      cache.append(block_cache)
    return self.logits(x), cache

  def step(self, token, cache, position):
    """token: [B] int at sequence index position (a scalar < max_len) -> (logits [B, vocab_size], cache)."""
    x = self.embed(token)
    new_cache = []
    for block, block_cache in zip(self.blocks, cache):
      x, block_cache = block.step(x, block_cache, position)
      new_cache.append(block_cache)
    return self.logits(x), new_cache

  def generate(self, prompt, max_new_tokens, *, temperature=0.0, top_k=None, seed=0):
    """prompt: [B, T1] int, T1 >= 1 -> the next tokens [B, max_new_tokens] int32 (see `generate.generate`)."""
    return generate(self, prompt, max_new_tokens, temperature=temperature, top_k=top_k, seed=seed)
