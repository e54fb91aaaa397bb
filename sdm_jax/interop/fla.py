"""flash-linear-attention checkpoints, both ways, with `safetensors.numpy` (no torch).

fla 0.6.0's layers (`GatedDeltaNet`, `KimiDeltaAttention`, `GatedDeltaNet2`) are our `DeltaMixer` at the "fla"
preset (`layers.delta.PRESETS`), and its `GatedDeltaNetForCausalLM` / `KDAForCausalLM` are our `LanguageModel`
with pattern "D", the "fla" init and fla's SwiGLU width; the names map one to one:

    fla                                   ours (nnx state path)          tensor
    model.embeddings.weight               embed/embedding                as is
    model.layers.{i}.attn_norm.weight     blocks/{i}/mixer_norm/scale    as is
    model.layers.{i}.attn.<layer name>    blocks/{i}/mixer/<layer path>  below
    model.layers.{i}.mlp_norm.weight      blocks/{i}/mlp_norm/scale      as is
    model.layers.{i}.mlp.<x>_proj.weight  blocks/{i}/mlp/<x>_proj/kernel transposed
    model.norm.weight                     final_norm/scale               as is
    lm_head.weight                        head/kernel                    transposed (absent when tied)

and inside a layer: q/k/v_proj, o_proj -> the same names (Linear weights transposed to kernels); q/k/v_conv1d ->
q/k/v_conv ([C, 1, W] -> [W, C]); a_proj (GDN) and f_proj -> decay/f_proj; A_log, dt_bias -> decay/A_log, dt_bias;
b_proj -> beta_proj (GDN, KDA) or b_proj (GDN-2's erase gate); w_proj -> w_proj; g_proj -> out_gate_proj;
o_norm.weight -> o_norm/scale; an nn.Sequential's index i -> layers/i.

KDA's safe gate: fla's KDA layer and model take `safe_gate` and `lower_bound`. Its gate is the bounded one,
lower_bound * sigmoid(exp(A_log) (f(x) + dt_bias)), whenever lower_bound is set (`fla/ops/kda/gate.py`); safe_gate
only picks the kernels that assume it, which take lower_bound in [-5, 0). Both are our layer's lower_bound
(`layers.delta.DeltaLayerConfig`), which runs impl="pallas" bounded; we write safe_gate=True wherever fla's kernels take
the bound. fla's GDN and GDN-2 layers have no bounded gate.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import load_file, save_file

from sdm_jax.layers.delta import DeltaMixer, layer_config
from sdm_jax.models.config import default_config, delta_layer
from sdm_jax.models.lm import LanguageModel, layer_letters, mlp_hidden

# fla's layer classes by our name: (our mixer, fla's default expand_v).
LAYER_KINDS = {"gdn": ("gdn", 2.0), "kda": ("kda", 1.0), "gdn2": ("gdn2", 1.0)}
# fla's model classes: model_type -> (our mixer, architecture).
MODEL_TYPES = {"gated_deltanet": ("gdn", "GatedDeltaNetForCausalLM"), "kda": ("kda", "KDAForCausalLM")}
FLA_LAYER_NORM_EPS = 1e-5  # fla's layers' default norm_eps (its models pass their own)
FLA_SAFE_GATE_LOWEST = -5.0  # fla's chunk_kda takes safe_gate=True with lower_bound in [-5, 0) only
_TOP = {"q_conv1d": ("q_conv",), "k_conv1d": ("k_conv",), "v_conv1d": ("v_conv",), "a_proj": ("decay", "f_proj"),
        "f_proj": ("decay", "f_proj"), "A_log": ("decay", "A_log"), "dt_bias": ("decay", "dt_bias"),
        "g_proj": ("out_gate_proj",)}


def _layer_path(mixer, name):
  """fla layer tensor name -> (our path tuple, kind of tensor), or None for a name fla's layer does not have."""
  parts = name.split(".")
  head, leaf = parts[0], parts[-1]
  if head == "b_proj":
    path = ("b_proj",) if mixer == "gdn2" else ("beta_proj",)
  elif head in _TOP:
    path = _TOP[head]
  elif head in ("q_proj", "k_proj", "v_proj", "o_proj", "w_proj", "o_norm"):
    path = (head,)
  else:
    return None
  middle = parts[1:-1] if leaf in ("weight", "bias") else parts[1:]
  if any(not p.isdigit() for p in middle) or len(middle) > 1:
    return None
  path += tuple(x for p in middle for x in ("layers", int(p)))
  if leaf in ("A_log", "dt_bias") and len(parts) == 1:
    return path, "as_is"
  if head == "o_norm" and leaf == "weight":
    return path + ("scale",), "as_is"
  if head.endswith("conv1d"):
    return (path + ("kernel",), "conv") if leaf == "weight" else (path + ("bias",), "as_is")
  return (path + ("kernel",), "linear") if leaf == "weight" else (path + ("bias",), "as_is")


def _model_path(mixer, name):
  parts = name.split(".")
  if name == "model.embeddings.weight":
    return ("embed", "embedding"), "as_is"
  if name == "model.norm.weight":
    return ("final_norm", "scale"), "as_is"
  if name == "lm_head.weight":
    return ("head", "kernel"), "linear"
  if len(parts) >= 5 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
    block, part, rest = ("blocks", int(parts[2])), parts[3], ".".join(parts[4:])
    if part in ("attn_norm", "mlp_norm") and rest == "weight":
      return block + ({"attn_norm": "mixer_norm"}.get(part, part), "scale"), "as_is"
    if part == "mlp" and rest in ("gate_proj.weight", "up_proj.weight", "down_proj.weight"):
      return block + ("mlp", rest.split(".")[0], "kernel"), "linear"
    if part == "attn" and (found := _layer_path(mixer, rest)) is not None:
      return block + ("mixer",) + found[0], found[1]
  return None


def _to_ours(kind, x):
  x = np.asarray(x, np.float32)
  return {"linear": lambda: x.T, "conv": lambda: x[:, 0, :].T, "as_is": lambda: x}[kind]()


def _to_fla(kind, x):
  x = np.asarray(x, np.float32)
  return np.ascontiguousarray({"linear": lambda: x.T, "conv": lambda: x.T[:, None, :], "as_is": lambda: x}[kind]())


def _flat_state(module):
  """{path tuple: abstract or concrete array} of the module's nnx.Param leaves."""
  state = nnx.to_pure_dict(nnx.state(module, nnx.Param))
  return {tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]}


def _fill(module, tensors, locate, where):
  """Sets every parameter of `module` from fla's `tensors` ({name: array}); ValueError naming a tensor that is
  unknown, missing or mis-shaped."""
  ours = _flat_state(module)
  values, names = {}, {}
  for name, x in tensors.items():
    found = locate(name)
    if found is None or found[0] not in ours:
      raise ValueError(f"{where}: unknown tensor {name!r} (shape {tuple(np.shape(x))}): no parameter of ours takes it")
    path, kind = found
    value = _to_ours(kind, x)
    if value.shape != tuple(ours[path].shape):
      raise ValueError(f"{where}: tensor {name!r}: expected shape {_fla_shape(kind, ours[path].shape)} for this "
                       f"config, got {tuple(np.shape(x))}")
    values[path], names[path] = value, name
  if missing := [p for p in ours if p not in values]:
    raise ValueError(f"{where}: missing tensors for {['/'.join(map(str, p)) for p in missing][:5]}"
                     f"{' ...' if len(missing) > 5 else ''} ({len(missing)} in all)")
  state = nnx.state(module, nnx.Param)
  pure = nnx.to_pure_dict(state)
  for path, value in values.items():
    node = pure
    for key in path[:-1]:
      node = node[key]
    node[path[-1]] = jnp.asarray(value)
  nnx.replace_by_pure_dict(state, pure)
  nnx.update(module, state)
  return module


def _fla_shape(kind, shape):
  shape = tuple(shape)
  return {"linear": shape[::-1], "conv": (shape[1], 1, shape[0]), "as_is": shape}[kind]


def _read(path_or_tensors, where):
  if isinstance(path_or_tensors, (str, os.PathLike)):
    try:
      return load_file(os.fspath(path_or_tensors))
    except FileNotFoundError:
      raise ValueError(f"{where}: no such file {os.fspath(path_or_tensors)!r}") from None
    except Exception as e:  # safetensors raises its own error types for a damaged header or body
      raise ValueError(f"{where}: {os.fspath(path_or_tensors)!r} is not a readable safetensors file ({e})") from None
  return dict(path_or_tensors)


def fla_layer(kind, tensors, *, hidden_size, num_heads, head_dim, norm_eps=FLA_LAYER_NORM_EPS, lower_bound=None,
              impl="auto", dtype=jnp.float32):
  """One fla layer as ours: kind "gdn", "kda" or "gdn2" (fla's `GatedDeltaNet`, `KimiDeltaAttention`,
  `GatedDeltaNet2` with its other arguments at their defaults), tensors its state dict ({name: array}, or a
  .safetensors path); lower_bound: KDA's, for fla's `KimiDeltaAttention(safe_gate=True, lower_bound=...)`.
  Returns the `DeltaMixer`: layer(x [B, T, hidden_size]) -> y [B, T, hidden_size]."""
  if kind not in LAYER_KINDS:
    raise ValueError(f"kind: expected one of {tuple(LAYER_KINDS)}, got {kind!r}")
  if lower_bound is not None and kind != "kda":
    raise ValueError(f"lower_bound: fla's {kind} layer has no bounded gate (only kda's), expected None, "
                     f"got {lower_bound!r}")
  mixer, expand_v = LAYER_KINDS[kind]
  layer = DeltaMixer(hidden_size, mixer=mixer, num_heads=num_heads, head_dim=head_dim,
                     value_dim=int(head_dim * expand_v),
                     layer=layer_config(mixer, "fla", norm_eps=norm_eps, lower_bound=lower_bound), impl=impl,
                     dtype=dtype, rngs=nnx.Rngs(0))
  return _fill(layer, _read(tensors, f"fla {kind} layer"), lambda name: _layer_path(mixer, name), f"fla {kind} layer")


# fla config fields that change the forward pass and the only values we build (else a one-line error).
_FIXED = {"use_short_conv": True, "allow_neg_eigval": False, "attn": None, "hidden_act": "swish",
          "attnres_block_size": None, "use_gate": True}


def _model_config(fla_config, where):
  """Our model config for an fla config dict."""
  if (model_type := fla_config.get("model_type")) not in MODEL_TYPES:
    raise ValueError(f"{where}: model_type: expected one of {tuple(MODEL_TYPES)}, got {model_type!r}")
  mixer = MODEL_TYPES[model_type][0]
  for field, value in _FIXED.items():
    if field in fla_config and fla_config[field] != value:
      raise ValueError(f"{where}: config field {field}={fla_config[field]!r} is not supported (only {value!r})")
  safe_gate, lower_bound = fla_config.get("safe_gate", False), fla_config.get("lower_bound")
  if safe_gate not in (False, True) or (safe_gate and lower_bound is None):
    raise ValueError(f"{where}: config field safe_gate={safe_gate!r} is not supported (only False, or True with a "
                     "lower_bound, as fla's KDAConfig requires)")
  if lower_bound is not None and mixer != "kda":
    raise ValueError(f"{where}: config field lower_bound={lower_bound!r} is not supported (fla's {model_type} layer "
                     "has no bounded gate: only None)")
  if lower_bound is not None and (isinstance(lower_bound, bool) or not isinstance(lower_bound, (int, float))):
    raise ValueError(f"{where}: config field lower_bound={lower_bound!r} is not supported (expected a number)")
  if fla_config.get("num_v_heads") not in (None, fla_config.get("num_heads")):
    raise ValueError(f"{where}: config field num_v_heads={fla_config['num_v_heads']!r} is not supported "
                     "(grouped value heads: only None or num_heads)")
  required = ("hidden_size", "num_heads", "head_dim", "num_hidden_layers", "vocab_size")
  if missing := [f for f in required if f not in fla_config]:
    raise ValueError(f"{where}: config fields {missing} missing")
  width, expand_v = fla_config["hidden_size"], fla_config.get("expand_v", 2.0 if mixer == "gdn" else 1.0)
  hidden = fla_config.get("intermediate_size")
  if hidden is None:  # fla's GatedMLP: 2/3 of hidden_ratio x width, rounded up to a multiple of 256
    hidden = int(width * (fla_config.get("hidden_ratio") or 4) * 2 / 3)
    hidden = 256 * ((hidden + 255) // 256)
  c = default_config()
  c.mixer, c.pattern, c.vocab_size = mixer, "D", fla_config["vocab_size"]
  c.num_layers, c.width, c.num_heads = fla_config["num_hidden_layers"], width, fla_config["num_heads"]
  c.head_dim = fla_config["head_dim"]
  c.value_dim = int(c.head_dim * expand_v)
  if c.value_dim != c.head_dim * expand_v:
    raise ValueError(f"{where}: config field expand_v={expand_v!r} gives a non-integer value width")
  c.mlp_hidden, c.norm_eps, c.init = hidden, float(fla_config.get("norm_eps", 1e-6)), "fla"
  c.tie_embeddings = bool(fla_config.get("tie_word_embeddings", False))
  c.delta.preset = "fla"  # its layers take the model's norm_eps, as fla's do (models.config.delta_layer)
  c.delta.conv_size = int(fla_config.get("conv_size", 4))
  if lower_bound is not None:  # the bounded gate, with or without fla's safe_gate kernels (the module docstring)
    c.delta.lower_bound = float(lower_bound)
  if mixer == "gdn":
    activation = fla_config.get("output_gate_activation", "swish")
    if activation not in ("swish", "silu", "sigmoid"):
      raise ValueError(f"{where}: config field output_gate_activation={activation!r} is not supported")
    c.delta.output_gate.activation = "sigmoid" if activation == "sigmoid" else "silu"
  return c


def load_fla(path, *, dtype="float32"):
  """An fla HF directory (config.json + model.safetensors, or sharded with model.safetensors.index.json) ->
  (model, config): our `LanguageModel` and its model config; model(tokens [B, T] int32) -> fp32 logits
  [B, T, vocab]. dtype: the compute dtype (parameters stay fp32)."""
  where = f"fla checkpoint {os.fspath(path)!r}"
  config_path = os.path.join(path, "config.json")
  if not os.path.isdir(path) or not os.path.isfile(config_path):
    raise ValueError(f"{where}: expected a directory with config.json and model.safetensors")
  try:
    with open(config_path) as f:
      fla_config = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{where}: config.json is not JSON ({e})") from None
  config = _model_config(fla_config, where)
  config.dtype = dtype
  tensors = {}
  index = os.path.join(path, "model.safetensors.index.json")
  files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.isfile(index) else ["model.safetensors"]
  for name in files:
    tensors.update(_read(os.path.join(path, name), where))
  if config.tie_embeddings:
    tensors.pop("lm_head.weight", None)  # a tied head may be written out as a copy of the embedding
  model = nnx.eval_shape(lambda: LanguageModel(config, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(model)
  model = nnx.merge(graphdef, jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), state))
  return _fill(model, tensors, lambda name: _model_path(config.mixer, name), where), config


def fla_config(config):
  """The fla config dict of our model config; ValueError where fla's model cannot express it."""
  where = "save_fla"
  types = {mixer: (t, arch) for t, (mixer, arch) in MODEL_TYPES.items()}
  if config.mixer not in types or set(layer_letters(config.pattern, config.num_layers)) != {"D"}:
    raise ValueError(f"{where}: fla's models are {sorted(types)} stacks (pattern 'D'), got mixer "
                     f"{config.mixer!r} with pattern {config.pattern!r}")
  model_type, architecture = types[config.mixer]
  norm_eps = float(config.get("norm_eps", 1e-6))
  ours = delta_layer(config)
  fla = layer_config(config.mixer, "fla", norm_eps=norm_eps, conv_size=ours.conv_size,
                     output_gate={"activation": ours.output_gate.activation} if config.mixer == "gdn" else {},
                     lower_bound=ours.lower_bound if config.mixer == "kda" else None)  # KDA's layer alone takes one
  compared = ("output_gate", "decay_rank", "gate_bias", "conv_bias", "norm_eps", "lower_bound")
  if differ := [f for f in compared if getattr(ours, f) != getattr(fla, f)]:
    raise ValueError(f"{where}: the dense layer differs from fla's in {differ} (model.delta; fla's layer has "
                     f"{ {f: getattr(fla, f) for f in differ} }, and its o_norm eps is the model's norm_eps)")
  fields = {"model_type": model_type, "architectures": [architecture], "hidden_size": config.width,
            "num_heads": config.num_heads, "head_dim": config.head_dim,
            "expand_v": config.value_dim / config.head_dim, "num_hidden_layers": config.num_layers,
            "vocab_size": config.vocab_size, "intermediate_size": mlp_hidden(config), "norm_eps": norm_eps,
            "tie_word_embeddings": bool(config.get("tie_embeddings", False)), "conv_size": ours.conv_size,
            "use_short_conv": True, "allow_neg_eigval": False, "hidden_act": "swish", "initializer_range": 0.02,
            "fuse_norm": True, "fuse_swiglu": True, "fuse_cross_entropy": True, "dtype": "float32"}
  if config.mixer == "gdn":
    fields.update(use_gate=True, output_gate_activation=ours.output_gate.activation)
  if ours.lower_bound is not None:
    fields.update(lower_bound=ours.lower_bound, safe_gate=FLA_SAFE_GATE_LOWEST <= ours.lower_bound)
  return fields


def save_fla(model, config, path):
  """Writes our `LanguageModel` (its config `config`) as an fla HF directory: config.json and model.safetensors,
  fp32, which fla's `AutoModelForCausalLM.from_pretrained` loads."""
  fields = fla_config(config)
  ours = _flat_state(model)
  names = _fla_names(config)
  tensors = {}
  for name, (path_, kind) in names.items():
    tensors[name] = _to_fla(kind, ours[path_])
  if set(ours) != {p for p, _ in names.values()}:
    left = sorted('/'.join(map(str, p)) for p in set(ours) - {p for p, _ in names.values()})
    raise ValueError(f"save_fla: parameters with no fla name: {left}")
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(fields, f, indent=2, sort_keys=True)
  save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def _fla_names(config):
  """{fla tensor name: (our path, kind)} for every parameter of a model config fla can express."""
  model = nnx.eval_shape(lambda: LanguageModel(config, rngs=nnx.Rngs(0)))
  candidates = ["model.embeddings.weight", "model.norm.weight"]
  if not config.get("tie_embeddings", False):
    candidates.append("lm_head.weight")
  layer = model.blocks[0].mixer
  layer_names = [_fla_layer_name(config.mixer, p) for p in _flat_state(layer)]
  for i in range(config.num_layers):
    prefix = f"model.layers.{i}."
    candidates += [prefix + "attn_norm.weight", prefix + "mlp_norm.weight"]
    candidates += [prefix + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
    candidates += [prefix + "attn." + n for n in layer_names]
  return {name: _model_path(config.mixer, name) for name in candidates}


def _fla_layer_name(mixer, path):
  """Our layer parameter path -> fla's tensor name (the inverse of `_layer_path`)."""
  inverse = {("q_conv",): "q_conv1d", ("k_conv",): "k_conv1d", ("v_conv",): "v_conv1d",
             ("decay", "f_proj"): "a_proj" if mixer == "gdn" else "f_proj", ("decay", "A_log"): "A_log",
             ("decay", "dt_bias"): "dt_bias", ("out_gate_proj",): "g_proj", ("beta_proj",): "b_proj"}
  for size in (2, 1):
    if path[:size] in inverse:
      head, rest = inverse[path[:size]], path[size:]
      break
  else:
    head, rest = path[0], path[1:]
  if head in ("A_log", "dt_bias"):
    return head
  index = [str(rest[i + 1]) for i in range(len(rest) - 1) if rest[i] == "layers"]
  leaf = "bias" if rest[-1] == "bias" else "weight"
  return ".".join([head, *index, leaf])
