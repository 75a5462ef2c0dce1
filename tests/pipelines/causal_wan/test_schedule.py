"""The presets' timesteps and sigmas, against the numbers computed here by hand."""

from __future__ import annotations

import pytest
import torch

from ardiff.errors import ConfigError
from ardiff.pipelines.causal_wan.presets import PRESETS, get_preset
from ardiff.pipelines.causal_wan.schedule import FlowTable, clean_from_flow, renoise


def hand_table(shift: float) -> list[float]:
    """sigma_i = shift s / (1 + (shift - 1) s), s = 1 - i / 1000, i < 1000 (float64)."""
    return [shift * s / (1 + (shift - 1) * s) for s in (1 - i / 1000 for i in range(1000))]


def test_self_forcing_warps_1000_750_500_250_at_shift_5():
    timesteps = PRESETS["self-forcing"].timesteps()
    assert timesteps == pytest.approx([1000.0, 937.5, 833.3333, 625.0], abs=1e-3)
    table = PRESETS["self-forcing"].table
    assert [table.sigma(t) for t in timesteps] == pytest.approx([1.0, 0.9375, 0.833333, 0.625],
                                                                abs=1e-6)


def test_causvid_steps_are_unwarped_with_the_nearest_sigma_at_shift_8():
    preset = PRESETS["causvid"]
    assert preset.timesteps() == [1000.0, 757.0, 522.0]
    sigmas = hand_table(8.0)
    for t in preset.timesteps():
        nearest = min(sigmas, key=lambda sigma: abs(1000 * sigma - t))
        assert preset.table.sigma(t) == pytest.approx(nearest, abs=1e-6)
    assert preset.table.sigma(757.0) != pytest.approx(0.757, abs=1e-5)  # a table entry, not t/1000


def test_the_table_is_self_forcing_s_float32_table():
    table = FlowTable(5.0)
    assert table.sigmas.shape == (1000,)
    assert table.sigmas.tolist() == pytest.approx(hand_table(5.0), abs=1e-6)
    assert table.sigma(0.0) == 0.0 and table.warp(0) == 0.0


def test_longlive_maps_local_attn_12_sink_3_to_window_9_sink_3():
    preset = PRESETS["longlive"]
    assert (preset.window_frames, preset.sink_frames) == (9, 3)
    assert preset.timesteps() == PRESETS["self-forcing"].timesteps()


def test_a_step_is_x0_from_the_flow_then_renoised():
    x, flow, noise = torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([-1.0])
    clean = clean_from_flow(x, flow, 0.8)
    assert clean.tolist() == pytest.approx([0.6])
    assert renoise(clean, noise, 0.25).tolist() == pytest.approx([0.75 * 0.6 - 0.25])


def test_an_unknown_preset_names_the_known_ones():
    with pytest.raises(ConfigError, match=r"^pipeline.args.preset: 'sf' is not a causal-Wan "
                                          r"preset; use one of self-forcing, causvid, longlive$"):
        get_preset("sf")


def test_causvid_warped_4_step_at_shift_8_is_its_scheduler_s_numbers():
    """CausVid's wan_causal_dmd_warp_4step_cfg2.yaml: steps 1000 750 500 250, warp, shift 8.
    The numbers are what CausVid's FlowMatchScheduler(shift=8, sigma_min=0, extra_one_step)
    gives for `cat(timesteps, [0])[1000 - step]` (and s / (1 + 7 s) at s = 1, .75, .5, .25)."""
    preset = get_preset("causvid").adjusted(warp=True)
    assert (preset.shift, preset.warp) == (8.0, True)
    timesteps = preset.timesteps((1000, 750, 500, 250))
    assert timesteps == pytest.approx([1000.0, 960.0, 888.8889, 727.2728], abs=1e-3)
    assert [preset.table.sigma(t) for t in timesteps] == pytest.approx(
        [1.0, 0.96, 0.888889, 0.727273], abs=1e-6)


def test_shift_and_warp_replace_the_preset_s():
    base = get_preset("self-forcing")
    assert base.adjusted() == base
    unwarped = base.adjusted(warp=False)
    assert unwarped.timesteps() == [1000.0, 750.0, 500.0, 250.0]
    assert base.adjusted(shift=8.0).timesteps() == pytest.approx(
        [1000.0, 960.0, 888.8889, 727.2728], abs=1e-3)
    assert base.adjusted(shift=8.0).name == "self-forcing"


@pytest.mark.parametrize("changes, message", [
    (dict(shift=0), r"^pipeline.args.shift: 0 must be a finite number > 0, e.g. 5 "
                    r"\(Self-Forcing, LongLive\) or 8 \(CausVid\)$"),
    (dict(shift=float("nan")), r"^pipeline.args.shift: nan must be a finite number > 0"),
    (dict(shift="8"), r"^pipeline.args.shift: '8' must be a finite number > 0"),
    (dict(warp="yes"), r"^pipeline.args.warp: 'yes' must be true or false$"),
])
def test_a_bad_shift_or_warp_is_a_one_line_error(changes, message):
    with pytest.raises(ConfigError, match=message):
        get_preset("causvid").adjusted(**changes)
