"""The illustrative timing law (Eq 11-12): the safe expression evaluator, normalization,
α scaling and the fastest-feasible crossover search."""

from __future__ import annotations

import numpy as np
import pytest

from splash_core.layouts import Layout
from splash_core.profiles.expressions import Expression, ExpressionError
from splash_core.studies.timing_law import CompiledLaw, crossovers

PAPER = {  # appendix B.1, Eq 11
    Layout.TP: "0.40 + 0.25*x + pos(0.15 - 0.0625*x)",
    Layout.DP: "2.45 + a",
    Layout.CP: "2.55 + 0.05*x + pos(3.40 - 0.025*x)",
    Layout.DOP: "0.45 + a + pos(4.80 - 0.35*a)",
}


def law(alpha=1.0, costs=None):
    costs = costs or PAPER
    return CompiledLaw({"alpha": alpha}, Expression("L / 1024 / alpha"),
                       (("a", Expression("0.05*x + 1.2*x/(x + 8)")),),
                       {k: Expression(v) for k, v in costs.items()}, Layout.TP, 1024.0)


def test_expressions_evaluate_arithmetic_and_pos():
    env = {"x": np.array([-2.0, 0.0, 3.0]), "k": 2.0}
    np.testing.assert_allclose(Expression("pos(x) * k + 1")(env), [1.0, 1.0, 7.0])
    np.testing.assert_allclose(Expression("-x ** 2 / 4")(env), [-1.0, 0.0, -2.25])
    np.testing.assert_allclose(Expression("max(x, 1, 0.5) + min(x, 0)")(env), [-1.0, 1.0, 3.0])
    assert Expression("a*x + pos(b - c)").names == {"a", "x", "b", "c"}


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')", "x.real", "x[0]", "lambda: 1", "x if x else 1", "x < 1",
    "'text'", "True + 1", "pos(x, y)", "pos(v=x)", "exec('1')", "", "1 +",
])
def test_expressions_reject_anything_but_arithmetic(text):
    with pytest.raises(ExpressionError):
        Expression(text)


def test_normalized_is_one_for_the_reference_at_1k():
    for alpha in (1.0, 0.6252985669, 1.2853801752):
        assert law(alpha).normalized(1024.0)[Layout.TP] == pytest.approx(1.0)


def test_paper_law_crossovers_dcu():
    found = crossovers(law(), {}, 1024, 420 * 1024)
    assert [(c.before, c.after) for c in found] == [(Layout.TP, Layout.DP), (Layout.DP, Layout.CP),
                                                    (Layout.CP, Layout.DOP)]
    assert [round(c.tokens / 1024, 1) for c in found] == [14.1, 95.7, 197.1]
    assert all(c.cause == "timing" for c in found)


def test_alpha_scales_every_crossover():
    base = [c.tokens for c in crossovers(law(), {}, 1024, 420 * 1024)]
    for alpha in (0.6252985669, 1.2853801752):
        scaled = [c.tokens for c in crossovers(law(alpha), {}, 1024, 600 * 1024)]
        np.testing.assert_allclose(scaled, np.array(base) * alpha, rtol=1e-6)


def test_a_kv_limit_ends_the_leaders_range():
    costs = {Layout.TP: "1 + 0.01*x", Layout.DP: "2 + 0.001*x"}  # TP would lead everywhere below 1111k
    found = crossovers(law(costs=costs), {Layout.TP: 50_000, Layout.DP: 200_000}, 1024, 300_000)
    assert [(c.before, c.after, c.cause) for c in found] == [(Layout.TP, Layout.DP, "capacity"),
                                                              (Layout.DP, None, "capacity")]
    assert found[0].tokens == pytest.approx(50_000, abs=0.01)
    assert found[1].tokens == pytest.approx(200_000, abs=0.01)
