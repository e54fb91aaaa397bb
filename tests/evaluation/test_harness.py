"""The lm-evaluation-harness adapter (sdm_jax.evaluation.harness, experiments.lm_eval) on a tiny corpus run: the
command on local task YAMLs (multiple choice and perplexity) gives the accuracy and perplexity of scoring by hand
with the model's full logits; the adapter's batched scores equal one row at a time; rolling windows and generation
follow their definitions. Skipped only where lm_eval cannot be imported (it is the extra "eval", which `make test`
installs)."""

import json
import math
import os
import pathlib
import re
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is the optional extra 'eval': pip install -e '.[eval]'")

from experiments.configs.corpus import get_config  # noqa: E402
from sdm_jax.data import prepare  # noqa: E402
from sdm_jax.evaluation import harness  # noqa: E402
from sdm_jax.training import loop  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORDS = ("the delta rule writes a value under its key and erases what the key held before so a state of fixed size "
         "keeps the most recent association of every key while old ones decay").split()
SEQ_LEN = 64


def sentence(rng, low, high):
  return " ".join(rng.choice(WORDS, size=int(rng.integers(low, high))))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A 1-layer attention model trained 4 steps on a corpus of sentences of WORDS with a trained 300-token BPE."""
  root = tmp_path_factory.mktemp("harness")
  rng = np.random.default_rng(0)
  with open(root / "documents.jsonl", "w") as f:
    for _ in range(40):
      f.write(json.dumps({"text": sentence(rng, 5, 60) + "."}) + "\n")
  prepare.prepare([str(root / "documents.jsonl")], "train:300", root / "corpus", validation_fraction=0.25,
                  log=lambda _: None)
  config = get_config(f"gdn2,{root / 'corpus'}")
  config.data.seq_len, config.data.batch_size = SEQ_LEN, 4
  config.model.pattern, config.model.num_layers, config.model.width, config.model.num_heads = "A", 1, 32, 2
  config.model.head_dim = config.model.value_dim = 16
  config.train.steps, config.train.warmup_steps, config.train.eval_every, config.train.eval_batches = 4, 1, 4, 1
  loop.train(config, root / "run", log=lambda _: None)
  model, _, _ = loop.restore_for_eval(root / "run", config)
  encode, decode, eot_id = harness.run_codec(config.data)
  return root, config, model, encode, decode, eot_id


# One compilation per row length; run op by op, the model's forward compiled each of its ~30 ops per length and
# those compilations were most of this file's time.
_logits = nnx.jit(lambda model, tokens: model(tokens))


def log_probs(model, tokens):
  """log p(tokens[i + 1] | tokens[:i + 1]) for every i, from the model's whole logits of the unpadded row, in
  float64."""
  logits = np.asarray(_logits(model, jnp.asarray([tokens[:-1]], jnp.int32))[0], np.float64)
  logits -= logits.max(axis=-1, keepdims=True)
  log_softmax = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
  return log_softmax[np.arange(len(tokens) - 1), tokens[1:]]


def continuation_log_prob(model, encode, context, continuation):
  """The harness's definition for a causal model: the continuation's tokens are those of context + continuation
  after the context's own."""
  whole, context_ids = encode(context + continuation), encode(context)
  return float(np.sum(log_probs(model, whole)[len(context_ids) - 1:]))


def write_tasks(root, rng):
  """A multiple-choice task of 6 questions (2 to 4 choices) and a perplexity task of 3 documents, as task YAMLs
  over local JSON lines."""
  questions = [{"question": sentence(rng, 3, 12), "choices": [sentence(rng, 1, 4) for _ in range(2 + i % 3)],
                "label": i % 2} for i in range(6)]
  documents = [{"text": sentence(rng, 5, 15) + "."} for _ in range(3)]
  for name, rows in (("mc", questions), ("ppl", documents)):
    with open(root / f"{name}.jsonl", "w") as f:
      f.writelines(json.dumps(row) + "\n" for row in rows)
  (root / "tiny_mc.yaml").write_text(
      f"task: tiny_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / 'mc.jsonl'}\n"
      "output_type: multiple_choice\ntest_split: test\ndoc_to_text: '{{question}}'\ndoc_to_target: label\n"
      "doc_to_choice: '{{choices}}'\nmetric_list:\n  - metric: acc\nmetadata:\n  version: 1.0\n")
  (root / "tiny_ppl.yaml").write_text(
      f"task: tiny_ppl\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / 'ppl.jsonl'}\n"
      "output_type: loglikelihood_rolling\ntest_split: test\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
      "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\nmetadata:\n  version: 1.0\n")
  return questions, documents


def test_the_command_gives_the_accuracy_and_perplexity_of_scoring_by_hand(run):
  root, _, model, encode, _, eot_id = run
  questions, documents = write_tasks(root, np.random.default_rng(1))
  limit = 5  # of the 6 questions: --limit reaches the harness
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
         "HF_HOME": str(root / "hf_home"), "PYTHONPATH": str(ROOT)}
  out = subprocess.run([sys.executable, "-m", "experiments.lm_eval", f"--workdir={root / 'run'}",
                        f"--tasks={root / 'tiny_mc.yaml'},{root / 'tiny_ppl.yaml'}", f"--limit={limit}",
                        "--bootstrap_iters=0", "--batch_size=4"],
                       cwd=root, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "tiny_mc" in out.stdout and "tiny_ppl" in out.stdout  # the harness's table
  results = json.loads((root / "run" / "lm_eval.json").read_text())
  assert results["step"] == 4

  # The harness joins context and choice with its target delimiter, one space.
  chosen = [int(np.argmax([continuation_log_prob(model, encode, q["question"], " " + choice)
                           for choice in q["choices"]])) for q in questions[:limit]]
  accuracy = np.mean([c == q["label"] for c, q in zip(chosen, questions[:limit])])
  assert results["results"]["tiny_mc"]["acc,none"] == pytest.approx(accuracy, abs=1e-12)

  # One window each (every document fits the run's rows): the first token after the prefix token.
  assert all(len(encode(d["text"])) <= SEQ_LEN for d in documents)
  total = sum(float(np.sum(log_probs(model, [eot_id] + encode(d["text"])))) for d in documents)
  words = sum(len(re.split(r"\s+", d["text"])) for d in documents)
  utf8_bytes = sum(len(d["text"].encode("utf-8")) for d in documents)
  ppl = results["results"]["tiny_ppl"]
  np.testing.assert_allclose(ppl["word_perplexity,none"], math.exp(-total / words), rtol=1e-4)
  np.testing.assert_allclose(ppl["bits_per_byte,none"], -total / utf8_bytes / math.log(2), rtol=1e-4)


def test_batched_scores_equal_rows_scored_alone(run):
  _, _, model, encode, decode, eot_id = run
  rng = np.random.default_rng(2)
  pairs = [(encode(sentence(rng, 1, 20)), encode(" " + sentence(rng, 1, 6))) for _ in range(7)]
  batched = harness.HarnessLM(model, encode, decode, eot_id, max_length=SEQ_LEN, batch_size=3).score(pairs)
  alone = harness.HarnessLM(model, encode, decode, eot_id, max_length=SEQ_LEN, batch_size=1).score(pairs)
  for (context, continuation), (value, greedy), (value_alone, greedy_alone) in zip(pairs, batched, alone):
    by_hand = log_probs(model, context + continuation)[len(context) - 1:]
    np.testing.assert_allclose([value, value_alone], float(np.sum(by_hand)), rtol=1e-5)
    assert greedy == greedy_alone


def test_a_long_text_is_scored_in_rolling_windows(run):
  _, _, model, encode, decode, eot_id = run
  text = sentence(np.random.default_rng(3), 30, 31)
  tokens = encode(text)
  window = 8
  assert len(tokens) > 2 * window and len(tokens) % window  # whole windows and a shorter last one
  lm = harness.HarnessLM(model, encode, decode, eot_id, max_length=window, batch_size=4)

  class Request:
    args = (text,)

  (rolling,) = lm.loglikelihood_rolling([Request()])
  # Window k predicts tokens [k * window, (k + 1) * window) from the `window` tokens before each, the first from the
  # prefix token; the last, shorter one still conditions on `window` tokens.
  padded = [eot_id] + tokens
  by_hand = 0.0
  for start in range(0, len(tokens), window):
    stop = min(start + window, len(tokens))
    by_hand += float(np.sum(log_probs(model, padded[stop - window:stop + 1])[-(stop - start):]))
  np.testing.assert_allclose(rolling, by_hand, rtol=1e-5)


def test_generation_is_the_models_greedy_decoding_cut_at_until(run):
  _, _, model, encode, decode, eot_id = run
  lm = harness.HarnessLM(model, encode, decode, eot_id, max_length=SEQ_LEN)
  prompt = "the delta rule writes"
  generated = np.asarray(model.generate(jnp.asarray([encode(prompt)], jnp.int32), 12))[0].tolist()
  if eot_id in generated:
    generated = generated[:generated.index(eot_id)]
  text = decode(generated)

  class Request:
    def __init__(self, until):
      self.args = (prompt, {"until": until, "max_gen_toks": 12})

  stop = text[len(text) // 2:len(text) // 2 + 2] if len(text) >= 4 else "\x00"
  assert lm.generate_until([Request([]), Request([stop])]) == [text, text.split(stop)[0]]


def test_bad_tasks_are_named(monkeypatch):
  # The harness's own tasks are ~14,000 YAML files whose indexing took most of this test; the index of the
  # defaults' lambada directory alone still holds the close name, and stays empty unless resolve_tasks asks for the
  # defaults (include_defaults), so a name is still looked up where the harness keeps its tasks.
  import lm_eval.tasks
  from lm_eval.tasks._index import TaskIndex
  defaults, build = pathlib.Path(lm_eval.tasks.__file__).parent, TaskIndex.build
  monkeypatch.setattr(TaskIndex, "build", staticmethod(
      lambda paths, **kwargs: build([defaults / "lambada" if path == defaults else path for path in paths],
                                    **kwargs)))
  with pytest.raises(ValueError, match="tasks: 'no/such/task.yaml' is not a file"):
    harness.resolve_tasks(["no/such/task.yaml"])
  with pytest.raises(ValueError, match="tasks: the harness has no task 'lambada_openaii' \\(did you mean "
                                       "'lambada_openai'"):
    harness.resolve_tasks(["lambada_openaii"])


def test_a_run_without_text_is_refused():
  from experiments.configs.mqar import get_config as mqar_config
  with pytest.raises(ValueError, match="data.name: the harness scores text, and the run's task 'mqar' has no text"):
    harness.run_codec(mqar_config("demo").data)
  _, decode, eot_id = harness.run_codec({"name": "text"})
  assert eot_id == 0 and decode([104, 105]) == "hi"


def test_the_command_refuses_a_missing_task_file_in_one_line(run):
  root = run[0]
  out = subprocess.run([sys.executable, "-m", "experiments.lm_eval", f"--workdir={root / 'run'}",
                        "--tasks=no_such_task.yaml"], cwd=root, env={**os.environ, "JAX_PLATFORMS": "cpu",
                                                                    "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 2
  assert out.stderr == "error: --tasks: 'no_such_task.yaml' is not a file; expected a task YAML file or a task name\n"
