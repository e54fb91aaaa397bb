"""Learning-rate schedules by name (train.schedule): each one's values at the steps that define it."""

import numpy as np
import pytest

from sdm_jax.training.config import ConfigError, check_config, default_config
from sdm_jax.training.optimizer import SCHEDULES, make_schedule
from training_helpers import attention_config

PEAK, END_FRACTION, WARMUP, STEPS = 1e-3, 0.1, 100, 1000


def train_config(schedule, **fields):
  train = default_config(STEPS, PEAK, warmup_steps=WARMUP)
  train.final_lr_fraction = END_FRACTION
  train.schedule = schedule
  train.update(fields)
  return train


def values(train, steps):
  schedule = make_schedule(train)
  return np.array([float(schedule(step)) for step in steps])


def test_cosine():
  # Linear warmup, then half a cosine period from the peak down to END_FRACTION of it at STEPS.
  middle = (WARMUP + STEPS) // 2
  np.testing.assert_allclose(values(train_config("cosine"), [0, WARMUP // 2, WARMUP, middle, STEPS, STEPS + 50]),
                             [0, PEAK / 2, PEAK, PEAK * (1 + END_FRACTION) / 2, PEAK * END_FRACTION,
                              PEAK * END_FRACTION], rtol=1e-6, atol=1e-12)


def test_wsd():
  # decay_fraction 0.2 of 1000 steps: the peak held from step 100 to 800, then a straight line to 1e-4 at 1000.
  train = train_config("wsd", decay_fraction=0.2)
  np.testing.assert_allclose(values(train, [0, 50, 100, 450, 800, 900, 1000, 1100]),
                             [0, PEAK / 2, PEAK, PEAK, PEAK, PEAK * (1 + END_FRACTION) / 2, PEAK * END_FRACTION,
                              PEAK * END_FRACTION], rtol=1e-6, atol=1e-12)
  # A decay longer than what follows the warmup starts right after it.
  train = train_config("wsd", decay_fraction=1.0)
  np.testing.assert_allclose(values(train, [WARMUP, WARMUP + 500]),
                             [PEAK, PEAK - (PEAK - PEAK * END_FRACTION) * 500 / STEPS], rtol=1e-6)


def test_constant():
  np.testing.assert_allclose(values(train_config("constant"), [0, 25, WARMUP, 500, STEPS, STEPS + 50]),
                             [0, PEAK / 4, PEAK, PEAK, PEAK, PEAK], rtol=1e-6, atol=1e-12)


def test_every_schedule_warms_up_the_same_way():
  warmup = [values(train_config(name), range(0, WARMUP + 1, 10)) for name in SCHEDULES]
  for curve in warmup[1:]:
    np.testing.assert_allclose(curve, warmup[0], rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("field, value, message", [
    ("schedule", "cosin", r"config.train.schedule: expected one of \('cosine', 'wsd', 'constant'\), got 'cosin' "
                          r"\(did you mean 'cosine'\?\)"),
    ("decay_fraction", 0.0, r"config.train.decay_fraction: expected a number in \(0, 1\], got 0.0"),
    ("decay_fraction", 1.5, r"config.train.decay_fraction: expected a number in \(0, 1\], got 1.5"),
])
def test_a_bad_schedule_is_refused(field, value, message):
  config = attention_config(steps=2)
  config.train[field] = value
  with pytest.raises(ConfigError, match=message):
    check_config(config)
