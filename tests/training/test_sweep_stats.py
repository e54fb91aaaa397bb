"""Statistics for bimodal seeds: Fisher's exact test and the permutation test against hand-computed hypergeometric
and enumeration values, the bootstrap intervals, Holm's procedure, the verdicts, the learning-rate pick, the tables and
the plots."""

import math

import pytest

from sdm_jax.training import sweep_stats as st

SETTING = (("task", "mqar"), ("width", 128), ("pairs", 64), ("head_dim", 64))


def outcomes(model, accuracies, *, rate=3e-3, setting=SETTING, steps=None, budget=4000):
  steps = steps or [None] * len(accuracies)
  return [st.Outcome(model, setting, seed, rate, accuracy, budget if reached is None else reached, reached,
                     ((0, 0.0), (budget if reached is None else reached, accuracy)))
          for seed, (accuracy, reached) in enumerate(zip(accuracies, steps))]


def hypergeometric_tail(successes_a, runs_a, successes_b, runs_b):
  total = successes_a + successes_b
  size = runs_a + runs_b
  return sum(math.comb(total, i) * math.comb(size - total, runs_a - i)
             for i in range(successes_a, min(total, runs_a) + 1)) / math.comb(size, runs_a)


@pytest.mark.parametrize("counts", [(5, 5, 1, 5), (4, 5, 0, 5), (4, 5, 1, 5), (3, 3, 0, 3), (7, 10, 2, 8)])
def test_fisher_against_the_hypergeometric_tail(counts):
  assert st.fisher_greater(*counts) == pytest.approx(hypergeometric_tail(*counts), rel=1e-12)
  assert st.fisher_greater(5, 5, 1, 5) == pytest.approx(6 / 252)


def test_what_five_seeds_can_decide():
  assert st.decisive_counts(5, 5) == [(4, 0), (5, 1)]
  assert st.decisive_counts(3, 3) == []  # 3 of 3 against 0 of 3 is p = 0.05: three seeds decide nothing


def test_permutation_test_by_enumeration():
  # Of the C(4, 2) = 6 relabellings of {100, 200, 300, 400}, only the observed one has A's mean 200 below B's.
  assert st.permutation_less([100, 200], [300, 400]) == pytest.approx(1 / 6)
  assert st.permutation_less([300, 400], [100, 200]) == 1.0
  assert st.permutation_less([250, 250], [250, 250]) == 1.0  # ties count in: no evidence either way


def test_bootstrap_intervals():
  assert st.bootstrap_interval([0.7, 0.7, 0.7]) == pytest.approx((0.7, 0.7), abs=1e-12)
  low, high = st.bootstrap_interval([0.0, 1.0, 0.0, 1.0, 1.0])
  assert 0 <= low < 0.6 < high <= 1 and st.bootstrap_interval([0.0, 1.0, 0.0, 1.0, 1.0]) == (low, high)
  low, high = st.bootstrap_difference([1.0] * 5, [0.0] * 5)
  assert (low, high) == (1.0, 1.0)
  with pytest.raises(ValueError, match="values: expected at least one value"):
    st.bootstrap_interval([])


def test_holm():
  assert st.holm([0.01, 0.04, 0.03]) == [True, False, False]  # 0.03 >= 0.05 / 2 stops the procedure
  assert st.holm([0.01, 0.02, 0.03]) == [True, True, True]
  assert st.holm([0.2, 0.001]) == [False, True]


def test_comparisons_and_verdicts():
  solved, chance = [0.99, 0.98, 0.995, 0.97, 0.99], [0.01, 0.0, 0.02, 0.01, 0.95]
  c = st.compare(outcomes("kda", solved), outcomes("gdn2", chance), threshold=0.9)
  assert (c.basis, c.successes_a, c.successes_b) == ("successes", 5, 1)
  assert c.p_greater == pytest.approx(6 / 252) and c.verdict() == st.HOLDS and c.rate_difference == pytest.approx(0.8)
  assert c.mean_difference == pytest.approx(0.985 - 0.198)
  reverse = st.compare(outcomes("gdn2", chance), outcomes("kda", solved), threshold=0.9)
  assert reverse.verdict() == st.DOES_NOT_HOLD
  # Both always solve it: the faster learner, by steps-to-target.
  fast = st.compare(outcomes("a", solved, steps=[500, 750, 500, 750, 500]),
                    outcomes("b", solved, steps=[1500, 1750, 2000, 1500, 1750]), threshold=0.9)
  assert fast.basis == "steps" and fast.p_greater == pytest.approx(1 / 252) and fast.verdict() == st.HOLDS
  neither = st.compare(outcomes("a", chance[:4]), outcomes("b", chance[:4]), threshold=0.9)
  assert neither.basis == "neither" and neither.verdict() == st.UNDECIDED
  four_one = st.compare(outcomes("a", [0.99] * 4 + [0.0]), outcomes("b", [0.99] + [0.0] * 4), threshold=0.9)
  assert four_one.verdict() == st.UNDECIDED and four_one.p_greater == pytest.approx(26 / 252)
  # Over settings (Holm): A better at one and worse at none holds; both directions depend on the setting.
  other = (("task", "mqar"), ("width", 256), ("pairs", 64), ("head_dim", 64))
  at_other = st.compare(outcomes("kda", chance, setting=other), outcomes("gdn2", solved, setting=other), 0.9)
  assert st.pair_verdict([c, four_one]) == (st.HOLDS, [SETTING], [])
  assert st.pair_verdict([c, at_other])[0] == st.DEPENDS
  assert st.pair_verdict([four_one]) == (st.UNDECIDED, [], [])
  assert st.claim_verdict([st.HOLDS, st.HOLDS]) == st.HOLDS
  assert st.claim_verdict([st.HOLDS, st.UNDECIDED]) == "partly"
  assert st.claim_verdict([st.DOES_NOT_HOLD, st.UNDECIDED]) == st.DOES_NOT_HOLD
  assert st.claim_verdict([st.UNDECIDED]) == st.UNDECIDED == st.claim_verdict([])


def test_learning_rate_pick():
  pilot = (outcomes("gdn", [0.2, 0.1], rate=1e-3) + outcomes("gdn", [0.999, 0.999], rate=3e-3, steps=[2000, 2250])
           + outcomes("gdn", [0.995, 0.995], rate=1e-2, steps=[1000, 1250])
           + outcomes("kda", [0.5, 0.9], rate=1e-3) + outcomes("kda", [0.0, 0.1], rate=1e-2))
  # gdn: 3e-3 is ahead by 0.004, within RATE_TIE: 1e-2, which gets there in half the steps, is picked.
  assert st.best_rates(pilot) == {"gdn": 1e-2, "kda": 1e-3}
  kept = st.at_rates(pilot, {"gdn": 1e-2})
  assert {(o.model, o.learning_rate) for o in kept} == {("gdn", 1e-2), ("kda", 1e-3)}
  with pytest.raises(ValueError, match="setting: the outcomes have 2 settings"):
    st.best_rates(pilot + outcomes("gdn", [0.5], setting=(("task", "mqar"),)))
  with pytest.raises(ValueError, match="seed repeated"):
    st.groups(pilot + outcomes("kda", [0.5], rate=1e-3))
  table = st.rate_table(pilot, st.best_rates(pilot), threshold=0.9)
  assert "| gdn | 0.01 | 2 / 2 | 0.995 | 1125 | **yes** |" in table
  assert "| kda | 0.01 | 0 / 2 | 0.050 | 4000 |  |" in table


def test_tables_and_plots(tmp_path):
  runs = (outcomes("kda", [0.99, 0.98, 0.5], steps=[500, 750, None])
          + outcomes("kda", [0.9, 0.2, 0.1], setting=(("task", "mqar"), ("width", 128), ("pairs", 256),
                                                      ("head_dim", 64)))
          + outcomes("gdn", [0.1, 0.2, 0.95]))
  table = st.outcome_table(runs, threshold=0.9)
  assert ("| task mqar width 128 pairs 64 head_dim 64 | kda | 0.003 | 2 / 3 | 0.823 [" in table
          and "| 0.990 (0), 0.980 (1), 0.500 (2) | 625 (2 / 3) |" in table)
  comparison = st.comparison_table([st.compare(outcomes("kda", [0.99] * 5), outcomes("gdn", [0.0] * 5), 0.9)])
  assert "| kda > gdn | task mqar width 128 pairs 64 head_dim 64 | 5/5 | 0/5 | successes | 0.004 | - | +1.00 |" \
      in comparison
  assert st.plot_curves(runs, tmp_path / "curves.png", target=0.99)
  assert st.plot_pressure(runs, tmp_path / "pressure.png", threshold=0.9)
  assert (tmp_path / "curves.png").stat().st_size > 0 and (tmp_path / "pressure.png").stat().st_size > 0
  assert not st.plot_pressure(outcomes("kda", [0.5]), tmp_path / "one_point.png")  # one pressure point: no plot
