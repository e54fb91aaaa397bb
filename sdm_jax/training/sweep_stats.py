"""Statistics for seeds whose outcomes are bimodal, as small recall models' are (a seed learns the task or stays at
chance): each seed's result, success counts (accuracy >= a threshold) compared by Fisher's exact test, a bootstrap
interval of the mean, a verdict per claimed ordering of two models over several settings (Holm's correction), the
best learning rate per model; and the plots a study reads at a glance (accuracy against steps, against pressure).

A t-interval over 3-5 values near 0 and 1 is wider than [0, 1] and cannot separate anything; a count of seeds that
learn, tested exactly, can: at 5 seeds each, 5 of 5 against 1 of 5 (or 4 of 5 against 0 of 5) is p = 0.024 one-sided,
4 of 5 against 1 of 5 is p = 0.10 (`decisive_counts` lists what a sample size can decide).

An outcome is one run at one setting: its model, setting ((name, value), ...), seed, learning rate, accuracy there,
the step it ended at, the step its evaluation first reached its target (None: never) and its evaluation curve.
"""

import dataclasses
import itertools
import math

import numpy as np

from sdm_jax.tables import Column, table

ALPHA = 0.05
CONFIDENCE = 0.95
RESAMPLES = 10_000
RATE_TIE = 0.01  # mean accuracies this close pick a learning rate by steps-to-target instead
HOLDS, DOES_NOT_HOLD, DEPENDS, UNDECIDED = "holds", "does not hold", "depends on the setting", "undecided at this power"


@dataclasses.dataclass(frozen=True)
class Outcome:
  model: str
  setting: tuple  # ((name, value), ...): what the runs compared at one point share (task, width, pairs, ...)
  seed: int
  learning_rate: float
  accuracy: float
  final_step: int
  steps_to_target: int | None = None
  curve: tuple = ()  # ((step, evaluation accuracy), ...)

  @property
  def steps(self):
    """Steps-to-target, or for a run that never reached it its final step (the whole budget)."""
    return self.final_step if self.steps_to_target is None else self.steps_to_target


def setting_label(setting):
  return " ".join(f"{name} {value}" for name, value in setting)


def fisher_greater(successes_a, runs_a, successes_b, runs_b):
  """One-sided p-value of Fisher's exact test that A succeeds more often than B: the hypergeometric probability that
  A holds successes_a or more of the successes_a + successes_b successes, were both drawn at one rate."""
  from scipy import stats  # a dependency of jax
  table = [[successes_a, runs_a - successes_a], [successes_b, runs_b - successes_b]]
  return float(stats.fisher_exact(table, alternative="greater").pvalue)


def permutation_less(a, b):
  """Exact one-sided p-value that A's values are smaller than B's: the share of the C(n_a + n_b, n_a) relabellings
  of the pooled values whose difference of means is at most the observed one (ties counted in)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  pooled, observed = np.concatenate([a, b]), a.mean() - b.mean()
  total, count = pooled.sum(), 0
  splits = list(itertools.combinations(range(pooled.size), a.size))
  for chosen in splits:
    chosen_sum = pooled[list(chosen)].sum()
    count += chosen_sum / a.size - (total - chosen_sum) / b.size <= observed + 1e-9
  return count / len(splits)


def bootstrap_interval(values, confidence=CONFIDENCE, resamples=RESAMPLES, seed=0):
  """(low, high): the percentile bootstrap interval of the mean of `values` (resampled with replacement)."""
  values = np.asarray(values, np.float64)
  if values.size == 0:
    raise ValueError("values: expected at least one value")
  means = np.random.default_rng(seed).choice(values, (resamples, values.size)).mean(axis=1)
  low, high = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
  return float(low), float(high)


def bootstrap_difference(a, b, confidence=CONFIDENCE, resamples=RESAMPLES, seed=0):
  """(low, high): the percentile bootstrap interval of mean(a) - mean(b), each sample resampled on its own."""
  rng = np.random.default_rng(seed)
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  differences = rng.choice(a, (resamples, a.size)).mean(axis=1) - rng.choice(b, (resamples, b.size)).mean(axis=1)
  low, high = np.quantile(differences, [(1 - confidence) / 2, (1 + confidence) / 2])
  return float(low), float(high)


def decisive_counts(runs_a, runs_b, alpha=ALPHA):
  """[(successes_a, successes_b)]: the least lopsided counts, one per successes_b, that Fisher's one-sided test
  separates at alpha with these numbers of runs (what a sample of this size can decide)."""
  pairs = []
  for successes_b in range(runs_b + 1):
    for successes_a in range(successes_b + 1, runs_a + 1):
      if fisher_greater(successes_a, runs_a, successes_b, runs_b) < alpha:
        pairs.append((successes_a, successes_b))
        break
  return pairs


def groups(outcomes):
  """{(model, setting, learning rate): [outcomes by seed]}; ValueError if a seed is there twice."""
  grouped = {}
  for outcome in outcomes:
    grouped.setdefault((outcome.model, outcome.setting, outcome.learning_rate), []).append(outcome)
  for key, members in grouped.items():
    seeds = [member.seed for member in members]
    if len(set(seeds)) != len(seeds):
      raise ValueError(f"outcomes: seed repeated for {key[0]} at {setting_label(key[1])}, rate {key[2]}: {seeds}")
    members.sort(key=lambda member: member.seed)
  return grouped


def pick_rate(by_rate, tie=RATE_TIE):
  """The learning rate of {rate: [outcomes]} with the highest mean accuracy; of those within `tie` of it, the one
  with the fewest mean steps-to-target (a run that never reached it counts its whole budget), then the lowest."""
  means = {rate: np.mean([o.accuracy for o in members]) for rate, members in by_rate.items()}
  best = max(means.values())
  close = [rate for rate, mean in means.items() if mean >= best - tie]
  return min(close, key=lambda rate: (np.mean([o.steps for o in by_rate[rate]]), rate))


def best_rates(outcomes, setting=None, tie=RATE_TIE):
  """{model: its learning rate picked (`pick_rate`) at `setting` (None: the one setting the outcomes have)}."""
  settings = {o.setting for o in outcomes}
  if setting is None:
    if len(settings) != 1:
      raise ValueError(f"setting: the outcomes have {len(settings)} settings; name the pilot's")
    (setting,) = settings
  by_model = {}
  for (model, where, rate), members in groups(outcomes).items():
    if where == setting:
      by_model.setdefault(model, {})[rate] = members
  return {model: pick_rate(by_rate, tie) for model, by_rate in sorted(by_model.items())}


def at_rates(outcomes, rates):
  """The outcomes at each model's rate in `rates` ({model: rate}; a model not in it keeps every rate); where a
  model and setting still have several rates, the one `pick_rate` picks there."""
  kept = [o for o in outcomes if o.model not in rates or math.isclose(o.learning_rate, rates[o.model])]
  by_point = {}
  for (model, setting, rate), members in groups(kept).items():
    by_point.setdefault((model, setting), {})[rate] = members
  return [o for by_rate in by_point.values() for o in by_rate[pick_rate(by_rate)]]


@dataclasses.dataclass(frozen=True)
class Comparison:
  """A against B at one setting. basis: "successes" (Fisher's exact test on the counts), "steps" (both succeed in
  every seed: the exact permutation test on steps-to-target, fewer is better) or "neither" (no seed of either
  succeeds: nothing to test). p_greater: p-value that A is better; p_less: that B is."""
  a: str
  b: str
  setting: tuple
  successes_a: int
  runs_a: int
  successes_b: int
  runs_b: int
  basis: str
  p_greater: float
  p_less: float
  mean_difference: float
  interval: tuple  # the bootstrap interval of the mean accuracy difference A - B
  steps_a: float
  steps_b: float

  @property
  def rate_difference(self):
    return self.successes_a / self.runs_a - self.successes_b / self.runs_b

  def verdict(self, alpha=ALPHA):
    return HOLDS if self.p_greater < alpha else DOES_NOT_HOLD if self.p_less < alpha else UNDECIDED


def compare(a, b, threshold):
  """Comparison of two models' outcomes at one setting (lists of Outcome, one per seed)."""
  if not a or not b:
    raise ValueError("compare: expected outcomes of both models")
  accuracy_a, accuracy_b = [o.accuracy for o in a], [o.accuracy for o in b]
  successes_a = sum(value >= threshold for value in accuracy_a)
  successes_b = sum(value >= threshold for value in accuracy_b)
  steps_a, steps_b = [o.steps for o in a], [o.steps for o in b]
  if successes_a == len(a) and successes_b == len(b):
    basis, p_greater, p_less = "steps", permutation_less(steps_a, steps_b), permutation_less(steps_b, steps_a)
  elif successes_a == successes_b == 0:
    basis, p_greater, p_less = "neither", 1.0, 1.0
  else:
    basis = "successes"
    p_greater = fisher_greater(successes_a, len(a), successes_b, len(b))
    p_less = fisher_greater(successes_b, len(b), successes_a, len(a))
  return Comparison(a[0].model, b[0].model, a[0].setting, successes_a, len(a), successes_b, len(b), basis,
                    p_greater, p_less, float(np.mean(accuracy_a) - np.mean(accuracy_b)),
                    bootstrap_difference(accuracy_a, accuracy_b), float(np.mean(steps_a)), float(np.mean(steps_b)))


def holm(p_values, alpha=ALPHA):
  """Which of the p-values Holm's step-down procedure rejects at family-wise level alpha (a list of booleans)."""
  order = sorted(range(len(p_values)), key=lambda i: p_values[i])
  rejected = [False] * len(p_values)
  for rank, index in enumerate(order):
    if p_values[index] >= alpha / (len(p_values) - rank):
      break
    rejected[index] = True
  return rejected


def pair_verdict(comparisons, alpha=ALPHA):
  """(verdict, settings where A is better, settings where B is) for "A beats B" over its comparisons at several
  settings, each direction corrected by Holm: holds where A is better somewhere and B nowhere, does not hold where
  the reverse, "depends on the setting" where both, else undecided at this power."""
  better = [c.setting for c, r in zip(comparisons, holm([c.p_greater for c in comparisons], alpha)) if r]
  worse = [c.setting for c, r in zip(comparisons, holm([c.p_less for c in comparisons], alpha)) if r]
  verdict = DEPENDS if better and worse else HOLDS if better else DOES_NOT_HOLD if worse else UNDECIDED
  return verdict, better, worse


def claim_verdict(pair_verdicts):
  """A claim's verdict from its pairs' (each "A beats B"): holds when every pair holds, "partly" when some do, else
  does not hold when some pair does not, else depends on the setting when some pair does, else undecided."""
  verdicts = set(pair_verdicts)
  if not verdicts:
    return UNDECIDED
  return (HOLDS if verdicts == {HOLDS} else "partly" if HOLDS in verdicts else DOES_NOT_HOLD
          if DOES_NOT_HOLD in verdicts else DEPENDS if DEPENDS in verdicts else UNDECIDED)


def _fmt_p(p):
  return "-" if p >= 1 else f"{p:.3f}" if p >= 0.001 else f"{p:.0e}"


def outcome_table(outcomes, threshold):
  """Markdown: one row per (setting, model, rate), with each seed's accuracy, the successes, the mean and its
  bootstrap interval, and the steps-to-target."""
  rows = []
  for (model, setting, rate), members in sorted(groups(outcomes).items(), key=lambda item: (item[0][1], item[0][0],
                                                                                             item[0][2])):
    values = [o.accuracy for o in members]
    low, high = bootstrap_interval(values)
    reached = [o.steps_to_target for o in members if o.steps_to_target is not None]
    rows.append({"setting": setting_label(setting), "model": model, "lr": rate,
                 "successes": (sum(v >= threshold for v in values), len(values)),
                 "mean": f"{np.mean(values):.3f} [{low:.3f}, {high:.3f}]",
                 "seeds": ", ".join(f"{o.accuracy:.3f} ({o.seed})" for o in members),
                 "steps": f"{int(np.median(reached)) if reached else '-'} ({len(reached)} / {len(members)})"})
  return table([Column("setting", "setting"), Column("model", "model"), Column("lr", "lr", "g"),
                Column(f"successes (acc >= {threshold:g})", "successes", "d"),
                Column(f"mean [{round(100 * CONFIDENCE)} % bootstrap]", "mean"), Column("accuracy by seed", "seeds"),
                Column("steps to target (reached / runs)", "steps")], rows)


def comparison_table(comparisons, alpha=ALPHA):
  return table([
      Column("A beats B", lambda c: f"{c.a} > {c.b}"), Column("setting", lambda c: setting_label(c.setting)),
      Column("A", lambda c: f"{c.successes_a}/{c.runs_a}"), Column("B", lambda c: f"{c.successes_b}/{c.runs_b}"),
      Column("basis", lambda c: c.basis), Column("p (A better)", lambda c: _fmt_p(c.p_greater)),
      Column("p (B better)", lambda c: _fmt_p(c.p_less)),
      Column("success rate A - B", lambda c: c.rate_difference, "+.2f"),
      Column(f"mean A - B [{round(100 * CONFIDENCE)} % bootstrap]",
             lambda c: f"{c.mean_difference:+.3f} [{c.interval[0]:+.3f}, {c.interval[1]:+.3f}]"),
      Column("steps A / B", lambda c: (c.steps_a, c.steps_b), ".0f"),
      Column("at this setting", lambda c: c.verdict(alpha))], comparisons)


def rate_table(outcomes, rates, threshold):
  """Markdown: each model's learning rates at the pilot, the rate picked marked."""
  rows = []
  for (model, setting, rate), members in sorted(groups(outcomes).items()):
    values = [o.accuracy for o in members]
    rows.append({"model": model, "lr": rate, "successes": (sum(v >= threshold for v in values), len(values)),
                 "mean": np.mean(values), "steps": np.mean([o.steps for o in members]),
                 "picked": "**yes**" if math.isclose(rates.get(model, -1), rate) else ""})
  return table([Column("model", "model"), Column("lr", "lr", "g"),
                Column(f"successes (acc >= {threshold:g})", "successes", "d"), Column("mean accuracy", "mean", ".3f"),
                Column("mean steps (budget if never)", "steps", ".0f"), Column("picked", "picked")], rows)


def _colours(models, order=()):
  """{model: colour}: models in `order` keep their place in it (one colour per model across a study's figures), the
  others follow, sorted."""
  import matplotlib
  palette = matplotlib.colormaps["tab10"]
  ranked = [model for model in order if model in models] + sorted(set(models) - set(order))
  return {model: palette((list(order).index(model) if model in order else len(order) + ranked.index(model)) % 10)
          for model in ranked}


def _panels(count, width=4.2, height=3.2):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  columns = min(count, 3)
  rows = math.ceil(count / columns)
  fig, axes = plt.subplots(rows, columns, figsize=(width * columns + 2.2, height * rows), squeeze=False)
  for ax in axes.flat[count:]:
    ax.set_visible(False)
  return plt, fig, list(axes.flat)


def plot_curves(outcomes, path, target=None, order=()):
  """Evaluation accuracy against training steps, a panel per setting, a colour per model (`order`: `_colours`): each
  seed a thin line, the mean over seeds a thick one (a run that stopped early holds its last value after it)."""
  by_setting = {}
  for o in outcomes:
    if o.curve:
      by_setting.setdefault(o.setting, []).append(o)
  if not by_setting:
    return False
  colours = _colours({o.model for o in outcomes}, order)
  plt, fig, axes = _panels(len(by_setting))
  for ax, (setting, members) in zip(axes, sorted(by_setting.items())):
    for model in sorted({o.model for o in members}):
      runs = [o for o in members if o.model == model]
      steps = sorted({step for o in runs for step, _ in o.curve})
      held = np.array([np.interp(steps, *zip(*o.curve), right=o.curve[-1][1]) for o in runs])
      for o in runs:
        ax.plot(*zip(*o.curve), color=colours[model], alpha=0.3, linewidth=0.8)
      ax.plot(steps, held.mean(axis=0), color=colours[model], linewidth=2.2, label=model)
    if target:
      ax.axhline(target, color="k", linestyle=":", linewidth=0.8)
    ax.set(title=setting_label(setting), xlabel="step", ylabel="evaluation accuracy", ylim=(-0.02, 1.02))
    ax.grid(True, alpha=0.3)
  _legend(fig, axes, colours)
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return True


def plot_pressure(outcomes, path, panel="width", threshold=None, order=()):
  """Accuracy against state pressure, pairs per key channel of a head (setting's "pairs" / "head_dim"), a panel per
  value of the setting's `panel` field, a colour per model (`order`: `_colours`): the mean over seeds a line, each
  seed a dot."""
  points = [o for o in outcomes if {"pairs", "head_dim"} <= dict(o.setting).keys()]
  if len({dict(o.setting)["pairs"] for o in points}) < 2:
    return False
  panels = sorted({dict(o.setting).get(panel) for o in points}, key=str)
  colours = _colours({o.model for o in points}, order)
  plt, fig, axes = _panels(len(panels))
  for ax, value in zip(axes, panels):
    members = [o for o in points if dict(o.setting).get(panel) == value]
    for model in sorted({o.model for o in members}):
      runs = [o for o in members if o.model == model]
      x = lambda o: dict(o.setting)["pairs"] / dict(o.setting)["head_dim"]
      xs = sorted({x(o) for o in runs})
      ax.plot(xs, [np.mean([o.accuracy for o in runs if x(o) == xi]) for xi in xs], color=colours[model],
              marker="o", linewidth=2, label=model)
      ax.scatter([x(o) for o in runs], [o.accuracy for o in runs], color=colours[model], s=14, alpha=0.5)
    if threshold:
      ax.axhline(threshold, color="k", linestyle=":", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set(title=f"{panel} {value}", xlabel="key-value pairs / d_k of a head", ylabel="accuracy at those pairs",
           ylim=(-0.02, 1.02))
    ax.grid(True, alpha=0.3)
  _legend(fig, axes, colours)
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return True


def _legend(fig, axes, colours):
  from matplotlib.lines import Line2D
  handles = [Line2D([], [], color=colour, linewidth=2.2, label=model) for model, colour in colours.items()]
  fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
  fig.tight_layout()
