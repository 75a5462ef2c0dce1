"""The simulator's start worlds: a seed's sprite starts clear of every ball (`clear_start`),
so the model is never handed a sprite drawn on a ball (it merges the two at once)."""

from __future__ import annotations

import numpy as np

from ardiff.config.run import load_config
from ardiff.pipelines.bouncing import sim

OLD_DEFAULT_SEED = 28   # configs/default.yaml's world until its sprite started on the ball


def gap(world: sim.SimState) -> float:
    """Least px between the sprite, standing still, and a ball over the start frames."""
    return float(sim.sprite_gaps(world, world.sprite, sim.START_CLEAR_FRAMES)[0, 0])


def sampled(seed: int) -> sim.SimState:
    """The world before clear_start: as SimState.sample draws it for the seed."""
    return sim.SimState.sample(np.random.default_rng([seed, 0x5EED]), 1)


def test_the_default_world_no_longer_starts_with_the_sprite_on_the_ball():
    assert gap(sampled(OLD_DEFAULT_SEED)) < 0                     # drawn overlapping
    assert gap(sim.SimState.from_seed(OLD_DEFAULT_SEED)) >= sim.START_GAP_PX
    default = sim.SimState.from_seed(load_config(None).rollout.seed)  # `ardiff play`'s world
    assert gap(default) >= sim.START_GAP_PX and default.alive.sum() == 1


def test_every_start_is_clear_and_a_clear_one_is_left_as_it_was():
    kept = 0
    for seed in range(64):
        world, drawn = sim.SimState.from_seed(seed), sampled(seed)
        for name in ("pos", "vel", "radius", "colour", "alive"):  # only the sprite moves
            assert np.array_equal(getattr(world, name), getattr(drawn, name))
        best = sim.sprite_gaps(drawn, sim.SPRITE_CORNERS, sim.START_CLEAR_FRAMES).max()
        assert gap(world) >= min(sim.START_GAP_PX, best)
        if gap(drawn) >= sim.START_GAP_PX:
            assert np.array_equal(world.sprite, drawn.sprite)
            kept += 1
    assert kept > 0


def test_sprite_gaps_by_hand():
    world = sim.SimState(pos=np.array([[[10.0, 10.0], [0, 0], [0, 0]]]),
                         vel=np.zeros((1, 3, 2)), radius=np.array([[3.0, 3, 3]]),
                         colour=sim.PALETTE[None, :3], alive=np.array([[True, False, False]]),
                         sprite=np.array([[1, 1]]))
    corners = np.array([[17, 8], [8, 8], [17, 17]])   # 4 px right of the ball's edge, on it,
    gaps = sim.sprite_gaps(world, corners, 2)[0]      # and (7, 7) px from its centre
    np.testing.assert_allclose(gaps, [4.0, -3.0, np.hypot(7, 7) - 3], rtol=1e-6)


def test_a_frame_without_the_sprite_is_the_balls_alone():
    world = sim.SimState.sample(np.random.default_rng(4), 3)
    away = sim.render(sim.SimState(world.pos, world.vel, world.radius, world.colour, world.alive,
                                   np.full_like(world.sprite, -sim.SIZE)))
    alone = sim.render(world, sprite=False)
    assert alone.dtype == np.float32 and np.array_equal(alone, away)
    assert not np.array_equal(alone, sim.render(world))
