"""The error measure of DESIGN.md section 6, ||x - ref|| / ||ref||, and the bounds the tests hold it to.

`relative_error` is the measure; `error_report` and `assert_close` apply it to every entry of a run flattened by
`results` (o, final_state, d_<input>), with fp32's subnormal floor; `TOLERANCES` is the table of section 6.
"""

import numpy as np

# DESIGN.md section 6: bounds on the relative error against the scan, by input dtype and impl, as (outputs and final
# state, gradients). bf16 inputs are held to the fp32 scan run on the same bf16-rounded values.
TOLERANCES = {
    "float32": {"chunk": (1e-5, 1e-5), "pallas": (1e-4, 1e-3)},
    "bfloat16": {"chunk": (1e-2, 1e-2), "pallas": (1e-2, 1e-2)},
}
FP32_TOL = TOLERANCES["float32"]


def relative_error(x, reference):
  """||x - reference|| / ||reference||, in float64, as a float.

  x, reference: arrays of one shape (nothing is broadcast). A reference of exactly zero accepts only exactly zero
  (0.0, else inf): a state decayed below fp32's range and the gradient of an unused input are such answers.
  Non-finite entries in x give nan or inf, which no bound accepts.
  """
  x = np.asarray(x, np.float64)
  reference = np.asarray(reference, np.float64)
  if x.shape != reference.shape:
    raise AssertionError(f"shape {x.shape} != reference shape {reference.shape}")
  with np.errstate(invalid="ignore", over="ignore"):
    diff = np.linalg.norm(x - reference)
    scale = np.linalg.norm(reference)
    if scale == 0.0:
      return 0.0 if diff == 0.0 else float("inf")
    return float(diff / scale)


def results(o, final_state, grads=None):
  """Flattens a run into the dict that `assert_close` compares: o, final_state and d_<name> per gradient."""
  out = {"o": o, "final_state": final_state}
  for name, grad in (grads or {}).items():
    out[f"d_{name}"] = grad
  return out


def error_report(actual, reference, tol):
  """(failed, one line per entry): every entry of `actual` finite and within `tol` of `reference`.

  actual, reference: dicts name -> array with the same keys. The reference is first rounded to the
  dtype of `actual` (at least fp32): a float64 value below fp32's range (exp(-200) after 200 steps of decay 1) is 0
  in fp32, and that 0 is the exact answer an fp32 implementation can give.
  """
  assert actual.keys() == reference.keys(), (sorted(actual), sorted(reference))
  lines, failed = [], False
  for name in reference:
    x = np.asarray(actual[name], np.float64)
    ref_dtype = np.promote_types(np.asarray(actual[name]).dtype, np.float32)
    ref = np.asarray(np.asarray(reference[name]).astype(ref_dtype), np.float64)
    finite = bool(np.all(np.isfinite(x)))
    err = relative_error(x, ref) if finite else np.nan
    # Below fp32's smallest normal number (1.2e-38) values are subnormal and carry no relative
    # precision; a difference that small is a pass whatever the reference's own size.
    floor = np.finfo(ref_dtype).tiny * np.sqrt(max(x.size, 1))
    bad = not finite or not (err <= tol or np.linalg.norm(x - ref) <= floor)
    failed |= bad
    lines.append(f"  {name:>16}: {'NON-FINITE' if not finite else f'{err:.3e}'}{'  <-- FAIL' if bad else ''}")
  return failed, "\n".join(lines)


def assert_close(actual, reference, tol, context=""):
  """Asserts `error_report` passes; on failure the message lists the error of every entry.

  tol: one bound for every entry, or (outputs, gradients) as in `TOLERANCES`: entries named d_* are gradients.
  """
  if isinstance(tol, tuple):
    assert actual.keys() == reference.keys(), (sorted(actual), sorted(reference))
    out_tol, grad_tol = tol
    gradients = [name for name in reference if name.startswith("d_")]
    outputs = [name for name in reference if name not in gradients]
    for names, part_tol in ((outputs, out_tol), (gradients, grad_tol)):
      if names:
        assert_close({n: actual[n] for n in names}, {n: reference[n] for n in names}, part_tol, context)
    return
  failed, report = error_report(actual, reference, tol)
  assert not failed, f"{context} (tolerance {tol:.0e}, ||x - ref|| / ||ref||):\n{report}"
