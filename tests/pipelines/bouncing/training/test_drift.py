"""Stage 2's clips (`training/drift.py`): what each remedy changes in the history the model
sees, and that the targets stay the simulator's frames."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ardiff
from ardiff.pipelines.bouncing.checkpoint import load_weights
from ardiff.pipelines.bouncing.config import BouncingConfig
from ardiff.pipelines.bouncing.model import BouncingDiT
from ardiff.pipelines.bouncing.training import drift, rollout
from ardiff.pipelines.bouncing.training.losses import NOISY


def clip(recipe: drift.DriftRecipe, seed: int = 0, batch: int = 8) -> drift.Clip:
    return drift.make_clip(np.random.default_rng(seed), batch, 10, recipe)


def test_without_remedies_the_history_is_the_true_clip():
    plain = clip(drift.DriftRecipe())
    assert torch.equal(plain.history, plain.true)
    assert plain.positions.tolist() == list(range(10)) and plain.actions.shape == (8, 10)


def test_a_sink_is_the_worlds_first_frame_before_a_later_clip():
    rng = np.random.default_rng(3)
    gaps = set()
    for _ in range(8):
        sunk = drift.make_clip(rng, 4, 10, drift.DriftRecipe(sink=True))
        assert sunk.history.shape[1] == 11 and torch.equal(sunk.history[:, 1:], sunk.true)
        assert sunk.positions[0] == 0 and sunk.positions[1] >= 1
        assert sunk.positions[1:].tolist() == list(range(int(sunk.positions[1]),
                                                         int(sunk.positions[1]) + 10))
        assert (sunk.actions[:, 0] == 0).all()           # the sink frame: no action
        gaps.add(int(sunk.positions[1]))
    assert len(gaps) > 1 and max(gaps) < drift.MAX_GAP + 1


def test_jitter_redraws_some_history_frames_and_keeps_the_targets_true():
    plain, jittered = clip(drift.DriftRecipe()), clip(drift.DriftRecipe(jitter=0.5))
    assert torch.equal(jittered.true, plain.true)      # the same worlds and actions
    changed = (jittered.history != jittered.true).flatten(2).any(-1)   # [B, L]
    assert 0.25 < changed.float().mean() < 0.75
    all_of_them = clip(drift.DriftRecipe(jitter=1.0))
    assert (all_of_them.history != all_of_them.true).flatten(2).any(-1).all()


def test_own_history_replaces_frames_after_the_first_window_only():
    torch.manual_seed(0)
    model = BouncingDiT(BouncingConfig()).train()
    plain = clip(drift.DriftRecipe())
    own = drift.own_history(model, plain, 1.0, torch.Generator().manual_seed(0))
    window = model.c.window_frames - 1
    assert torch.equal(own.history[:, :window], plain.history[:, :window])
    assert (own.history[:, window:] != plain.history[:, window:]).flatten(2).any(-1).all()
    assert torch.equal(own.true, plain.true) and model.training   # left as it was


def test_the_loss_is_finite_with_every_remedy():
    torch.manual_seed(0)
    model = BouncingDiT(BouncingConfig(sink_frames=1))
    loss = drift.drift_loss(model, drift.DriftRecipe(sink=True, jitter=0.5, own=0.5),
                            np.random.default_rng(0), torch.Generator().manual_seed(0), 4)
    assert torch.isfinite(loss) and loss > 0


def test_noised_history_gives_the_model_its_level_which_starts_as_no_change():
    model = load_weights(BouncingConfig())   # trained: its modulations are not zero
    grown = drift.with_context_level(model)
    assert grown.context_level is not None and drift.with_context_level(grown) is grown
    t, level = torch.rand(2, 3), torch.rand(2, 3)
    before, after = model.conditioning(t), grown.conditioning(t, level)
    assert before.final.shift.abs().sum() > 0
    torch.testing.assert_close(after.final.shift, before.final.shift)   # zero-initialised
    recipe = drift.DriftRecipe(context_noise=0.5)
    loss = drift.drift_loss(grown, recipe, np.random.default_rng(0),
                            torch.Generator().manual_seed(0), 4)
    loss.backward()
    assert torch.isfinite(loss) and grown.context_level[2].weight.grad.abs().sum() > 0
    plain = drift.drift_loss(grown, drift.DriftRecipe(), np.random.default_rng(0),
                             torch.Generator().manual_seed(0), 4)
    assert not torch.equal(loss, plain)   # the history was noised


def test_an_own_rollout_replaces_the_history_after_the_first_window_in_some_clips():
    model = load_weights(BouncingConfig())
    rng = np.random.default_rng(0)
    length = rollout.rollout_length(5, 6, rng)
    assert 4 + 4 + NOISY <= length <= 4 + 6 + NOISY
    plain = drift.make_clip(rng, 8, length, drift.DriftRecipe())
    own = rollout.own_rollout(model, plain, torch.Generator().manual_seed(0))
    assert torch.equal(own.true, plain.true) and torch.equal(own.history[:, :4], plain.true[:, :4])
    changed = (own.history != plain.history).flatten(1).any(1)
    assert 0 < changed.sum() < 8                       # some clips, not all
    assert torch.equal(own.history[:, -1], plain.true[:, -1])   # seen by no noisy copy
    error = (own.history[changed, 4:-1] - plain.true[changed, 4:-1]).abs().mean()
    assert 0 < error < 0.2                             # the model's frames, close to the truth
    loss = drift.drift_loss(model, drift.DriftRecipe(rollout=5), rng,
                            torch.Generator().manual_seed(0), 4)
    loss.backward()
    assert torch.isfinite(loss)


def test_an_own_rollout_is_trained_without_a_sink():
    with pytest.raises(ardiff.ConfigError, match="--rollout: an own-rollout history is trained "
                                                 "without a sink; drop --sink or --rollout"):
        drift.DriftRecipe(sink=True, rollout=8)
