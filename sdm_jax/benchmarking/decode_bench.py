"""Decode throughput and memory of whole language models at long contexts, against full attention: the
registry's `decode` mode.

What is timed: `steps` greedy decoding steps (model.step, the argmax token fed back) in one jitted
lax.scan, from sequence position `context` on; the median of `reps` device-synchronised runs after
one warm-up. tokens/s = batch * steps / time, ms/step = time / steps, and vs_attention = the
full-attention model's ms/step / ours at the same (batch, context) (above 1: faster than attention).

The cache at `context` is init_cache(batch, max_len=context + steps) with decoding starting at
position = context, not a prefill of `context` tokens (quadratic in attention, and minutes a point).
A step does the same work whatever the cache holds: the recurrent layers' caches have fixed shapes
(the dense state [B, H, K, V], the SDM table [B, H, N, V], the conv histories, the sliding window's
ring of `window` slots), and full attention scores its query against all max_len slots of its buffer,
masking those after `position`, so its cost grows with the buffer as for a cache that really holds
`context` tokens (plus the `steps` being decoded). Zeros in place of real keys and values change no
FLOP and no byte moved.

Memory per sequence: the bytes of the cache that holds `context` tokens, init_cache(batch, context)
(from its shapes; nothing is allocated) / batch. Also recorded: XLA's temporary bytes of the compiled
decode and, on a GPU, the device's peak bytes in use, a running peak since the process started (JAX
cannot reset it), so exact only for the point that raised it.

The cache is donated to the decode and each run hands its cache on to the next, so a point holds one
cache. A recurrent model's cache shapes do not depend on the context and the position is traced, so
one compiled decode serves every context of a batch size; full attention compiles per (batch, context).
"""

import dataclasses
import math
import time

import jax
import jax.numpy as jnp
from flax import nnx

from sdm_jax.benchmarking.tables import Column, table, write_tables
from sdm_jax.benchmarking.timing import error_text, median_ms, peak_device_bytes, run_metadata
from sdm_jax.models import LanguageModel, layer_letters
from sdm_jax.models.config import VARIANTS, variant_config
from sdm_jax.training.config import dotted_field

# The name of the full-attention model in a sweep: the peer every other model is compared with.
ATTENTION = "attention"
CHOICES = VARIANTS + (ATTENTION,)
# The model fields a report's header shows; the JSON keeps every field of every model.
SHOWN_FIELDS = ("width", "num_layers", "num_heads", "head_dim", "dtype", "window", "sdm.num_heads", "sdm.num_slots",
                "sdm.topk_write", "sdm.topk_read", "sdm.value_dim")
MEASURED = ("ms_per_step", "tokens_per_s", "vs_attention", "compile_s", "temp_bytes", "device_peak_bytes")


def model_configs(variants, *, vocab_size, width, num_layers, num_heads, head_dim, overrides=()):
  """{variant: its LanguageModel config}; every model gets the same width, layers and heads.

  overrides: "field=value" strings, each set on every config (the value converted to the field's type).
  """
  unknown = [v for v in variants if v not in CHOICES]
  if unknown or not variants:
    raise ValueError(f"variants: expected some of {CHOICES}, got {list(variants)}")
  configs = {}
  for variant in variants:
    # A full-attention model is any variant's config with every layer attention: the mixer goes unused.
    config = variant_config(VARIANTS[0] if variant == ATTENTION else variant, vocab_size, width=width,
                            num_heads=num_heads, head_dim=head_dim)
    config.pattern = "A" if variant == ATTENTION else config.pattern
    config.num_layers = num_layers
    for item in overrides:
      _override(config, item)
    if set(layer_letters(config.pattern, num_layers)) != set(config.pattern):
      raise ValueError(f"layers: {variant}'s pattern {config.pattern!r} needs at least {len(config.pattern)} "
                       f"layers, got {num_layers}")
    configs[variant] = config
  return configs


def _override(config, item):
  field, _, value = item.partition("=")
  if (found := dotted_field(config, field)) is None or not value:
    raise ValueError(f"overrides: expected field=value with a field of {sorted(config)} (nested ones dotted, e.g. "
                     f"sdm.num_slots), got {item!r}")
  parent, name = found
  parent[name] = type(parent[name])(value)


def cache_bytes(model, batch, max_len):
  """Bytes of model.init_cache(batch, max_len), from its shapes alone."""
  shapes = jax.eval_shape(lambda: model.init_cache(batch, max_len))
  return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(shapes))


def make_decode(graphdef, steps):
  """(state, cache, token [B], position) -> (the last token [B], cache): `steps` greedy steps from position on."""
  def decode(state, cache, token, position):
    model = nnx.merge(graphdef, state)

    def step(carry, position):
      token, cache = carry
      logits, cache = model.step(token, cache, position)
      return (jnp.argmax(logits, axis=-1).astype(jnp.int32), cache), None

    (token, cache), _ = jax.lax.scan(step, (token, cache), position + jnp.arange(steps))
    return token, cache
  return decode


def compile_decode(decode, state, cache, token, position):
  """jit(decode) with the cache donated, compiled for these arguments; returns (compiled, seconds)."""
  start = time.perf_counter()
  compiled = jax.jit(decode, donate_argnums=1).lower(state, cache, token, position).compile()
  return compiled, time.perf_counter() - start


def time_decode(compiled, state, cache, token, position, reps):
  """Median ms of one decode; every run decodes from `position` on the cache the previous run returned."""
  held = {"cache": cache}

  def run():
    last_token, held["cache"] = compiled(state, held["cache"], token, position)
    return last_token

  return median_ms(run, [()], reps)


def _signature(tree):
  return jax.tree.structure(tree), tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves(tree))


def time_point(model, batch, context, *, steps, reps, compiled_decodes, name):
  """Times one (model, batch, context); returns {ms_per_step, tokens_per_s, compile_s, temp_bytes, device_peak_bytes}.

  compiled_decodes: {(name, cache signature): (compiled, compile seconds)}, filled and reused;
  compile_s is None where a compiled decode was reused.
  """
  graphdef, state = nnx.split(model)
  cache = model.init_cache(batch, context + steps)
  token, position = jnp.zeros((batch,), jnp.int32), jnp.int32(context)
  key = (name, _signature(cache))
  compiled_now = key not in compiled_decodes
  if compiled_now:
    compiled_decodes[key] = compile_decode(make_decode(graphdef, steps), state, cache, token, position)
  compiled, compile_s = compiled_decodes[key]
  ms = time_decode(compiled, state, cache, token, position, reps)
  memory = compiled.memory_analysis()
  return {"ms_per_step": ms / steps, "tokens_per_s": batch * steps / (ms * 1e-3),
          "compile_s": compile_s if compiled_now else None,
          "temp_bytes": memory.temp_size_in_bytes if memory else None, "device_peak_bytes": peak_device_bytes()}


def link_attention(records):
  """Sets vs_attention = attention ms/step / ours on every timed record whose attention point is timed."""
  attention = {(r["batch"], r["context"]): r["ms_per_step"] for r in records
               if r["variant"] == ATTENTION and r["ms_per_step"]}
  for r in records:
    peer = attention.get((r["batch"], r["context"]))
    r["vs_attention"] = peer / r["ms_per_step"] if peer and r["ms_per_step"] else None


def run_sweep(configs, batches, contexts, *, steps=64, reps=5, seed=0, log=print, on_progress=None):
  """Times every (model, batch, context); configs: {name: LanguageModel config}, ATTENTION the peer.

  Returns the records, one per point, in sweep order. A point that fails (out of memory, say) is
  recorded with its error and the sweep goes on. on_progress(records), if given, is called after
  every point, so a sweep cut off by a time limit still leaves what it measured.
  """
  for name, values in (("batches", batches), ("contexts", contexts)):
    if not values or any(v < 1 for v in values):
      raise ValueError(f"{name}: expected positive integers, got {values}")
  if steps < 1 or reps < 1:
    raise ValueError(f"steps, reps: expected positive integers, got {steps}, {reps}")
  records, compiled_decodes = [], {}
  for name, config in configs.items():
    model = LanguageModel(config, rngs=nnx.Rngs(seed))
    pattern = layer_letters(config.pattern, config.num_layers)
    for batch in batches:
      for context in contexts:
        log(f"{name} ({pattern}) B={batch} context={context}: timing {steps} steps...")
        record = {"variant": name, "pattern": pattern, "batch": batch, "context": context, "steps": steps,
                  "cache_bytes_per_seq": cache_bytes(model, batch, context) / batch,
                  **dict.fromkeys(MEASURED), "error": None}
        try:
          record.update(time_point(model, batch, context, steps=steps, reps=reps,
                                   compiled_decodes=compiled_decodes, name=name))
          log(f"  {record['ms_per_step']:.3f} ms/step, {record['tokens_per_s']:.0f} tokens/s")
        except Exception as error:
          record["error"] = error_text(error)
          log(f"  failed: {record['error']}")
        records.append(record)
        link_attention(records)
        if on_progress is not None:
          on_progress(records)
  return records


# One row per (model, batch, context).
COLUMNS = (
    Column("model", "variant"), Column("layers", "pattern"), Column("B", "batch", "d"),
    Column("context", "context", "d"),
    Column("ms/step", "ms_per_step", ".3f"), Column("tokens/s", "tokens_per_s", ",.0f"),
    Column("vs attention", "vs_attention", ".2f", suffix="x"),
    Column("cache MiB/seq", "cache_bytes_per_seq", ".3f", 2**20),
    Column("device peak GiB", "device_peak_bytes", ".1f", 2**30), Column("note", lambda r: r["error"] or ""))


def format_table(records):
  """A markdown table: one row per (model, batch, context)."""
  return table(COLUMNS, records)


def plot_decode(records, path):
  """Top: tokens/s against context, a panel per batch size; bottom: cache bytes per sequence; a line per model."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  batches = sorted({r["batch"] for r in records})
  contexts = sorted({r["context"] for r in records})
  fig, axes = plt.subplot_mosaic([[f"B={b}" for b in batches], ["memory"] * len(batches)],
                                 figsize=(5.5 * len(batches), 8))
  names = list(dict.fromkeys(r["variant"] for r in records))
  panels = [(axes[f"B={b}"], b, "tokens_per_s", "decode tokens / s", f"batch {b}") for b in batches]
  panels.append((axes["memory"], batches[0], "cache_bytes_per_seq", "cache bytes / sequence", "memory per sequence"))
  for ax, batch, key, ylabel, title in panels:
    for name in names:
      points = sorted((r["context"], r[key]) for r in records
                      if (r["variant"], r["batch"]) == (name, batch) and r[key])
      if points:
        ax.plot(*zip(*points), marker="o", linestyle="--" if name == ATTENTION else "-", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(contexts, [str(c) for c in contexts])
    ax.minorticks_off()
    ax.set(yscale="log", xlabel="context (tokens already in the cache)", ylabel=ylabel, title=title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_report(records, meta, out_dir, tag, *, plot=True):
  """Writes <out_dir>/<date>_<tag>.{json,md} and, where plot, .png; returns their paths.

  A plot takes most of a second, too long to redraw after every short point.
  """
  notes = []
  if meta.get("model_configs"):
    first = next(iter(meta["model_configs"].values()))
    def value(field):
      parent, name = dotted_field(first, field)
      return parent[name]
    notes += ["- every model: " + ", ".join(f"{field}={value(field)}" for field in SHOWN_FIELDS)]
  notes += [
             "- method: greedy decoding of `steps` tokens in one jitted lax.scan of model.step, median of `reps` "
             "synchronised runs after a warm-up, from a cache init_cache(B, context + steps) entered at "
             "position = context (a step costs the same whatever the cache holds; full attention scores every "
             "slot of its buffer and masks the unwritten ones)",
             "- tokens/s = B * steps / time; vs attention = attention ms/step / ours at the same B and context "
             "(above 1: faster); cache MiB/seq = bytes of init_cache(B, context) / B; device peak = running peak "
             "of the process's device memory (JAX cannot reset it)"]
  paths = write_tables(records, meta, out_dir, tag, "Decode throughput", notes, format_table(records))
  if plot:
    plot_decode(records, paths["png"])
  return paths


def _model_configs(settings):
  s = settings
  return model_configs(s.variants, vocab_size=s.vocab_size, width=s.width, num_layers=s.layers, num_heads=s.heads,
                       head_dim=s.head_dim, overrides=s.overrides)


def check_settings(settings):
  """ValueError naming the setting unless `settings` (registry.DecodeSettings) can run."""
  _model_configs(settings)
  for name in ("batches", "contexts"):
    values = getattr(settings, name)
    if not values or min(values) < 1:
      raise ValueError(f"{name}: expected positive integers, got {list(values)}")


def bench(settings, out_dir, tag, log=print):
  """The `decode` mode: run_sweep over `settings` (registry.DecodeSettings), the JSON and markdown rewritten after
  every point and the plot once a (model, batch) has all its contexts; returns (records, paths)."""
  s = settings
  configs = _model_configs(s)
  meta = {**run_metadata(), "config": dataclasses.asdict(s),
          "model_configs": {name: c.to_dict() for name, c in configs.items()}}
  progress = lambda records: write_report(records, meta, out_dir, tag, plot=len(records) % len(s.contexts) == 0)
  records = run_sweep(configs, list(s.batches), list(s.contexts), steps=s.steps, reps=s.reps, seed=s.seed, log=log,
                      on_progress=progress)
  paths = write_report(records, meta, out_dir, tag)
  log("\nwrote " + ", ".join(paths.values()))
  log(f"\n{meta['device']}; vs attention = attention ms/step / ours\n" + format_table(records))
  return records, paths
