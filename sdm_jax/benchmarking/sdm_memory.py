"""Compiled memory of Sparse Delta Memory's forward+backward: the chunked op's memory-lean
backward against plain autodiff through the token scan (XLA's memory analysis; nothing runs)."""

import jax
import jax.numpy as jnp

from sdm_jax.ops import sparse_delta_rule


def compiled_memory(impl, *, B=1, T=4096, H=2, N=65536, V=256, W=64, R=64, chunk_size=16):
  """Returns XLA's memory analysis (bytes) of jit(grad(loss)) for one impl, compiled for abstract inputs."""
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
  floats = {"m0": f32(H, N, V), "k_w": f32(B, T, H, W), "v": f32(B, T, H, V), "g": f32(B, T, H),
            "beta": f32(B, T, H), "q_w": f32(B, T, H, R)}

  def loss(floats, k_idx, q_idx):
    o, table = sparse_delta_rule(k_idx=k_idx, q_idx=q_idx, **floats, impl=impl, chunk_size=chunk_size,
                                 output_final_state=True)
    return jnp.sum(o) + jnp.sum(table)

  compiled = jax.jit(jax.grad(loss)).lower(floats, i32(B, T, H, W), i32(B, T, H, R)).compile()
  stats = compiled.memory_analysis()
  return {"temp_bytes": stats.temp_size_in_bytes, "argument_bytes": stats.argument_size_in_bytes,
          "output_bytes": stats.output_size_in_bytes,
          "total_bytes": stats.temp_size_in_bytes + stats.argument_size_in_bytes + stats.output_size_in_bytes}
