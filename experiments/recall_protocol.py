"""The recall protocol's report as a library (experiments/configs/recall.py, benchmarks/recall/protocol.sh): outcomes
of finished sweep runs of recall.py's variants, each piece's tables, plots and verdicts. The command is
experiments.recall_report (its docstring says what each piece writes)."""

import dataclasses
import json
import pathlib

PIECES = ("sanity", "lr_pilot", "outcomes", "gate_ablation")
# The evaluation MQAR is scored on: the largest number of pairs alone (the sweep's --eval_grid data.min_kv_pairs=0).
MQAR_EVAL = {"data.min_kv_pairs": 0}


def outcomes_from_rows(rows, log=print):
  """The sweep summary's rows (sweep_summary.collect) as sweep_stats.Outcome: the model is the variant's mixer (with
  "/<preset>" where the grid sets model.delta.preset), the setting its task, width, training length and, for MQAR,
  pairs and head size, scored at MQAR_EVAL (the pairs alone); NIAH at every evaluated length. Steps and curves come
  from the run's own evaluations. Rows that are not recall.py variants or lack the protocol's fields are left out."""
  from experiments.configs import recall
  from sdm_jax.training.sweep_stats import Outcome
  curves = {row["run"]: row.get("curve") for row in rows if not row["eval_point"]}
  outcomes, left_out = [], set()
  for row in rows:
    variant = row["point"].get("variant")
    if variant is None or "final_step" not in row:
      left_out.add(row["run"])
      continue
    task, mixer, width, _ = recall.parse_variant(variant)
    preset = row["point"].get("model.delta.preset")
    model = mixer + (f"/{preset}" if preset else "")
    if task == "mqar":
      if row["eval_point"] != MQAR_EVAL:
        continue
      setting = (("task", task), ("width", width), ("seq_len", row["seq_len"]), ("pairs", row["num_kv_pairs"]),
                 ("head_dim", row["head_dim"]))
    else:
      length = row["eval_point"].get("data.seq_len", row["seq_len"])
      if row["eval_point"] and length == row["seq_len"]:
        continue  # the training length again: the run's own evaluation stands for it
      setting = (("task", task), ("width", width), ("seq_len", length))
    # The curve is the training configuration's evaluations: one outcome of a run carries it.
    curve = curves.get(row["run"]) if task == "mqar" or not row["eval_point"] else None
    outcomes.append(Outcome(model, setting, row["seed"], row["learning_rate"], row["accuracy"], row["final_step"],
                            row["steps_to_target"], tuple(map(tuple, curve or ()))))
  if left_out:
    log(f"{len(left_out)} run(s) left out: not recall.py variants, or summarized before the protocol's fields")
  return outcomes


def claim_comparisons(outcomes, threshold):
  """[(claim, [(A, B, [Comparison at each setting both ran; none: not run])])] for recall.CLAIMS, over the settings
  of their tasks."""
  from experiments.configs import recall
  from sdm_jax.training import sweep_stats
  by_model = {}
  for o in outcomes:
    by_model.setdefault((o.model, o.setting), []).append(o)
  claims = []
  for claim, pairs, tasks in recall.CLAIMS:
    compared = []
    for a, b in pairs:
      settings = sorted({s for m, s in by_model if m == a and (b, s) in by_model and dict(s)["task"] in tasks})
      compared.append((a, b, [sweep_stats.compare(sorted(by_model[a, s], key=lambda o: o.seed),
                                                   sorted(by_model[b, s], key=lambda o: o.seed), threshold)
                               for s in settings]))
    claims.append((claim, compared))
  return claims


def verdict_table(claims):
  from experiments.configs import recall
  from sdm_jax.tables import Column, table
  from sdm_jax.training import sweep_stats
  rows = []
  where = lambda settings: "; ".join(map(sweep_stats.setting_label, settings)) or "-"
  for claim, compared in claims:
    verdicts = [sweep_stats.pair_verdict(comparisons) if comparisons else ("not run", [], [])
                for _, _, comparisons in compared]
    overall = ("not run" if all(not comparisons for _, _, comparisons in compared) else
               sweep_stats.claim_verdict([sweep_stats.UNDECIDED if verdict == "not run" else verdict
                                          for verdict, _, _ in verdicts]))
    rows.append({"claim": claim, "pair": "**the claim**", "verdict": f"**{overall}**", "better": "", "worse": "",
                 "settings": ""})
    for (a, b, comparisons), (verdict, better, worse) in zip(compared, verdicts):
      rows.append({"claim": "", "pair": f"{a} > {b}", "verdict": verdict, "better": where(better),
                   "worse": where(worse), "settings": len(comparisons)})
  runs = sorted({(c.runs_a, c.runs_b) for _, compared in claims for _, _, cs in compared for c in cs})
  notes = []
  for a, b in runs:
    decisive = sweep_stats.decisive_counts(a, b)
    notes.append(f"with {a} and {b} seeds Fisher's one-sided test (alpha {sweep_stats.ALPHA}) separates counts as "
                 f"lopsided as {', '.join(f'{x}/{a} vs {y}/{b}' for x, y in decisive)}" if decisive else
                 f"with {a} and {b} seeds no success counts are decisive (alpha {sweep_stats.ALPHA})")
  success = f"success: accuracy >= {recall.SUCCESS} at the setting"
  columns = [Column("claim", "claim"), Column("A beats B", "pair"),
             Column(f"verdict (Holm over settings, alpha {sweep_stats.ALPHA})", "verdict"),
             Column("where A is better", "better"), Column("where B is better", "worse"),
             Column("settings", "settings", "d")]
  return table(columns, rows) + "\n\n" + "; ".join([success, *notes])


def sanity_table(outcomes, target):
  """Full attention at each setting it trained at (NIAH: at its training length), at its best rate there: every seed
  must reach the target."""
  from sdm_jax.tables import Column, table
  from sdm_jax.training import sweep_stats
  attention = sweep_stats.at_rates([o for o in outcomes if o.model == "attention" and o.curve], {})
  if not attention:
    return "sanity: no full-attention run yet"
  rows = []
  failed = 0
  for (_, setting, rate), members in sorted(sweep_stats.groups(attention).items(), key=lambda item: item[0][1]):
    passes = all(o.steps_to_target is not None for o in members)
    failed += not passes
    rows.append({"setting": sweep_stats.setting_label(setting), "lr": rate,
                 "seeds": ", ".join(f"{o.accuracy:.3f}" for o in members),
                 "steps": ", ".join(str(o.steps_to_target or "-") for o in members),
                 "passes": "yes" if passes else "**NO**"})
  verdict = f"FAILED at {failed} setting(s): the protocol is broken there" if failed else "passed"
  verdict = f"sanity: {verdict} (full attention must reach accuracy {target} in every seed)"
  columns = [Column("setting", "setting"), Column("best lr", "lr", "g"), Column("accuracy by seed", "seeds"),
             Column("steps to target", "steps"), Column("passes", "passes")]
  return table(columns, rows) + "\n\n" + verdict


def gate_table(outcomes, threshold):
  """Each layer's presets against each other ("<mixer>/<preset>"), each at its best rate per setting."""
  from sdm_jax.training import sweep_stats
  chosen = sweep_stats.at_rates(outcomes, {})
  by_model = {}
  for o in chosen:
    by_model.setdefault((o.model, o.setting), []).append(o)
  comparisons = []
  for (model, setting), members in sorted(by_model.items()):
    mixer, _, preset = model.partition("/")
    for other, other_setting in sorted(by_model):
      if other_setting == setting and other.partition("/")[0] == mixer and preset and other.partition("/")[2] > preset:
        comparisons.append(sweep_stats.compare(sorted(members, key=lambda o: o.seed),
                                               sorted(by_model[other, setting], key=lambda o: o.seed), threshold))
  return (sweep_stats.outcome_table(chosen, threshold) + "\n\n" + sweep_stats.comparison_table(comparisons)
          + "\n\n'A beats B' is two-sided here: holds (the first preset better), does not hold (the second), or "
            "undecided; no paper reports this comparison")


def at_picked_rates(outcomes, picked):
  """The outcomes at each model's rate of its task's family in `picked` ({family: {model: rate}}, a pilot's)."""
  from experiments.configs import recall
  from sdm_jax.training import sweep_stats
  families = {}
  for o in outcomes:
    families.setdefault(recall.task_family(dict(o.setting)["task"]), []).append(o)
  return [o for family, members in families.items() for o in sweep_stats.at_rates(members, picked.get(family, {}))]


def at_pilots(outcomes):
  """The outcomes at the learning-rate pilots' settings (recall.PILOT_*): MQAR's point and width, and NIAH's task and
  width at the shortest length evaluated, its training length."""
  from experiments.configs import recall
  seq_len, pairs = recall.PILOT_POINT
  mqar = (("task", "mqar"), ("width", recall.PILOT_WIDTH), ("seq_len", seq_len), ("pairs", pairs),
          ("head_dim", recall.HEAD_DIM))
  niah = [o for o in outcomes if dict(o.setting)["task"] == recall.NIAH_PILOT_TASK
          and dict(o.setting)["width"] == recall.PILOT_WIDTH]
  shortest = min((dict(o.setting)["seq_len"] for o in niah), default=None)
  return [o for o in outcomes if o.setting == mqar] + [o for o in niah if dict(o.setting)["seq_len"] == shortest]


def report(piece, workdirs, out, rates=None, log=print):
  """Writes the piece's <out>.md and plots (module docstring); returns the markdown."""
  from experiments.configs import recall
  from sdm_jax.training import sweep_stats
  from sdm_jax.training.sweep_summary import collect
  outcomes = outcomes_from_rows(collect(workdirs, log=log), log=log)
  if not outcomes:
    raise ValueError(f"workdirs: no finished run of recall.py's protocol under {', '.join(map(str, workdirs))}")
  out = pathlib.Path(out)
  out.parent.mkdir(parents=True, exist_ok=True)
  if rates:
    try:
      picked = json.loads(pathlib.Path(rates).read_text())
    except (OSError, ValueError) as error:
      raise ValueError(f"rates: expected a pilot's <out>_rates.json, got {rates!r} ({error})") from None
    outcomes = at_picked_rates(outcomes, picked)
  if piece == "sanity":
    text = sanity_table(outcomes, recall.STOP_AT_ACCURACY)
  elif piece == "lr_pilot":
    outcomes = at_pilots(outcomes)
    if not outcomes:
      raise ValueError(f"workdirs: no run at a pilot's setting (MQAR: width {recall.PILOT_WIDTH}, "
                       f"{recall.PILOT_POINT[1]} pairs in {recall.PILOT_POINT[0]} tokens; NIAH: "
                       f"{recall.NIAH_PILOT_TASK} at width {recall.PILOT_WIDTH})")
    picked, tables = {}, []
    for setting in sorted({o.setting for o in outcomes}):
      at_pilot = [o for o in outcomes if o.setting == setting]
      picked[recall.task_family(dict(setting)["task"])] = rates_here = sweep_stats.best_rates(at_pilot)
      tables.append(f"{sweep_stats.setting_label(setting)}:\n\n"
                    + sweep_stats.rate_table(at_pilot, rates_here, recall.SUCCESS) + "\n\npicked (by mean accuracy; "
                    f"within {sweep_stats.RATE_TIE} of the best, by mean steps-to-target): "
                    + ", ".join(f"{model} {rate:g}" for model, rate in rates_here.items()))
    out.with_name(out.name + "_rates.json").write_text(json.dumps(picked, indent=2) + "\n")
    text = "\n\n".join(tables)
  elif piece == "gate_ablation":
    text = gate_table(outcomes, recall.SUCCESS)
  else:
    chosen = sweep_stats.at_rates(outcomes, {})
    claims = claim_comparisons(chosen, recall.SUCCESS)
    comparisons = [c for _, compared in claims for _, _, cs in compared for c in cs]
    text = (sweep_stats.outcome_table(chosen, recall.SUCCESS) + "\n\n" + sweep_stats.comparison_table(comparisons)
            + "\n\n" + verdict_table(claims))
    if any(o.model == "attention" for o in chosen):
      text += "\n\n" + sanity_table(chosen, recall.STOP_AT_ACCURACY)
  if piece == "lr_pilot":  # a panel per model, a colour per rate
    plotted = [dataclasses.replace(o, model=f"lr {o.learning_rate:g}", setting=(("model", o.model),))
               for o in outcomes]
  else:
    plotted = sweep_stats.at_rates(outcomes, {})
  written = [out.with_suffix(".md")]
  out.with_suffix(".md").write_text(text + "\n")
  order = [f"lr {rate:g}" for rate in recall.LEARNING_RATES] if piece == "lr_pilot" else recall.STUDY_MIXERS
  if sweep_stats.plot_curves(plotted, out.with_name(out.name + "_curves.png"), target=recall.STOP_AT_ACCURACY,
                             order=order):
    written.append(out.with_name(out.name + "_curves.png"))
  if sweep_stats.plot_pressure(plotted, out.with_name(out.name + "_pressure.png"), threshold=recall.SUCCESS,
                               order=order):
    written.append(out.with_name(out.name + "_pressure.png"))
  log(text)
  log("wrote " + ", ".join(map(str, written)))
  return text
