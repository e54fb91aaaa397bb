"""The summary of sweeps (sdm_jax.training.sweep): per grid point and evaluation point, each metric's mean over
seeds and its 95 % t-interval, the model's parameters, FLOPs per token and recurrent state, as JSON, a markdown
table and plots of accuracy against each swept axis, one line per mixer.

Several sweep workdirs merge into one summary (a grid split over several calls): runs are found by their
point.json, and the runs of one point from every workdir are pooled (a seed found twice counts once). An earlier
summary's .json in the list stands for the runs it recorded (their run directories may be gone, e.g. runs made on a
device machine), so new seeds join old ones without the old runs' files.
"""

import json
import math
import pathlib

import ml_collections
import numpy as np

from sdm_jax.tables import Column, table
from sdm_jax.training import sweep

METRICS = ("accuracy", "exact_match", "loss")
CONFIDENCE = 0.95
# A derived x axis: the recurrent state of the whole model (sdm_jax.models.costs).
STATE_AXIS = "state_elements"


def t_interval(values, confidence=CONFIDENCE):
  """(mean, half-width of the two-sided t-interval of the mean) of `values`; half-width None for one value."""
  values = np.asarray(values, np.float64)
  if values.size == 0:
    raise ValueError("values: expected at least one value")
  mean = float(values.mean())
  if values.size == 1:
    return mean, None
  from scipy import stats  # a dependency of jax
  quantile = float(stats.t.ppf(0.5 + confidence / 2, values.size - 1))
  return mean, quantile * float(values.std(ddof=1)) / math.sqrt(values.size)


def mixer_label(model):
  """What a model mixes tokens with, for legends: each layer kind's label (`layer_kinds.LAYERS`; the dense mixer's
  name for "D"), a hybrid's joined by '+' ('swa+sdm' for SSSM)."""
  from sdm_jax.models.layer_kinds import LAYERS
  from sdm_jax.models.lm import layer_letters
  letters = layer_letters(model["pattern"], model["num_layers"])
  return "+".join(dict.fromkeys(LAYERS[letter].label or model["mixer"] for letter in letters))


def model_numbers(config):
  """models.costs.model_numbers of a run's config (shapes only: nothing is allocated)."""
  from sdm_jax.models.costs import model_numbers as numbers
  return numbers(ml_collections.ConfigDict(config["model"]), config["data"]["seq_len"])


def find_runs(workdirs):
  """Every run directory (one holding point.json) under the sweep workdirs, sorted."""
  runs = []
  for workdir in workdirs:
    workdir = pathlib.Path(workdir)
    if not workdir.is_dir():
      raise ValueError(f"workdirs: {str(workdir)!r} is not a directory; expected a sweep's workdir or an earlier "
                       f"summary's .json")
    runs += sorted(path.parent for path in workdir.absolute().rglob(sweep.POINT))
  return runs


def _key(point):
  return json.dumps(point, sort_keys=True, default=sweep._jsonable)


def recorded_runs(path):
  """The rows of an earlier summary's .json, grouped by run: {(point key, seed): [rows]}."""
  try:
    payload = json.loads(pathlib.Path(path).read_text())
    rows = payload["runs"]
    runs = {}
    for row in rows:
      runs.setdefault((_key(row["point"]), row["seed"]), []).append(row)
  except (OSError, ValueError, KeyError, TypeError) as error:
    raise ValueError(f"workdirs: {str(path)!r} is not a sweep summary's .json (with its 'runs'): {error}") from None
  return runs


def run_fields(run_dir, config):
  """What a run's protocol reads besides its metrics: learning rate, model shape, training data size, the step it
  ended at, train.stop_at_accuracy and the step that reached it (None: never or not set), and its evaluation
  curve [[step, accuracy], ...] (metrics.jsonl)."""
  from sdm_jax.training.loop import final_step, target_step
  from sdm_jax.training.metrics import MetricsLog
  records = MetricsLog(run_dir, writes=False).read()
  train, model, data = config["train"], config["model"], config["data"]
  target = train.get("stop_at_accuracy", 0.0)
  return {"learning_rate": train["learning_rate"], "width": model["width"], "num_heads": model["num_heads"],
          "head_dim": model["head_dim"], "seq_len": data["seq_len"], "num_kv_pairs": data.get("num_kv_pairs"),
          "final_step": final_step(run_dir, train), "target": target,
          "steps_to_target": target_step(records, target),
          "curve": [[r["step"], r["accuracy"]] for r in records if r.get("split") == "eval"]}


def collect(workdirs, log=print):
  """One row per (run, evaluation): the run's point, seed, evaluation point ({} for the training config), metrics,
  label, model numbers and `run_fields` (its curve in the training config's row only). Runs without a final
  evaluation are left out (and counted in the log). A workdir that is a summary's .json contributes the rows it
  recorded."""
  from sdm_jax.training.loop import final_step
  rows, seen, unfinished = [], set(), []
  numbers_cache = {}
  summaries = [w for w in workdirs if str(w).endswith(".json")]
  for summary in summaries:
    for identity, run_rows in recorded_runs(summary).items():
      if identity in seen:
        log(f"warning: {summary}: {run_rows[0]['run']}: point and seed already found earlier; this copy is left out")
        continue
      seen.add(identity)
      rows += run_rows
  for run_dir in find_runs([w for w in workdirs if w not in summaries]):
    spec = json.loads((run_dir / sweep.POINT).read_text())
    config = json.loads((run_dir / sweep.RUN_CONFIG).read_text())
    identity = (_key(spec["point"]), spec["seed"])
    if identity in seen:
      log(f"warning: {run_dir}: point and seed already found in an earlier workdir; this copy is left out")
      continue
    seen.add(identity)
    final = sweep._read_json(run_dir / sweep.EVAL)
    if final is None or final.get("step") != final_step(run_dir, config["train"]):
      unfinished.append(str(run_dir))
      continue
    model_key = json.dumps([config["model"], config["data"]["seq_len"]], sort_keys=True)
    if model_key not in numbers_cache:
      numbers_cache[model_key] = model_numbers(config)
    label = spec["point"].get(sweep.VARIANT) or mixer_label(config["model"])
    fields = run_fields(run_dir, config)
    curve = fields.pop("curve")
    base = {"run": str(run_dir), "point": spec["point"], "seed": spec["seed"], "label": label,
            "mixer": mixer_label(config["model"]), **numbers_cache[model_key], **fields}
    evaluations = [({}, final)] + [(entry["point"], entry) for entry in sweep._read_json(run_dir / sweep.EVAL_POINTS)
                                   or []]
    for eval_point, metrics in evaluations:
      rows.append({**base, "eval_point": eval_point, **({"curve": curve} if not eval_point else {}),
                   **{key: metrics[key] for key in METRICS if key in metrics}})
  if unfinished:
    log(f"{len(unfinished)} run(s) without a final evaluation left out: {', '.join(unfinished[:5])}"
        f"{' ...' if len(unfinished) > 5 else ''}")
  return rows


def aggregate(rows, confidence=CONFIDENCE):
  """One entry per (grid point, evaluation point): seeds, each metric's mean, interval half-width, min and max."""
  groups = {}
  for row in rows:
    groups.setdefault((_key(row["point"]), _key(row["eval_point"])), []).append(row)
  points = []
  for members in groups.values():
    first = members[0]
    entry = {key: first[key] for key in ("point", "eval_point", "label", "mixer", "params", "block_params",
                                         "table_params", "flops_per_token", "state_elements", "state_bytes",
                                         "state_per_layer")}
    entry["seeds"] = sorted(row["seed"] for row in members)
    entry["confidence"] = confidence
    for metric in METRICS:
      values = [row[metric] for row in members if row.get(metric) is not None]
      if values:
        mean, half = t_interval(values, confidence)
        entry[metric] = {"mean": mean, "ci": half, "min": min(values), "max": max(values), "values": values}
    points.append(entry)
  return points


def _axes(points):
  """(grid fields, evaluation fields) in the order they first appear."""
  grid = list(dict.fromkeys(field for entry in points for field in entry["point"]))
  evals = list(dict.fromkeys(field for entry in points for field in entry["eval_point"]))
  return grid, evals


def _fmt_value(value):
  return "-".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _fmt_metric(metric):
  if metric is None:
    return "-"
  ci = "" if metric["ci"] is None else f" ± {metric['ci']:.4f}"
  return f"{metric['mean']:.4f}{ci}"


def _fmt_seeds(entry, metric):
  """Each seed's value, '0.521 (0), 0.643 (1)': with 2-3 seeds they say more than the interval."""
  values = (entry.get(metric) or {}).get("values", [])
  return ", ".join(f"{value:.3f} ({seed})" for seed, value in zip(entry["seeds"], values)) or "-"


def format_table(points):
  """The markdown table: one row per (grid point, evaluation point)."""
  grid, evals = _axes(points)
  columns = [Column("mixer", "mixer"),
             *[Column(field, lambda entry, field=field: _fmt_value(entry["point"].get(field, "-"))) for field in grid],
             *[Column(f"eval {field}", lambda entry, field=field: _fmt_value(entry["eval_point"].get(field, "train")))
               for field in evals],
             Column("block params", "block_params", ","), Column("FLOPs/token", "flops_per_token", ",.0f"),
             Column("state elements", "state_elements", ","), Column("seeds", lambda entry: len(entry["seeds"]), "d"),
             Column("accuracy", lambda entry: _fmt_metric(entry.get(METRICS[0]))),
             Column("accuracy by seed", lambda entry: _fmt_seeds(entry, METRICS[0])),
             *[Column(header, lambda entry, metric=metric: _fmt_metric(entry.get(metric)))
               for header, metric in zip(("exact match", "loss"), METRICS[1:])]]
  lines = [table(columns, points)]
  pct = round(100 * (points[0]["confidence"] if points else CONFIDENCE))
  lines.append(f"\nmean ± the half-width of its {pct} % t-interval over seeds (none with one seed); block params: "
               "the blocks' parameters (no embedding, head or SDM table); FLOPs/token: training, at the run's "
               "seq_len; state elements: the recurrent state of all layers for one sequence (sdm_jax.models.costs)")
  return "\n".join(lines)


def _numeric(values):
  return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _ties(points, where, field):
  """The fields that move with `field` (set with it on one axis, like data.seq_len with data.batch_size): over the
  entries holding both, each value of one goes with exactly one value of the other."""
  tied = set()
  others = {other for entry in points if field in entry[where] for other in entry[where]} - {field}
  for other in others:
    pairs = {(_key(entry[where][field]), _key(entry[where][other])) for entry in points
             if field in entry[where] and other in entry[where]}
    if len(pairs) > 1 and len(pairs) == len({a for a, _ in pairs}) == len({b for _, b in pairs}):
      tied.add(other)
  return tied


def _state_entries(points):
  """The entries a plot against the state reads: the training configuration's evaluations."""
  return [entry for entry in points if not entry["eval_point"]]


def plot_axes(points):
  """The x axes worth a plot: every numeric grid or evaluation field with more than one value (one per set of
  fields that move together: the first), and the state size when some mixer has more than one."""
  grid, evals = _axes(points)
  axes, covered = [], set()
  for field in grid + evals:
    where = "point" if field in grid else "eval_point"
    values = {entry[where].get(field) for entry in points if field in entry[where]}
    if (where, field) in covered or len(values) < 2 or not _numeric(values):
      continue
    axes.append((where, field))
    covered |= {(where, other) for other in _ties(points, where, field)}
  states = {}
  for entry in _state_entries(points):
    states.setdefault(entry["mixer"], set()).add(entry[STATE_AXIS])
  if any(len(values) > 1 for values in states.values()):
    axes.append((None, STATE_AXIS))
  return axes


def _lines(points, where, field):
  """{line label: [(x, entry)]}: a line per mixer (its variant where a variant axis names it) and per value of
  every other field that tells the plotted entries apart (not those that move with x, not constant ones); against
  the state, a line per mixer and per value of the data fields of the grid, over the training configuration's
  evaluations (the model fields are what moves the state)."""
  if where is None:
    chosen = [(entry[STATE_AXIS], entry, {k: v for k, v in entry["point"].items() if k.startswith("data.")})
              for entry in _state_entries(points)]
  else:
    tied = _ties(points, where, field) | {field, sweep.VARIANT, "model.mixer"}
    chosen = [(entry[where][field], entry, {k: v for k, v in (entry["point"] | entry["eval_point"]).items()
                                            if k not in tied})
              for entry in points if field in entry[where]]
  # A field with one value in every plotted entry tells no line from another.
  fields = {k for _, _, others in chosen for k in others}
  constant = {k for k in fields if all(k in others for _, _, others in chosen)
              and len({_key(others[k]) for _, _, others in chosen}) == 1}
  lines = {}
  for x, entry, others in chosen:
    suffix = ", ".join(f"{k.split('.')[-1]}={_fmt_value(v)}" for k, v in others.items() if k not in constant)
    # Against the state, a line is a mixer across its sizes (variants of one mixer at several widths join).
    name = entry["mixer"] if where is None else entry["label"]
    lines.setdefault(name + (f" ({suffix})" if suffix else ""), []).append((x, entry))
  # Sorted by label: the legend reads in order, and lines merged from several workdirs keep the same styles.
  return {label: sorted(lines[label], key=lambda member: member[0]) for label in sorted(lines)}


def _line_styles(lines):
  """{label: plot keywords}: a colour per mixer, the same in every plot of a summary, and a line style and marker per
  line of one mixer (e.g. one per task), so that no two lines look alike."""
  import matplotlib
  mixers = sorted({members[0][1]["mixer"] for members in lines.values() if members})
  colours = matplotlib.colormaps["tab10"]
  seen, styles = {}, {}
  for label, members in lines.items():
    mixer = members[0][1]["mixer"] if members else None
    k = seen[mixer] = seen.get(mixer, -1) + 1
    styles[label] = {"color": colours(mixers.index(mixer) % 10) if mixer in mixers else "k",
                     "linestyle": ("-", "--", ":", "-.")[k % 4], "marker": "osD^v"[k % 5]}
  return styles


def plot(points, path, where, field, metrics=("accuracy", "exact_match")):
  """Each metric's mean against `field` with its interval as a shaded band and each seed's value as a dot, one line per
  mixer (and other values)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  metrics = [metric for metric in metrics if any(metric in entry for entry in points)]
  lines = _lines(points, where, field)
  fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics) + 3.5, max(4.5, 0.22 * len(lines))),
                           squeeze=False)
  xs = [x for members in lines.values() for x, _ in members]
  styles = _line_styles(lines)
  for ax, metric in zip(axes[0], metrics):
    for label, members in lines.items():
      members = [(x, entry[metric]) for x, entry in members if metric in entry]
      if not members:
        continue
      x = [member[0] for member in members]
      y = np.array([member[1]["mean"] for member in members])
      err = np.array([member[1]["ci"] or 0.0 for member in members])
      ax.plot(x, y, label=label, **styles[label])
      ax.fill_between(x, y - err, y + err, color=styles[label]["color"], alpha=0.06, linewidth=0)
      # Each seed's value as a small dot: with 2-3 seeds an interval says less than the seeds themselves.
      seeds = [(xi, value) for xi, (_, stats) in zip(x, members) for value in stats.get("values", [])]
      if len(seeds) > len(x):
        ax.scatter(*zip(*seeds), s=20, color=styles[label]["color"], alpha=0.7, linewidths=0,
                   marker=styles[label]["marker"])
    if xs and min(xs) > 0 and max(xs) / min(xs) >= 8:
      ax.set_xscale("log", base=2)
    ax.set(xlabel=field if where is not None else "recurrent state elements (all layers)",
           ylabel=f"{metric.replace('_', ' ')} (band: {round(100 * CONFIDENCE)} % t-interval, dots: seeds)",
           ylim=(-0.02, 1.02))
    ax.grid(True, alpha=0.3)
  # One legend, right of the last panel, clear of the data.
  axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def summarize(workdirs, out, log=print):
  """Collects the runs under `workdirs`, writes <out>.json, <out>.md and <out>_<axis>.png per plotted axis;
  returns the aggregated points."""
  rows = collect(workdirs, log=log)
  if not rows:
    raise ValueError(f"workdirs: no finished run under {', '.join(map(str, workdirs))}")
  points = aggregate(rows)
  out = pathlib.Path(out)
  out.parent.mkdir(parents=True, exist_ok=True)
  payload = {"workdirs": [str(pathlib.Path(w).absolute()) for w in workdirs], "confidence": CONFIDENCE,
             "points": points, "runs": rows}
  out.with_suffix(".json").write_text(json.dumps(payload, indent=2, default=sweep._jsonable) + "\n")
  table = format_table(points)
  out.with_suffix(".md").write_text(table + "\n")
  written = [out.with_suffix(".json"), out.with_suffix(".md")]
  axes = plot_axes(points)
  for where, field in axes:
    path = out.with_name(f"{out.name}_{field.split('.')[-1]}.png")
    plot(points, path, where, field)
    written.append(path)
  log(table)
  log("wrote " + ", ".join(map(str, written)))
  if not axes:
    log("no plot: a plot needs a numeric grid or evaluation field with two or more values, or a mixer at two or more "
        "state sizes; here the points differ only in names (variants, mixers), so the table is the summary")
  return points
