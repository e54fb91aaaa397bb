r"""The recall protocol's report (experiments/configs/recall.py, benchmarks/recall/protocol.sh): reads finished sweep
runs of recall.py's variants and writes one piece's tables, plots and verdicts.

  python -m experiments.recall_report --piece=lr_pilot --workdirs=runs/recall_protocol/mqar,runs/recall_protocol/niah \
      --out=runs/recall_protocol/report_lr_pilot
  python -m experiments.recall_report --piece=outcomes --workdirs=runs/recall_protocol/mqar,runs/recall_protocol/niah \
      --rates=runs/recall_protocol/report_lr_pilot_rates.json --out=runs/recall_protocol/report

--piece: sanity (full attention at each MQAR setting: its best learning rate must reach recall.STOP_AT_ACCURACY in
every seed, or the protocol is broken), lr_pilot (each model's rates at the pilot; the rate picked by mean accuracy,
ties by steps-to-target, written to <out>_rates.json), outcomes (each model at its rate: per-seed results, success
counts, bootstrap intervals, every claim of recall.CLAIMS whose models ran, compared at each setting by Fisher's
exact test and decided over settings with Holm's correction), gate_ablation (each layer's output-gate presets
against each other at their best rates). --workdirs: sweep directories or earlier summaries' .json (as
experiments.sweep --summarize_only takes them). Writes <out>.md (printed too), <out>_curves.png (accuracy against
steps, a panel per setting) and, with two or more MQAR pressure points, <out>_pressure.png (accuracy against pairs
per d_k, a panel per width).
"""

from absl import app, flags

from experiments import cli
from experiments.recall_protocol import PIECES, report

flags.DEFINE_enum("piece", "outcomes", PIECES, "Which table (module docstring).")
flags.DEFINE_list("workdirs", None, "Sweep directories or summaries' .json (required).")
flags.DEFINE_string("out", None, "Path prefix of what is written (required).")
flags.DEFINE_string("rates", None, "outcomes / sanity: a pilot's <out>_rates.json; each model's runs at its rate.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  cli.setup()
  if not FLAGS.workdirs or not FLAGS.out:
    raise app.UsageError("--workdirs and --out: expected sweep directories (or summaries' .json) and a path prefix")
  try:
    report(FLAGS.piece, FLAGS.workdirs, FLAGS.out, FLAGS.rates, log=lambda line: print(line, flush=True))
  except ValueError as error:
    cli.fail(error)


if __name__ == "__main__":
  cli.run(main)
