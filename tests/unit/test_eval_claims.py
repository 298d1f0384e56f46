"""`lenext extend`'s claims (lenext_dist/eval/claims.py): each verdict follows the measured numbers
across its threshold."""
import pytest

from lenext_dist.eval.claims import CLOSE, extend_claims


def _report(hs_T, uni_T, hs_L, base_L=10.0):
    ppl = {"base": {32: base_L, 64: 20.0}, "uniform-64": {32: 10.0, 64: uni_T},
           "headscale-64": {32: hs_L, 64: hs_T}}
    return extend_claims(ppl, [64], 32, {64: 1.3})


@pytest.mark.parametrize("hs_T,uni_T,verdict", [
    (14.0, 15.0, "HeadScale better, as the paper claims"),
    (15.0, 15.0, "HeadScale NOT better (paper: better)"),  # a tie is not better
    (16.0, 15.0, "HeadScale NOT better (paper: better)"),
])
def test_headscale_against_the_best_uniform_scale(hs_T, uni_T, verdict):
    assert f"HeadScale PPL {hs_T:.2f} vs best uniform {uni_T:.2f}: {verdict}." in _report(hs_T, uni_T, 10.0)


@pytest.mark.parametrize("hs_L,close", [(10.4, True), (9.6, True), (10.6, False), (9.4, False)])
def test_headscale_close_to_base_at_L(hs_L, close):
    assert CLOSE == 0.05  # the numbers straddle it
    text = _report(14.0, 15.0, hs_L)
    assert ("close to base (within 5%)" in text) is close
    assert ("not close to base" in text) is not close


def test_a_missing_number_gives_no_verdict_and_a_nan_cell():
    text = extend_claims({"base": {32: 10.0}, "uniform-64": {}, "headscale-64": {32: 10.1}},
                         [64], 32, {64: 1.3})
    assert "vs best uniform" not in text and "| 64 | uniform c = 1.3 | nan |" in text
