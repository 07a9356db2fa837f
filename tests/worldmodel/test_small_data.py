"""M on few episodes: at least four updates an epoch, and its applicability head started at each
rule's frequency in the data. With 11 SqueezeNet episodes in one minibatch of 16 (40 updates in
40 epochs) and every rule started at "not applicable", M predicted no rule applicable after the
first step of any episode, so every dream ended there."""

from __future__ import annotations

import numpy as np
import torch
import yaml

from rlflow.cli import main
from rlflow.worldmodel.data import RolloutData
from rlflow.worldmodel.mdnrnn import MDNRNN
from rlflow.worldmodel.model import member_checkpoint
from rlflow.worldmodel.train import (
    MASK_PRIOR_FLOOR,
    MIN_RNN_BATCHES,
    WorldModelSettings,
    mask_prior_logits,
    rnn_batch_size,
)


def test_small_data_is_split_into_at_least_four_minibatches():
    settings = WorldModelSettings(rnn_batch=16)
    assert rnn_batch_size(settings, 11) == 3  # 4 minibatches, not 1
    assert rnn_batch_size(settings, 2) == 1
    assert rnn_batch_size(settings, 64) == 16  # enough data: as before
    assert rnn_batch_size(settings, 57) == 16  # already 4 minibatches of 16
    assert rnn_batch_size(settings, 200) == 16


def test_train_wm_takes_four_updates_an_epoch_on_few_episodes(pipeline, tmp_path):
    """The pipeline's data (32 training episodes) with minibatches of 16 would be 2 updates an
    epoch; Adam's step count in the checkpoint says how many M took."""
    config = yaml.safe_load(pipeline.config.read_text())
    config["train_wm"].update({"vae_epochs": 1, "rnn_epochs": 3, "rnn_batch": 16})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "wm"
    argv = ["train-wm", "--data", str(pipeline.data), "--out", str(out), "--config", str(path)]
    assert main([*argv, "--quiet"]) == 0
    checkpoint = torch.load(out / member_checkpoint(0), weights_only=False)
    steps = {int(state["step"]) for state in checkpoint["optimizer"]["state"].values()}
    assert steps == {3 * MIN_RNN_BATCHES}


def test_the_applicability_prior_is_each_rules_frequency_in_the_data(pipeline):
    data = RolloutData.load(pipeline.data)
    episodes = np.arange(len(data.arrays["episode_steps"]))
    prior = mask_prior_logits(data, episodes)
    assert prior.shape == (data.num_rules,)
    frequency = data.arrays["next_rule_applicable"].mean(axis=0)
    expected = np.clip(frequency, MASK_PRIOR_FLOOR, 1 - MASK_PRIOR_FLOOR)
    np.testing.assert_allclose(1 / (1 + np.exp(-prior)), expected, rtol=1e-6)
    assert (frequency > 0.5).any(), "some rule applicable at most steps of the pipeline's data"
    assert (prior[frequency > 0.5] > 0).all() and (prior[frequency == 0] < -6).all()


def test_with_no_evidence_m_predicts_the_prior():
    rnn = MDNRNN(latent=4, num_rules=5, hidden=8, mixtures=2, action_embedding=4)
    prior = torch.tensor([2.0, -1.0, 0.0, -6.9, 3.0])
    rnn.set_mask_prior(prior)
    output = rnn.head_output(torch.zeros(1, 8))
    torch.testing.assert_close(output.mask_logits[0], prior)


def test_train_wm_reports_how_far_its_dreams_go(pipeline):
    """The pipeline's M lets a dream go past its first step, as SqueezeNet's did not."""
    dreams = pipeline.train_wm["dream_steps"]
    assert 1 < dreams["mean"] <= dreams["longest_episode"]
