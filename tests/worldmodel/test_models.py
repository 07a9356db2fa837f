"""V and M: shapes, losses, the temperature, and that training M beats an untrained M on
held-out rollouts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from rlflow.nn import collate_graphs
from rlflow.worldmodel.data import RolloutData
from rlflow.worldmodel.mdnrnn import MDNRNN, MDNOutput, mdn_nll, sample_latent
from rlflow.worldmodel.model import WorldModel, load_npz
from rlflow.worldmodel.train import evaluate_rnn, rnn_kwargs
from rlflow.worldmodel.vae import GraphVAE, vae_losses


def test_trained_mdnrnn_beats_untrained_on_held_out_rollouts(pipeline):
    config = yaml.safe_load((pipeline.wm / "config.yaml").read_text())
    data = RolloutData.load(pipeline.data)
    _, held_out = data.episodes_split(config["holdout"], config["seed"])
    assert len(held_out) >= 2
    mu = load_npz(pipeline.wm / "latents.npz", "latents")["mu"]
    trained = WorldModel.load(pipeline.wm).rnn
    torch.manual_seed(0)
    untrained = MDNRNN(**rnn_kwargs(data, _settings(config)))
    trained_nll = evaluate_rnn(trained, data, held_out, mu)["mdn_nll"]
    untrained_nll = evaluate_rnn(untrained, data, held_out, mu)["mdn_nll"]
    assert trained_nll < untrained_nll
    # and the other heads learnt too: cost, done and the next action mask
    trained_all = evaluate_rnn(trained, data, held_out, mu)
    untrained_all = evaluate_rnn(untrained, data, held_out, mu)
    for key in ("cost_mse", "done_bce", "mask_bce"):
        assert trained_all[key] < untrained_all[key], key


def _settings(config):
    from rlflow.worldmodel.train import WorldModelSettings

    fields = WorldModelSettings.__dataclass_fields__
    return WorldModelSettings(**{k: v for k, v in config.items() if k in fields})


def test_vae_shapes_and_deterministic_encoding(pipeline):
    data = RolloutData.load(pipeline.data)
    world = WorldModel.load(pipeline.wm)
    batch = collate_graphs([data.graph(i) for i in range(5)])
    out = world.vae(batch, sample=False)
    assert out.mu.shape == out.logsigma.shape == out.z.shape == (5, world.latent)
    assert out.summary.shape == (5, data.summaries().shape[1])
    assert out.applicability_logits.shape == (5, data.num_rules)
    torch.testing.assert_close(out.z, out.mu)
    again, _ = world.vae.encode(batch)
    torch.testing.assert_close(again, out.mu)


def test_vae_losses_free_bits():
    vae = GraphVAE(
        num_rules=3,
        summary_dim=2,
        node_dim=4,
        edge_dim=2,
        global_dim=1,
        latent=4,
        hidden=8,
        layers=1,
        heads=2,
        decoder_hidden=8,
    )
    mu = torch.zeros(2, 4)
    logsigma = torch.zeros(2, 4)
    summary, logits = vae.decode(mu)
    from rlflow.worldmodel.vae import VAEOutput

    out = VAEOutput(mu, logsigma, mu, summary, logits)
    losses = vae_losses(out, torch.zeros(2, 2), torch.zeros(2, 3), beta=1.0, kl_tolerance=0.5)
    assert float(losses["kl"]) == 0.0  # q equal to the prior
    assert losses["loss"].item() == pytest.approx(losses["recon"].item() + 0.5 * 4)  # free nats


def test_mdn_nll_of_one_gaussian_matches_torch():
    output = MDNOutput(
        log_pi=torch.zeros(1, 1, 3),
        mu=torch.tensor([[[0.5, -1.0, 2.0]]]),
        logsigma=torch.tensor([[[0.0, 0.3, -0.2]]]),
        cost=torch.ones(1),
        done_logit=torch.zeros(1),
        mask_logits=torch.zeros(1, 2),
    )
    target = torch.tensor([[0.1, 0.2, 0.3]])
    normal = torch.distributions.Normal(output.mu[:, 0], output.logsigma[:, 0].exp())
    expected = -normal.log_prob(target).sum(dim=-1)
    torch.testing.assert_close(mdn_nll(output, target), expected)


def test_temperature_sharpens_the_mixture():
    """tau -> 0: the most likely component's mean; tau = 1: the mixture's own spread."""
    k, z = 2, 3
    output = MDNOutput(
        log_pi=torch.log(torch.tensor([[0.8, 0.2]])).unsqueeze(-1).expand(1, k, z).clone(),
        mu=torch.tensor([[[1.0] * z, [-5.0] * z]]),
        logsigma=torch.full((1, k, z), -1.0),
        cost=torch.ones(1),
        done_logit=torch.zeros(1),
        mask_logits=torch.zeros(1, 1),
    )
    rng = np.random.default_rng(0)
    cold = torch.stack(
        [
            sample_latent(output, 1e-4, rng.random((1, z)), rng.standard_normal((1, z)))
            for _ in range(200)
        ]
    )
    torch.testing.assert_close(cold, torch.ones_like(cold), atol=0.05, rtol=0)
    warm = torch.stack(
        [
            sample_latent(output, 1.0, rng.random((1, z)), rng.standard_normal((1, z)))
            for _ in range(400)
        ]
    )
    share_low = float((warm < -2).float().mean())
    assert 0.1 < share_low < 0.3  # the 0.2 component is drawn about a fifth of the time


def test_mdnrnn_state_carries_over_steps():
    torch.manual_seed(0)
    rnn = MDNRNN(latent=4, num_rules=3, hidden=8, mixtures=2, action_embedding=4)
    z = torch.randn(2, 5, 4)
    actions = torch.tensor([[0, 1, 2, 3, -1], [1, 1, 1, 1, 1]])
    whole, _ = rnn(z, actions)
    state = None
    for t in range(5):
        step, state = rnn(z[:, t : t + 1], actions[:, t : t + 1], state)
        torch.testing.assert_close(step.mu[:, 0], whole.mu[:, t])
    assert whole.log_pi.shape == (2, 5, 2, 4)
    torch.testing.assert_close(whole.log_pi.exp().sum(dim=-2), torch.ones(2, 5, 4))


def test_step_cost_head_adds_the_predicted_change_to_the_current_cost():
    """The step head's output is the change 100 (c_t - c_{t+1}); the level head's, with the
    same weights, is 100 (1 - c_{t+1}): the same raw number read against c_t or against 1."""
    torch.manual_seed(0)
    level = MDNRNN(latent=4, num_rules=3, hidden=8, mixtures=2, action_embedding=4)
    step = MDNRNN(latent=4, num_rules=3, hidden=8, mixtures=2, action_embedding=4, cost_head="step")
    step.load_state_dict(level.state_dict())
    z, actions = torch.randn(2, 5, 4), torch.tensor([[0, 1, 2, 3, -1], [1, 1, 1, 1, 1]])
    cost = 0.5 + torch.rand(2, 5)
    by_level, _ = level(z, actions)
    by_step, _ = step(z, actions, cost=cost)
    torch.testing.assert_close(by_step.cost, cost - (1.0 - by_level.cost))
    torch.testing.assert_close(by_step.mu, by_level.mu)
    without_cost, _ = step(z, actions)
    assert torch.isnan(without_cost.cost).all()  # never a silent "relative to 1"
    with pytest.raises(ValueError, match="cost_head"):
        MDNRNN(latent=4, num_rules=3, cost_head="reward")
