"""Issue 50's harness check on one GPU: a model scored by our lm-evaluation-harness adapter (`experiments.lm_eval`)
and the same weights as fla's Hugging Face model in the harness's own `HFLM` give the same results on the same local
tasks. Needs torch, transformers, fla 0.6.0 and lm_eval (benchmarks/run_h200.sh's header says how they travel):

    PYTHONPATH=<site with fla and lm_eval>:. python3 benchmarks/eval/harness_vs_fla.py --out /tmp/harness

1. A corpus of CPython's standard library (.py files, hashed into train and held-out files), a byte-level BPE
   trained on it (`experiments.prepare_data`);
2. KDA in fla's form (`corpus.py:kda`, model.delta.preset=fla, model.init=fla, fp32) trained --steps steps by
   `experiments.train`, exported by `experiments.convert --to_fla`;
3. two local tasks from the held-out files, as task YAMLs over JSON lines: multiple choice (a 400-character context,
   its true next 80 characters against 3 from other files) and rolling perplexity (whole chunks);
4. ours: `experiments.lm_eval --workdir=<run>`; fla's: `lm_eval.simple_evaluate` of `HFLM` over
   `AutoModelForCausalLM.from_pretrained(<export>)` in fp32 with the run's tokenizer.json (its end-of-document token
   the prefix token, as ours), the same max_length and batch size.
Writes <out>/harness_vs_fla.json (both results, the differences) and prints a table. --dry_run: a tiny run of
steps 1-4's ours half on the CPU (no torch), a check that the script runs.
"""

import argparse
import hashlib
import json
import pathlib
import subprocess
import sys
import sysconfig
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONTEXT, CONTINUATION, CHOICES = 400, 80, 4
METRICS = ("acc,none", "acc_norm,none", "word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none")


def held_out(path):
  """One file in 20 (by a hash of its path) is held out for the tasks."""
  return hashlib.sha256(str(path).encode()).digest()[0] % 20 == 0


def write_documents(out, max_mb):
  """The stdlib's .py files (sorted, up to max_mb of train text) as train JSON lines; the held-out files' texts."""
  stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
  files = sorted(stdlib.rglob("*.py"))
  train, held, size = [], [], 0
  for path in files:
    try:
      text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
      continue
    if len(text) < 2 * (CONTEXT + CONTINUATION):
      continue
    if held_out(path.relative_to(stdlib)):
      held.append(text)
    elif size < max_mb * 2**20:
      train.append(text)
      size += len(text)
  with open(out / "train_docs.jsonl", "w") as f:
    f.writelines(json.dumps({"text": t}) + "\n" for t in train)
  return held


def write_tasks(out, held, questions, documents):
  """The multiple-choice and perplexity task YAMLs over JSON lines of the held-out texts."""
  import random
  rng = random.Random(0)
  chunks = [t[i:i + CONTEXT + CONTINUATION] for t in held
            for i in range(0, len(t) - CONTEXT - CONTINUATION, CONTEXT + CONTINUATION)]
  rng.shuffle(chunks)
  if len(chunks) < questions + documents:
    sys.exit(f"the held-out files give {len(chunks)} chunks; expected at least {questions + documents}")
  rows = []
  for chunk in chunks[:questions]:
    others = rng.sample([c for c in chunks if c is not chunk], CHOICES - 1)
    choices = [c[CONTEXT:] for c in others]
    label = rng.randrange(CHOICES)
    choices.insert(label, chunk[CONTEXT:])
    rows.append({"context": chunk[:CONTEXT], "choices": choices, "label": label})
  with open(out / "mc.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  with open(out / "ppl.jsonl", "w") as f:
    f.writelines(json.dumps({"text": c}) + "\n" for c in chunks[questions:questions + documents])
  (out / "stdlib_mc.yaml").write_text(
      f"task: stdlib_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {out / 'mc.jsonl'}\n"
      "output_type: multiple_choice\ntest_split: test\ndoc_to_text: '{{context}}'\ndoc_to_target: label\n"
      "doc_to_choice: '{{choices}}'\ntarget_delimiter: ''\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n"
      "metadata:\n  version: 1.0\n")
  (out / "stdlib_ppl.yaml").write_text(
      f"task: stdlib_ppl\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {out / 'ppl.jsonl'}\n"
      "output_type: loglikelihood_rolling\ntest_split: test\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
      "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n"
      "metadata:\n  version: 1.0\n")
  return [str(out / "stdlib_mc.yaml"), str(out / "stdlib_ppl.yaml")]


def run(command, log):
  start = time.perf_counter()
  print("==", " ".join(command), flush=True)
  done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
  log.write(f"== {' '.join(command)}\n{done.stdout}\n{done.stderr}\n")
  log.flush()
  if done.returncode:
    sys.exit(f"failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-3000:]}")
  print(f"   {time.perf_counter() - start:.1f} s", flush=True)
  return done.stdout


def fla_results(export, corpus, tasks, *, max_length, batch_size):
  """lm_eval.simple_evaluate of the harness's HFLM over fla's model in `export`, fp32 on the GPU."""
  import torch
  import fla  # noqa: F401  (registers fla's model types with transformers' Auto classes)
  import lm_eval
  from lm_eval.models.huggingface import HFLM
  from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

  from sdm_jax.data import shards
  from sdm_jax.evaluation.harness import resolve_tasks
  eos_id = int(shards.load_manifest(corpus)["tokenizer"]["eos_id"])
  tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(corpus / "tokenizer.json"))
  tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos_id)
  model = AutoModelForCausalLM.from_pretrained(export).cuda().float().eval()
  lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length)
  assert lm.prefix_token_id == eos_id, (lm.prefix_token_id, eos_id)
  loaded, task_manager = resolve_tasks(tasks)
  with torch.no_grad():
    return lm_eval.simple_evaluate(model=lm, tasks=loaded, task_manager=task_manager, log_samples=False,
                                   bootstrap_iters=0), type(model).__name__, torch.cuda.get_device_name()


def main():
  from sdm_jax.tables import Column, table
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--steps", type=int, default=400)
  parser.add_argument("--train_mb", type=float, default=8.0, help="megabytes of stdlib text to train on")
  parser.add_argument("--questions", type=int, default=300)
  parser.add_argument("--documents", type=int, default=60)
  parser.add_argument("--batch_size", type=int, default=16)
  parser.add_argument("--dry_run", action="store_true")
  args = parser.parse_args()
  out = pathlib.Path(args.out).resolve()
  out.mkdir(parents=True, exist_ok=True)
  if args.dry_run:
    args.steps, args.train_mb, args.questions, args.documents = 4, 0.3, 8, 3
  py = sys.executable
  log = open(out / "log.txt", "w")
  held = write_documents(out, args.train_mb)
  tasks = write_tasks(out, held, args.questions, args.documents)
  corpus, workdir, export = out / "corpus", out / "run", out / "fla"
  vocab = 512 if args.dry_run else 4096
  if not (corpus / "manifest.json").exists():
    run([py, "-m", "experiments.prepare_data", f"--inputs={out / 'train_docs.jsonl'}", f"--tokenizer=train:{vocab}",
         f"--out={corpus}"], log)
  size = (["--config.model.width=32", "--config.model.num_heads=2", "--config.model.head_dim=16",
           "--config.model.value_dim=16", "--config.model.num_layers=1", "--config.data.seq_len=128",
           "--config.data.batch_size=4", "--config.model.impl=chunk"] if args.dry_run else [])
  run([py, "-m", "experiments.train", f"--config=experiments/configs/corpus.py:kda,{corpus}", f"--workdir={workdir}",
       "--overwrite", "--config.model.delta.preset=fla", "--config.model.init=fla", "--config.model.dtype=float32",
       f"--config.train.steps={args.steps}", f"--config.train.warmup_steps={max(1, args.steps // 10)}",
       f"--config.train.eval_every={args.steps}", f"--config.train.checkpoint_every={args.steps}", *size], log)
  config = json.loads((workdir / "config.json").read_text())
  max_length = config["data"]["seq_len"]
  run([py, "-m", "experiments.convert", f"--to_fla={workdir}", f"--out={export}"], log)
  run([py, "-m", "experiments.lm_eval", f"--workdir={workdir}", f"--tasks={','.join(tasks)}", "--bootstrap_iters=0",
       f"--batch_size={args.batch_size}"], log)
  ours = json.loads((workdir / "lm_eval.json").read_text())["results"]
  record = {"steps": args.steps, "max_length": max_length, "batch_size": args.batch_size,
            "questions": args.questions, "documents": args.documents, "ours": ours}
  if not args.dry_run:
    theirs, architecture, device = fla_results(export, corpus, tasks, max_length=max_length,
                                               batch_size=args.batch_size)
    record.update(fla=theirs["results"], architecture=architecture, device=device)
  (out / "harness_vs_fla.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
  rows = []
  for task, metrics in ours.items():
    for metric in METRICS:
      if metric in metrics:
        theirs_value = record.get("fla", {}).get(task, {}).get(metric)
        diff = abs(metrics[metric] - theirs_value) if theirs_value is not None else None
        rows.append({"task": task, "metric": metric, "ours": metrics[metric], "theirs": theirs_value, "diff": diff})
  print(table([Column("task", "task"), Column("metric", "metric"), Column("ours", "ours", ".6g"),
               Column("fla's HFLM", "theirs", ".6g"), Column("absolute difference", "diff", ".3g")], rows))
  print(f"device: {record.get('device', 'cpu (dry run)')}; results in {out / 'harness_vs_fla.json'}")


if __name__ == "__main__":
  main()
