"""``poolgrad explain --kind K`` for the kinds beyond max, average and Lp: the gradient of
one output, routed back by the kind's own pullback, is what each kind's definition says
it is, and the command prints it and draws it."""

import numpy as np
import pytest

from poolgrad import cli
from poolgrad.explain import ExplainError
from poolgrad.explain import kinds as explained

PNG = b"\x89PNG\r\n\x1a\n"
OUT = (2, 2)  # the middle output of an 8x8 map pooled 2x: it reads rows and columns 4-5


@pytest.fixture(scope="module")
def maps():
    """Six 8x8 maps of distinct non-negative values (no ties), like a ReLU's output."""
    rng = np.random.default_rng(7)
    return rng.permutation(6 * 64).reshape(6, 8, 8) / 384.0 + rng.random((6, 8, 8)) * 1e-3


def window(x):
    return x[:, 4:6, 4:6]


def test_blur_spreads_it_over_the_binomial_taps(maps):
    numbers = explained.window_gradient(maps, "blur", output=OUT)
    taps = np.outer([1, 2, 1], [1, 2, 1]) / 16
    expected = np.zeros((8, 8))
    expected[3:6, 3:6] = taps  # a 3-tap filter centred on the even position 4
    for dx in numbers["dx"]:
        np.testing.assert_allclose(dx, expected, atol=1e-15)


def test_soft_and_gem_weigh_every_tap_by_their_formulas(maps):
    w = window(maps).reshape(6, 4)
    soft = explained.window_gradient(maps, "soft", output=OUT)["dx"][:, 4:6, 4:6].reshape(6, 4)
    weights = np.exp(w) / np.exp(w).sum(axis=1, keepdims=True)
    y = (weights * w).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(soft, weights * (1 + w - y), rtol=1e-12)  # d(sum w x)/dx
    gem = explained.window_gradient(maps, "gem", output=OUT)["dx"][:, 4:6, 4:6].reshape(6, 4)
    z = np.maximum(w, 1e-6)
    y = np.mean(z ** 3, axis=1, keepdims=True) ** (1 / 3)
    np.testing.assert_allclose(gem, (z / y) ** 2 / 4, rtol=1e-12)


def test_mixed_and_gated_split_it_between_the_winner_and_the_window(maps):
    w = window(maps).reshape(6, 4)
    winner = np.eye(4)[w.argmax(axis=1)]
    mixed = explained.window_gradient(maps, "mixed", output=OUT)["dx"][:, 4:6, 4:6]
    np.testing.assert_allclose(mixed.reshape(6, 4), 0.5 * winner + 0.5 / 4, rtol=1e-12)
    gated = explained.window_gradient(maps, "gated", output=OUT)["dx"][:, 4:6, 4:6]
    gate = np.full(4, explained.GATE)
    s = 1 / (1 + np.exp(-(w @ gate)))[:, None]
    branches = w.max(axis=1, keepdims=True) - w.mean(axis=1, keepdims=True)
    expected = s * winner + (1 - s) / 4 + s * (1 - s) * gate * branches
    np.testing.assert_allclose(gated.reshape(6, 4), expected, rtol=1e-12)


def test_stochastic_sends_it_to_the_tap_drawn_as_often_as_its_share(maps):
    numbers = explained.window_gradient(maps, "stochastic", output=OUT)
    np.testing.assert_allclose(numbers["probabilities"].sum(axis=(1, 2)), 1)
    np.testing.assert_allclose(numbers["probabilities"],
                               window(maps) / window(maps).sum(axis=(1, 2), keepdims=True))
    assert numbers["window"] == (4, 4)
    counts = np.zeros((2, 2))
    draws = 600
    for seed in range(draws):
        dx = explained.window_gradient(maps[:1], "stochastic", seed, OUT)["dx"][0]
        (h, w), = np.argwhere(dx)
        assert dx[h, w] == 1 and 4 <= h < 6 and 4 <= w < 6
        counts[h - 4, w - 4] += 1
    # each tap's share of the draws within 4.5 standard deviations of its probability
    p = numbers["probabilities"][0]
    assert np.all(np.abs(counts / draws - p) < 4.5 * np.sqrt(p * (1 - p) / draws) + 1e-9)


def test_a_window_of_zeros_draws_its_first_element():
    x = np.zeros((1, 8, 8))
    numbers = explained.window_gradient(x, "stochastic", output=OUT)
    assert numbers["dx"][0, 4, 4] == 1 and numbers["dx"].sum() == 1
    assert "(a window of zeros gives its first element)" in explained.render_window(numbers)


def test_fractional_sends_it_to_the_winner_of_its_irregular_window(maps):
    numbers = explained.window_gradient(maps, "fractional", seed=3, output=OUT)
    assert numbers["y"].shape == (6, 5, 5)
    irregular = 0
    for n, (starts_h, starts_w) in enumerate(numbers["windows"]):
        assert len(starts_h) == len(starts_w) == 5
        irregular += len(set(np.diff(starts_h))) > 1
        top, left = starts_h[OUT[0]], starts_w[OUT[1]]
        region = maps[n, top:top + 2, left:left + 2]
        expected = np.zeros((8, 8))
        h, w = np.unravel_index(region.argmax(), region.shape)
        expected[top + h, left + w] = 1
        np.testing.assert_array_equal(numbers["dx"][n], expected)
        assert numbers["y"][n][OUT] == region.max()
    assert irregular > 0  # the starts do not step evenly


def test_the_blurred_maxima_send_it_to_winners_and_keep_its_sum(maps):
    for kind in ("max-blur", "avg-blur"):
        dx = explained.window_gradient(maps, kind, output=OUT)["dx"]
        np.testing.assert_allclose(dx.sum(axis=(1, 2)), 1, rtol=1e-12)
        assert (dx >= 0).all()
    dx = explained.window_gradient(maps, "max-blur", output=OUT)["dx"]
    for n in range(6):  # every position that gets some won a 2x2 window at stride 1
        winners = {(h + a, w + b) for h in range(7) for w in range(7)
                   for a, b in [divmod(int(maps[n, h:h + 2, w:w + 2].argmax()), 2)]}
        assert {tuple(p) for p in np.argwhere(dx[n])} <= winners


@pytest.mark.parametrize("kind", explained.KINDS)
def test_the_command_prints_and_draws_each_kind(tmp_path, capsys, kind):
    pytest.importorskip("sklearn")
    assert cli.main(["explain", "--kind", kind, "--examples", "2",
                     "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{kind}: " in out and "the gradient of output (2, 2)" in out
    assert out.count("its gradient (sum") == 2
    assert (tmp_path / f"{kind}.png").read_bytes()[:8] == PNG
    assert (tmp_path / f"{kind}.png").stat().st_size > 20_000


def test_what_it_cannot_explain_is_refused(maps):
    with pytest.raises(ExplainError, match=r"explains \(N, H, W\) maps of at least 4x4"):
        explained.window_gradient(maps[:, :3], "blur")
    for output in ((4, 0), 3, (1.5, 1), (1,), (True, 0)):
        with pytest.raises(ExplainError, match=r"output must be a position \(i, j\) of the "
                                               r"4x4 output"):
            explained.window_gradient(maps, "soft", output=output)
    with pytest.raises(ExplainError, match="unknown kind 'median'"):
        explained.window_gradient(maps, "median")
