"""The language model in lm-evaluation-harness (EleutherAI's `lm_eval`, the optional extra "eval"): an `LM` whose
loglikelihood and loglikelihood_rolling score tokens with the training forward, batched by length, and whose
generate_until decodes with the recurrent decoder (`LanguageModel.generate`); and `evaluate_tasks`, which runs
harness tasks (registered names or task YAML files) on it.

Tokens come from the run's own text codec (`data.tokenizer.text_codec`): a corpus run's tokenizer.json with its
manifest's end-of-document id, or the bytes of a byte-level run with NUL, the text task's file separator. That token
is the harness's prefix token: the context of a request whose context is empty, and of a rolling window's first
token. Importing this module imports lm_eval.
"""

import pathlib

import jax.numpy as jnp
import numpy as np
from flax import nnx
from lm_eval.api.model import TemplateLM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from sdm_jax.models.loss import token_scores

MIN_BUCKET = 16  # the shortest padded length: rows are padded to a power of two, one compilation per bucket


@nnx.jit
def _scores(model, inputs, targets):
  return token_scores(model.features(inputs), model.head.kernel[...], targets)


def bucket_length(length, max_length):
  """The padded length of rows of up to `length` tokens: the next power of two (at least MIN_BUCKET), at most
  max_length."""
  return min(max_length, max(MIN_BUCKET, 1 << (int(length) - 1).bit_length()))


def run_codec(data):
  """(encode, decode, end-of-text id) of a run's data config; ValueError naming data.name where its tokens are not
  text."""
  from sdm_jax.data import shards
  from sdm_jax.data.text import SEPARATOR
  from sdm_jax.data.tokenizer import BYTE_LEVEL_TASKS, text_codec
  codec = text_codec(data)
  if codec is None:
    raise ValueError(f"data.name: the harness scores text, and the run's task {data.get('name')!r} has no text "
                     f"tokens; expected a corpus run or a byte-level one {BYTE_LEVEL_TASKS}")
  if data.get("name") == "corpus":
    return (*codec, int(shards.load_manifest(data["data_dir"])["tokenizer"]["eos_id"]))
  return (*codec, SEPARATOR)


class HarnessLM(TemplateLM):
  """lm_eval's LM over a LanguageModel.

  model: the LanguageModel; encode: str -> ids, decode: ids -> str; eot_id: the end-of-text id (the prefix token).
  max_length: the longest row scored (a longer request keeps its last max_length + 1 tokens, as the harness's
  Hugging Face model does); batch_size: rows a forward scores, padded with empty rows to that count.
  """

  def __init__(self, model, encode, decode, eot_id, *, max_length, batch_size=16, max_gen_toks=256):
    super().__init__()
    if max_length < 1 or batch_size < 1:
      raise ValueError(f"max_length, batch_size: expected integers >= 1, got {max_length}, {batch_size}")
    self.model, self.encode, self.decode, self.eot_id = model, encode, decode, eot_id
    self.max_length, self.batch_size, self.max_gen_toks = max_length, batch_size, max_gen_toks

  @property
  def eot_token_id(self):
    return self.eot_id

  @property
  def tokenizer_name(self):
    return "sdm_jax"

  def tok_encode(self, string, add_special_tokens=None, **kwargs):
    del add_special_tokens, kwargs  # the run's codec adds no special tokens
    return list(self.encode(string))

  def tok_decode(self, tokens):
    return self.decode(list(tokens))

  def score(self, pairs):
    """[(context ids, continuation ids)] -> [(log-likelihood of the continuation after the context, whether every
    continuation token is the model's argmax)], in the order given. Rows are sorted by length and scored batch_size
    at a time, padded on the right (the model is causal: padding changes no scored position)."""
    rows = []
    for context, continuation in pairs:
      if not context or not continuation or len(continuation) > self.max_length:
        raise ValueError(f"pairs: expected a context of at least one token and a continuation of 1 to "
                         f"{self.max_length} tokens, got {len(context)} and {len(continuation)}")
      rows.append(((list(context) + list(continuation))[-(self.max_length + 1):], len(continuation)))
    results = [None] * len(rows)
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
    for start in range(0, len(order), self.batch_size):
      indices = order[start:start + self.batch_size]
      length = bucket_length(len(rows[indices[0]][0]) - 1, self.max_length)
      inputs = np.zeros((self.batch_size, length), np.int32)
      targets = np.zeros((self.batch_size, length), np.int32)
      scored = np.zeros((self.batch_size, length), bool)
      for row, index in enumerate(indices):
        tokens, count = rows[index]
        inputs[row, :len(tokens) - 1], targets[row, :len(tokens) - 1] = tokens[:-1], tokens[1:]
        scored[row, len(tokens) - 1 - count:len(tokens) - 1] = True
      nll, correct = (np.asarray(x) for x in _scores(self.model, jnp.asarray(inputs), jnp.asarray(targets)))
      for row, index in enumerate(indices):
        mask = scored[row]
        results[index] = (-float(np.sum(nll[row][mask], dtype=np.float64)), bool(np.all(correct[row][mask])))
    return results

  def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
    del disable_tqdm, kwargs
    answers = self.score([(context, continuation) for _, context, continuation in requests])
    for (key, _, _), answer in zip(requests, answers):
      self.cache_hook.add_partial("loglikelihood", key, answer)
    return answers

  def loglikelihood_rolling(self, requests, disable_tqdm=False):
    """The log-likelihood of each request's whole text: windows of max_length tokens, each scoring the tokens the
    ones before have not (lm_eval's rolling windows), the first conditioned on the prefix token."""
    del disable_tqdm
    windows, owners = [], []
    for index, request in enumerate(requests):
      (text,) = request.args
      for window in get_rolling_token_windows(token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                                              max_seq_len=self.max_length, context_len=1):
        windows.append(make_disjoint_window(window))
        owners.append(index)
    totals = [0.0] * len(requests)
    for owner, (loglikelihood, _) in zip(owners, self.score(windows)):
      totals[owner] += loglikelihood
    for request, total in zip(requests, totals):
      self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
    return totals

  def generate_until(self, requests, disable_tqdm=False):
    """Each request's continuation from model.generate (greedy unless its gen_kwargs ask for a temperature with
    do_sample), cut at the end-of-text token and at the first of its `until` strings."""
    del disable_tqdm
    outputs = []
    for request in requests:
      context, gen_kwargs = request.args
      gen_kwargs = dict(gen_kwargs or {})
      until = gen_kwargs.pop("until", None) or [self.decode([self.eot_id])]
      until = [until] if isinstance(until, str) else list(until)
      new_tokens = int(gen_kwargs.pop("max_gen_toks", self.max_gen_toks))
      temperature = float(gen_kwargs.pop("temperature", 0.0)) if gen_kwargs.pop("do_sample", False) else 0.0
      prompt = self.tok_encode(context) or [self.prefix_token_id]
      prompt = prompt[-max(1, self.max_length - new_tokens):]
      tokens = np.asarray(self.model.generate(jnp.asarray([prompt], jnp.int32), new_tokens,
                                              temperature=temperature))[0].tolist()
      if self.eot_id in tokens:
        tokens = tokens[:tokens.index(self.eot_id)]
      text = self.decode(tokens)
      for stop in until:
        if stop:
          text = text.split(stop)[0]
      self.cache_hook.add_partial("generate_until", request.args, text)
      outputs.append(text)
    return outputs


def resolve_tasks(tasks):
  """Names and task YAML paths -> (what lm_eval.simple_evaluate takes, the TaskManager that knows them): a name (or
  a glob of names) as it is, a path (ending in .yaml or .yml) as its loaded config. ValueError naming `tasks` for a
  path that is not a file or a name the harness does not know (with the close ones)."""
  from lm_eval.tasks import TaskManager
  from lm_eval.tasks._yaml_loader import load_yaml  # what the harness's own command loads a task file with

  from sdm_jax.training.config import close_names
  loaded = []
  for task in tasks:
    if task.endswith((".yaml", ".yml")):
      path = pathlib.Path(task)
      if not path.is_file():
        raise ValueError(f"tasks: {task!r} is not a file; expected a task YAML file or a task name")
      loaded.append(load_yaml(path.resolve(), resolve_func=True))
    else:
      loaded.append(task)
  names = [task for task in loaded if isinstance(task, str)]
  task_manager = TaskManager(include_defaults=bool(names))  # indexing the harness's own tasks takes seconds
  for name in names:
    if not task_manager.match_tasks([name]):
      raise ValueError(f"tasks: the harness has no task {name!r}{close_names(name, task_manager.all_tasks)}")
  return loaded, task_manager


def evaluate_tasks(lm, tasks, task_manager, *, limit=None, num_fewshot=None, bootstrap_iters=100000):
  """lm_eval.simple_evaluate of `lm` on `tasks` and their task_manager (`resolve_tasks`); returns its result dict
  ("results", "versions", "n-shot", "higher_is_better", "n-samples", the tasks' "configs", ...). bootstrap_iters:
  the harness's resamples for the standard errors it cannot compute in closed form (0: none)."""
  import lm_eval
  return lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=task_manager, limit=limit,
                                 num_fewshot=num_fewshot, log_samples=False, bootstrap_iters=bootstrap_iters)
