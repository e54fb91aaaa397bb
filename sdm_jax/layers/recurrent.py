"""What the recurrent mixers (dense delta rules, Sparse Delta Memory) share: a fixed-size cache."""

from flax import nnx


class RecurrentMixer(nnx.Module):
  """Subclasses define init_cache(batch, max_len) and extend(x, cache, impl, segment_ids=None) -> (y, cache)."""

  def __call__(self, x, segment_ids=None, positions=None):
    """x: [B, T, width] -> y; segment_ids: None or [B, T], packed documents (DESIGN.md section 9), each run from the
    zero cache as alone. positions matter only to attention."""
    del positions
    return self.extend(x, self.init_cache(x.shape[0]), self.impl, segment_ids=segment_ids)[0]

  def prefill(self, x, max_len=None):
    """x: [B, T, width] with T >= 1 -> (y [B, T, width], the cache after the T tokens)."""
    return self.extend(x, self.init_cache(x.shape[0], max_len), self.impl)

  def step(self, x_t, cache, position=None):
    """x_t: [B, width] -> (y_t [B, width], cache). The position matters only to attention."""
    del position
    # One token is the recurrence itself: the scan reference is the fastest path, and for SDM its
    # token update rewrites only the written rows of the table.
    y, cache = self.extend(x_t[:, None], cache, "scan")
    return y[:, 0], cache
