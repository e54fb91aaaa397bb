r"""Whole-model training steps of our language model: ms/step, tokens/s, peak device memory, model FLOPs
utilisation (DESIGN.md section 7), one model config per process so that each peak is its own: the registry's
`train` mode.

`measure(spec)` runs in the process it is called in; `run(specs, ...)` starts one process per spec (ours
through this module's __main__, fla's through `peer_train`), collects their JSON lines and writes the report
(`<out_dir>/<date>_<tag>.{json,md,png}`) after every entry, so a run cut short keeps what it measured. Where torch
cannot run a peer here (`fla_peer.unavailable`), `bench` leaves the peers out and says so in the report.
"""

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from sdm_jax.benchmarking import tables
from sdm_jax.benchmarking.tables import Column
from sdm_jax.models.costs import mixer_flops_per_token
from sdm_jax.models.loss import LOSS_CHUNK_TOKENS
from sdm_jax.training.config import dotted_field

# The H200's dense bf16 rate that model FLOPs utilisation is taken against (DESIGN.md section 7).
PEAK_FLOPS = 790e12
# Cross-entropy targets drawn uniformly: the step's cost does not depend on the tokens.
NUM_BATCH_SETS = 3


class RandomTokens:
  """An endless iterator of {"inputs", "targets", "mask"} host batches of uniform token ids, cycling through
  NUM_BATCH_SETS sets (rotated inputs), with the get_state of a data iterator. docs >= 2: packed rows of that many
  documents at random boundaries, each set its own, with the "segment_ids" and "positions" of a packed corpus
  batch (DESIGN.md section 9)."""

  def __init__(self, batch, seq_len, vocab_size, seed=0, docs=0):
    from sdm_jax.testing.inputs import document_ids
    from sdm_jax.ops.segments import document_positions
    rng = np.random.default_rng(seed)
    self.sets = [{"inputs": rng.integers(0, vocab_size, (batch, seq_len), dtype=np.int32),
                  "targets": rng.integers(0, vocab_size, (batch, seq_len), dtype=np.int32),
                  "mask": np.ones((batch, seq_len), np.float32)} for _ in range(NUM_BATCH_SETS)]
    for i, batch_set in enumerate(self.sets if docs else ()):
      ids = document_ids(batch, seq_len, docs, seed=seed + i)
      batch_set.update(segment_ids=ids, positions=np.asarray(document_positions(ids)))
    self.index = 0

  def __next__(self):
    batch = self.sets[self.index % NUM_BATCH_SETS]
    self.index += 1
    return batch

  def get_state(self):
    return {"next_index": self.index}


def measure(spec):
  """Times spec["steps"] training steps of the model config spec["model"] (a dict) at spec["batch"] x
  spec["seq_len"] after spec["warmup"] steps; returns a JSON-able dict.

  Two timers: "synced" fetches the metrics after every step (the old loop), "loop" runs the training
  program's own loop machinery (`training.loop.prefetch_to_device`, `TrainStep`, metrics fetched every
  spec["log_every"] steps) and divides its wall time by the steps.
  """
  import jax
  import ml_collections
  from flax import nnx

  from sdm_jax.benchmarking.timing import kernel_summary, peak_device_bytes
  from sdm_jax.models import LanguageModel, count_params
  from sdm_jax.models.sharding import make_mesh, place_state
  from sdm_jax.training.loop import prefetch_to_device
  from sdm_jax.training.optimizer import make_optimizer
  from sdm_jax.training.steps import TrainStep

  model_config = ml_collections.ConfigDict(spec["model"])
  train_config = ml_collections.ConfigDict(spec["train"])
  B, T, steps, log_every = spec["batch"], spec["seq_len"], spec["steps"], spec["log_every"]
  result = {"name": spec["name"], "side": "ours", "batch": B, "seq_len": T, "docs": spec.get("docs", 0),
            "model": spec["model"], "device": jax.devices()[0].device_kind, "jax_version": jax.__version__}
  mesh = make_mesh()
  fsdp = bool(train_config.get("fsdp", False))
  model = LanguageModel(model_config, rngs=nnx.Rngs(0))
  place_state(model, mesh, fsdp)
  optimizer = make_optimizer(model, train_config)
  place_state(optimizer, mesh, fsdp)
  result.update(devices=jax.device_count(), fsdp=fsdp)
  params = count_params(model)
  embedding = int(np.prod(model.embed.embedding.shape))
  result.update(params=params, non_embedding_params=params - embedding)
  step_fn = TrainStep(model, optimizer, loss_chunk_tokens=spec.get("loss_chunk_tokens", LOSS_CHUNK_TOKENS),
                      gradient_accumulation_steps=train_config.get("gradient_accumulation_steps", 1))
  batches = prefetch_to_device(RandomTokens(B, T, model_config.vocab_size, docs=spec.get("docs", 0)), mesh,
                               count=10**9)

  start = time.perf_counter()
  jax.device_get(step_fn(next(batches)[0]))
  result["first_step_s"] = time.perf_counter() - start  # compilation included
  for _ in range(spec["warmup"]):
    jax.device_get(step_fn(next(batches)[0]))

  synced = []
  for _ in range(steps):
    start = time.perf_counter()
    metrics = jax.device_get(step_fn(next(batches)[0]))
    synced.append(1e3 * (time.perf_counter() - start))
  result["loss"] = float(metrics["loss"])

  loop_times = []
  for _ in range(3):
    pending = []
    start = time.perf_counter()
    for i in range(steps):
      pending.append(step_fn(next(batches)[0]))
      if (i + 1) % log_every == 0 or i + 1 == steps:
        jax.device_get(pending)
        pending.clear()
    loop_times.append(1e3 * (time.perf_counter() - start) / steps)
  # 40 names: enough to account for most of a step (the SDM hybrid has ~240 distinct kernels)
  result["kernel_time"] = kernel_summary(lambda: jax.device_get(step_fn(next(batches)[0])), top=40)

  tokens = B * T
  ms = statistics.median(loop_times)
  flops_per_token = 6 * (params - embedding) + mixer_flops_per_token(model_config, T)
  result.update(
      ms_per_step_synced=statistics.median(synced), ms_per_step_loop=ms, loop_repeats_ms=loop_times,
      tokens_per_s_synced=tokens / statistics.median(synced) * 1e3, tokens_per_s=tokens / ms * 1e3,
      flops_per_token=flops_per_token, mfu=flops_per_token * tokens / (ms * 1e-3) / (PEAK_FLOPS * jax.device_count()),
      peak_bytes=peak_device_bytes(every_device=True))
  return result


def load_config(path_variant):
  """'path/to/config.py:variant' -> that file's get_config(variant) (get_config() without a variant)."""
  import importlib.util
  path, _, variant = path_variant.partition(":")
  if not os.path.isfile(path):
    raise ValueError(f"configs: expected 'path/to/config.py:variant' naming an existing file, got {path_variant!r}")
  module_spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(variant) if variant else module.get_config()


def mlp_hidden(model_config):
  return model_config.get("mlp_hidden") or round(model_config.mlp_ratio * model_config.width)


def check_docs(docs, seq_len):
  """ValueError unless every entry of docs is 0 (unpacked) or a number of documents 2..seq_len a row."""
  bad = [n for n in docs if isinstance(n, bool) or not isinstance(n, int) or n != 0 and not 2 <= n <= seq_len]
  if bad or not docs:
    raise ValueError(f"docs: expected 0 (unpacked rows) or 2..seq_len = {seq_len} documents a row, got {list(docs)}")


def build_specs(configs, *, remats=(), peers=(), batch=None, seq_len=None, steps=10, warmup=2, log_every=10,
                overrides=(), docs=(0,)):
  """One spec per (config, remat policy, documents a row), then one per fla peer at the first config's shape
  (unpacked rows).

  configs: 'path.py:variant' strings; remats: policies to try (empty: each config's own); overrides:
  'model.field=value' strings applied to every config (values parsed as JSON where they parse); docs: 0 for
  unpacked rows, n for packed rows of n documents (`RandomTokens`).
  batch / seq_len default to the config's data.batch_size / data.seq_len; a batch given is one step's rows, taken
  whole (train.gradient_accumulation_steps 1) unless an override sets the accumulation.
  """
  specs = []
  for path_variant in configs:
    config = load_config(path_variant)
    for override in overrides:
      key, _, value = override.partition("=")
      try:
        value = json.loads(value)
      except json.JSONDecodeError:
        pass
      found = dotted_field(config, key) if key.partition(".")[0] in ("model", "train") else None
      if found is None:
        raise ValueError(f"overrides: expected model.<field>=value or train.<field>=value of an existing field "
                         f"(nested ones dotted, e.g. model.sdm.table_dtype), got {override!r}")
      parent, name = found
      parent[name] = value
    if batch and not any(o.partition("=")[0] == "train.gradient_accumulation_steps" for o in overrides):
      config.train.gradient_accumulation_steps = 1
    variant = path_variant.partition(":")[2] or path_variant
    T = seq_len or config.data.seq_len
    check_docs(docs, T)
    for remat in remats or [config.model.get("remat", "none")]:
      model = config.model.to_dict()
      model["remat"] = remat
      for n in docs:
        specs.append({"name": f"{variant} remat={remat}" + (f" docs={n}" if n else ""), "model": model,
                      "train": config.train.to_dict(), "batch": batch or config.data.batch_size, "seq_len": T,
                      "docs": n, "steps": steps, "warmup": warmup, "log_every": log_every,
                      "loss_chunk_tokens": config.train.get("loss_chunk_tokens", LOSS_CHUNK_TOKENS)})
  for peer in peers:
    first = specs[0]
    specs.append({**first, "name": f"fla {peer}", "peer": peer, "docs": 0,
                  "mlp_hidden": mlp_hidden(load_config(configs[0]).model)})
  return specs


def _worker_command(spec):
  return [sys.executable, "-m", "sdm_jax.benchmarking.train_bench", json.dumps(spec)]


def _peer_command(spec, out_path):
  m = spec["model"]
  return [sys.executable, "-m", "sdm_jax.benchmarking.peer_train", f"--model={spec['peer']}",
          f"--num_layers={m['num_layers']}", f"--width={m['width']}", f"--num_heads={m['num_heads']}",
          f"--head_dim={m['head_dim']}", f"--mlp_hidden={spec['mlp_hidden']}", f"--vocab_size={m['vocab_size']}",
          f"--batch={spec['batch']}", f"--seq_len={spec['seq_len']}", f"--steps={spec['steps']}",
          f"--warmup={spec['warmup']}", f"--out={out_path}"]


def _common_fields(peer):
  """peer_train's result with the keys ours uses beside its own (its back-to-back time is the loop's)."""
  common = {"peer_result": peer, "error": peer.get("error"), "device": peer.get("device")}
  if peer.get("back_to_back"):
    tokens = peer["tokens_per_step"]
    ms = peer["back_to_back"]["ms_per_step"]
    common.update(ms_per_step_loop=ms, tokens_per_s=tokens / ms * 1e3,
                  ms_per_step_synced=peer["synced"]["ms_per_step"], peak_bytes=peer["memory"]["max_allocated_bytes"],
                  params=peer["params"]["total"], non_embedding_params=peer["params"]["non_embedding"])
  return common


def run_process(spec, out_dir, timeout_s, log=print):
  """Runs one spec in its own process (ours, or the peer when spec has "peer"); returns its result dict,
  with "error" set when the process failed, timed out or printed no result."""
  os.makedirs(out_dir, exist_ok=True)
  peer_out = os.path.join(out_dir, "peer_" + spec["name"].replace(" ", "_") + ".json")
  command = _peer_command(spec, peer_out) if "peer" in spec else _worker_command(spec)
  log(f"== {spec['name']}: {' '.join(command[:3])} ... (limit {timeout_s} s)")
  start = time.perf_counter()
  try:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    output, error = done.stdout, (done.stderr[-1500:] if done.returncode else None)
  except subprocess.TimeoutExpired as expired:
    # TimeoutExpired carries bytes even when the run asked for text.
    stdout = expired.stdout or b""
    output = stdout.decode(errors="replace") if isinstance(stdout, bytes) else stdout
    error = f"timed out after {timeout_s} s"
  result = {"name": spec["name"], "side": "peer" if "peer" in spec else "ours"}
  if "peer" in spec and os.path.exists(peer_out):
    with open(peer_out) as f:
      result.update(_common_fields(json.load(f)))
  else:
    lines = [line for line in output.splitlines() if line.startswith("{")]
    if lines:
      result.update(json.loads(lines[-1]))
  if error and not result.get("error"):
    result["error"] = error if "ms_per_step_loop" not in result else None
  result["wall_s"] = time.perf_counter() - start
  log(summary_line(result))
  return result


def summary_line(r):
  if r.get("error"):
    return f"{r['name']}: error: {str(r['error']).strip().splitlines()[-1][:300]}"
  gib = (r.get("peak_bytes") or r.get("max_memory_allocated") or 0) / 2**30
  return (f"{r['name']}: {r.get('ms_per_step_loop', r.get('ms_per_step_back_to_back', float('nan'))):.1f} ms/step "
          f"({r.get('tokens_per_s', float('nan')):,.0f} tokens/s), "
          f"synced {r.get('ms_per_step_synced', float('nan')):.1f} ms, "
          f"peak {gib:.1f} GiB, {r.get('params', 0) / 1e6:.0f} M params")


def _gib(r):
  peak = r.get("peak_bytes") or r.get("max_memory_allocated")
  return peak / 2**30 if peak else None


def table(results, baseline=None):
  """A markdown table of the results; ratios against the result named `baseline` (tokens/s, memory)."""
  base = next((r for r in results if r["name"] == baseline and not r.get("error")), None)

  def over_base(value):
    return lambda r: value(r) / value(base) if base and value(r) and value(base) else None

  tokens_per_s = lambda r: r.get("tokens_per_s")
  # An entry that failed says why in the last column.
  mfu_or_error = lambda r: (f"error: {str(r['error']).strip().splitlines()[-1][:160]}" if r.get("error")
                            else r.get("mfu"))
  return tables.table([
      Column("entry", "name"), Column("params", "params", ".0f", 1e6, " M"),
      Column("ms/step, training loop", lambda r: r.get("ms_per_step_loop", r.get("ms_per_step_back_to_back")),
             ".1f"),
      Column("ms/step, synced every step", "ms_per_step_synced", ".1f"), Column("tokens/s", "tokens_per_s", ",.0f"),
      Column(f"x {baseline or 'peer'} tokens/s", over_base(tokens_per_s), ".2f", suffix="x"),
      Column("peak GiB", _gib, ".1f"), Column(f"x {baseline or 'peer'} memory", over_base(_gib), ".2f", suffix="x"),
      Column("MFU", mfu_or_error, ".1%")], results)


def kernel_lists(results):
  """Markdown: each of our entries' kernels in one step by device time (CUPTI, `measure`), where it has them."""
  return tables.kernel_section(results, lambda r: f"{r['name']},", {"kernel_time": "one step"},
                               "## Kernels of one step")


def plot(results, path, baseline=None):
  """Two panels, tokens/s and peak memory per entry; the baseline's values as dashed lines."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  done = [r for r in results if not r.get("error")]
  if not done:
    return
  names = [r["name"] for r in done]
  colors = ["tab:orange" if r["side"] == "peer" else "tab:blue" for r in done]
  fig, axes = plt.subplots(1, 2, figsize=(12, 0.5 * len(done) + 2))
  for ax, values, label in ((axes[0], [r["tokens_per_s"] / 1e3 for r in done], "thousand tokens/s"),
                            (axes[1], [_gib(r) or 0 for r in done], "peak device memory, GiB")):
    ax.barh(names, values, color=colors)
    ax.invert_yaxis()
    ax.set_xlabel(label)
    for name, value in zip(names, values):
      if name == baseline:
        ax.axvline(value, color="tab:orange", linestyle="--", linewidth=1)
  axes[1].set_yticklabels([])
  fig.suptitle("training step (blue: sdm-jax, orange: fla)")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def run(specs, out_dir, tag, *, baseline=None, timeout_s=600, notes=(), config=None, log=print):
  """Runs every spec in its own process, in order; rewrites the report after each (`notes`: more lines for its
  header; config: the settings it records beside the entries). Returns (results, the report's paths)."""
  from sdm_jax.benchmarking.timing import command_line
  meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "command": command_line(), "config": {
      **(config or {}), "entries": [s["name"] for s in specs]}}
  results, paths = [], None
  for spec in specs:
    results.append(run_process(spec, out_dir, timeout_s, log))
    meta["device"] = next((r["device"] for r in results if r.get("device")), "?")
    header = ["- one process per entry; ms/step is the median over repeats of the training loop's own way of",
              "  stepping (prefetched batches, metrics fetched every log_every steps) for ours, back to back for fla;",
              "  'synced' fetches the loss after every step. Peak memory: jax's peak_bytes_in_use (default allocator)",
              "  / torch.cuda.max_memory_allocated. MFU: (6 x non-embedding params + mixer FLOPs) x tokens/s / 790",
              "  TFLOP/s.", *notes]
    paths = tables.write_tables(results, meta, out_dir, tag, "Whole-model training steps", header,
                                table(results, baseline) + kernel_lists(results))
    plot(results, paths["png"], baseline)
  return results, paths


def check_settings(settings):
  """ValueError naming the setting unless `settings` (registry.TrainSettings) can run (every config loads)."""
  from sdm_jax.benchmarking.peer_train import MODELS
  if not settings.configs:
    raise ValueError("configs: expected at least one path/to/config.py:variant")
  unknown = [p for p in settings.peers if p not in MODELS]
  if unknown:
    raise ValueError(f"peers: expected some of {tuple(MODELS)}, got {list(settings.peers)}")
  _specs(settings, settings.peers)


def _specs(settings, peers):
  s = settings
  return build_specs(s.configs, remats=s.remat, peers=peers, batch=s.batch, seq_len=s.seq_len, steps=s.steps,
                     warmup=s.warmup, log_every=s.log_every, overrides=s.overrides, docs=s.docs)


def bench(settings, out_dir, tag, log=print):
  """The `train` mode: one process per (config, remat policy), then per fla peer where torch can run one here;
  returns (results, paths)."""
  from sdm_jax.benchmarking.fla_peer import unavailable
  why = unavailable() if settings.peers else None
  peers = () if why else settings.peers
  notes = [f"- fla peers {', '.join(settings.peers)} not timed: {why}"] if why else []
  baseline = settings.baseline or (f"fla {peers[0]}" if peers else None)
  results, paths = run(_specs(settings, peers), out_dir, tag, baseline=baseline, timeout_s=settings.timeout,
                       notes=notes, config=dataclasses.asdict(settings), log=log)
  log(table(results, baseline))
  return results, paths


def _main():
  spec = json.loads(sys.argv[1])
  print(json.dumps(measure(spec)), flush=True)


if __name__ == "__main__":
  _main()
