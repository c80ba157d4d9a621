"""``poolgrad explain --network``: the batch's backward pass gives the mean of the
examples' own weight gradients; the misconception (average the batch first, backpropagate
once) gives another, which these tests compute independently; at the pooling layer,
averaging first is exact for average pooling and not for max pooling; the optimizers'
steps follow; the command writes its figures and says it, and refuses what it cannot
explain in one line."""

import re

import numpy as np
import pytest
from test_train import toy_data

import poolgrad as pg
from poolgrad import cli, explain, nn
from poolgrad.explain import network

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def data():
    return toy_data(n_train=200, n_test=40)


@pytest.fixture(scope="module")
def results(data):
    """Both networks, trained one epoch, on a batch of 30 test examples."""
    found = {}
    for pool in ("max", "avg"):
        model, _ = network.trained_network(data, pool, epochs=1)
        x, labels = network.test_batch(data, 30, seed=0)
        found[pool] = (model, network.network_gradients(model, x, labels, "toy"))
    return found


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_the_batch_pass_is_the_mean_of_the_examples_and_averaging_first_is_not(results, pool):
    model, result = results[pool]
    same = result.numbers["examples_vs_batch"]
    assert same["max_difference"] < 1e-15 and same["relative_error"] < 1e-13
    for key, stack in result.per_example.items():
        assert stack.shape == (30,) + result.batch[key].shape
        np.testing.assert_allclose(stack.mean(axis=0), result.batch[key], rtol=1e-12,
                                   atol=1e-16)
    wrong = result.numbers["misconception_vs_batch"]
    assert wrong["relative_error"] > 0.05 and wrong["cosine"] < 0.999
    assert result.batch.keys() == result.misconception.keys() == dict(
        model.state_dict()).keys()


def test_at_the_pooling_layer_averaging_first_is_exact_for_avg_alone(results):
    _, max_result = results["max"]
    _, avg_result = results["avg"]
    assert avg_result.numbers["at_the_pool"]["max_difference"] < 1e-17
    assert max_result.numbers["at_the_pool"]["relative_error"] > 0.05
    assert 0 < max_result.numbers["winners_differ"] < 1
    # the examples' winners are the core's, each example's own, and the mean map's too
    _, indices = pg.max_pool(max_result.pool_input, 2, return_indices=True)
    np.testing.assert_array_equal(indices, max_result.winners)
    _, indices = pg.max_pool(max_result.pool_input.mean(axis=0, keepdims=True), 2,
                             return_indices=True)
    np.testing.assert_array_equal(indices[0], max_result.mean_winners)
    assert avg_result.winners is None


def test_the_misconception_is_one_pass_of_the_mean_through_the_mean_example(results):
    """Checked by hand at the linear head: its weight gradient is the outer product of
    the mean loss gradient and the mean feature vector, where the batch's is the mean of
    the examples' outer products."""
    model, result = results["max"]
    x, labels = result.x, result.labels
    features = nn.Sequential(*model.layers[:-1]).eval().forward(x)
    logits = features @ model.layers[-1].params["W"].T + model.layers[-1].params["b"]
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    dlogits = probs.copy()
    dlogits[np.arange(len(labels)), labels] -= 1  # each example's own loss gradient
    head = f"{len(model.layers) - 1}.W"
    np.testing.assert_allclose(result.batch[head], dlogits.T @ features / len(x), rtol=1e-10)
    np.testing.assert_allclose(result.misconception[head],
                               np.outer(dlogits.mean(axis=0), features.mean(axis=0)),
                               rtol=1e-10, atol=1e-15)


def test_a_batch_of_one_example_repeated_has_nothing_to_average_away(results):
    model, _ = results["max"]
    x, labels = network.test_batch(toy_data(n_train=200, n_test=40), 1, seed=3)
    repeated = network.network_gradients(model, np.repeat(x, 4, axis=0),
                                         np.repeat(labels, 4))
    assert repeated.numbers["misconception_vs_batch"]["max_difference"] < 1e-15
    assert repeated.numbers["winners_differ"] == 0


def test_the_optimizers_step_alike_from_both_routes_and_not_from_the_misconception(results,
                                                                                     data):
    model, result = results["max"]
    warmup = network.warmup_gradients(model, data, batches=2)
    steps = network.optimizer_steps(model, {"examples": result.mean_of_examples,
                                            "batch": result.batch,
                                            "misconception": result.misconception}, warmup)
    numbers = network.step_numbers(steps)
    assert set(numbers) == {"sgd", "adagrad", "rmsprop"}
    for name, routes in steps.items():
        assert numbers[name]["examples_vs_batch"]["max_difference"] < 1e-15
        assert numbers[name]["misconception_vs_batch"]["relative_error"] > 0.05
        assert routes["batch"].shape == (sum(v.size for v in model.state_dict().values()),)
    # plain SGD's update is -lr times the gradient (up to the rounding of w - lr g - w)
    np.testing.assert_allclose(steps["sgd"]["batch"],
                               -network.STEP_LR * np.concatenate(
                                   [g.ravel() for g in result.batch.values()]), atol=1e-15)
    # warmed running averages: Adagrad's update is no longer lr times a sign
    assert np.unique(np.round(np.abs(steps["adagrad"]["batch"]), 12)).size > 10


def test_the_command_draws_and_prints_it(tmp_path, capsys):
    pytest.importorskip("sklearn")
    assert cli.main(["explain", "--network", "--epochs", "1", "--batch", "40",
                     "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for pool in ("max", "avg"):
        assert f"== {pool} pooling: conv-ReLU-{pool} pool-linear, 1 epochs on digits" in out
    assert out.count("the same gradient") == 2
    assert "at the average pooling layer alone: routing the mean gradient equals" in out
    for name in ("network_examples.png", "network_batch.png", "network_steps.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG
        assert (tmp_path / name).stat().st_size > 20_000


def test_one_dimensional_signals(tmp_path):
    pytest.importorskip("mnist1d")
    config = explain.ExplainConfig(source="mnist1d", out=str(tmp_path), network=True,
                                   epochs=1, batch=20)
    done = explain.explain_network(config)
    max_result, avg_result = done["results"]
    assert max_result.x.shape == (20, 1, 40) and max_result.winners.shape == (20, 8, 20)
    assert max_result.numbers["examples_vs_batch"]["max_difference"] < 1e-15
    assert avg_result.numbers["at_the_pool"]["max_difference"] < 1e-17
    for name in ("network_examples.png", "network_batch.png", "network_steps.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG


def test_a_checkpoint_and_its_weights_with_the_other_pooling(tmp_path):
    pytest.importorskip("sklearn")
    from poolgrad import train
    train.train(train.TrainConfig("digits", str(tmp_path / "run"), pool="avg", epochs=1,
                                  progress=False, plot=False))
    config = explain.ExplainConfig(source=f"checkpoint:{tmp_path / 'run'}",
                                   out=str(tmp_path / "figures"), network=True, batch=20)
    done = explain.explain_network(config)
    max_result, avg_result = done["results"]
    assert "with max pooling in place of avg, the same weights" in max_result.description
    assert avg_result.description.startswith(f"the network in {tmp_path / 'run'} (digits")
    for key, value in avg_result.batch.items():
        assert value.shape == max_result.batch[key].shape
    assert avg_result.numbers["at_the_pool"]["max_difference"] < 1e-17


def test_settings_it_would_ignore_are_refused_before_any_work():
    for settings, message in [
            ({"network": True, "source": 5}, "source must be a string"),
            ({"network": True, "batch": 1}, "batch must be an integer >= 2 with --network"),
            ({"network": True, "kernel": 3, "dy": "ones"},
             "--network (its own layers) takes no --kernel, --dy"),
            ({"network": True, "source": "checkpoint:run", "epochs": 5},
             "--network on a checkpoint (trained already, its own layers) takes no --epochs"),
            ({"kind": "gem", "p": 4.0}, "--kind gem (2x2 windows, stride 2) takes no --p"),
            ({"kind": "aps", "stride": 3}, "--kind aps (stride 2) takes no --stride"),
            ({"epochs": 5}, "this explanation (--epochs goes with --network) takes no --epochs"),
            ({"batch": 0}, "batch must be an integer >= 1, got 0")]:
        with pytest.raises(explain.ExplainError, match=f"^{re.escape(message)}"):
            explain.ExplainConfig(**settings)
    assert explain.ExplainConfig(network=True).batch == 100
    assert explain.ExplainConfig(kind="avg", kernel=3, p=4.0).kernel == 3  # its layer's


@pytest.mark.parametrize("args, message", [
    (["--source", "random"], "--network needs labelled examples: --source digits, mnist1d "
                             "or checkpoint:DIR, got 'random'"),
    (["--invariance"], "--network and --invariance are two explanations: give one"),
    (["--kind", "gem"], "--network explains max and average pooling side by side; leave "
                        "out --kind ('gem' given)"),
    (["--batch", "1"], "batch must be an integer >= 2 with --network (a batch to average), "
                       "got 1"),
])
def test_what_it_cannot_explain_gets_one_line(tmp_path, capsys, args, message):
    assert cli.main(["explain", "--network", *args, "--out", str(tmp_path / "f")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"poolgrad explain: error: {message}")
    assert not (tmp_path / "f").exists()
