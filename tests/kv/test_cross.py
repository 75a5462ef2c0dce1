"""Cross-attention K/V through the state API: per session and branch, all layers or nothing."""

from __future__ import annotations

import pytest
import torch
from kvdrive import CFG_BRANCHES, make_spec, plan_for

from ardiff.errors import KVStateError
from ardiff.kv.backend import create_cache
from ardiff.kv.state import open_state

L, H, HS = 2, 2, 4
TEXT, IMAGE = 5, 3  # tokens of the two declared caches


def cache_(backend):
    spec = make_spec(num_layers=L, num_kv_heads=H, head_size=HS, tokens_per_frame=3,
                     frames_per_block=1, window_frames=2, kv_branches=CFG_BRANCHES,
                     session_capacity=2, cross={"text": TEXT, "image": IMAGE})
    return create_cache(plan_for(spec, max_sessions=2), backend)


def layers(tokens=TEXT, num_layers=L, fill=None):
    make = lambda: (torch.full((tokens, H, HS), fill) if fill is not None  # noqa: E731
                    else torch.randn(tokens, H, HS))
    return [(make(), make()) for _ in range(num_layers)]


def same(got, want) -> bool:
    return len(got) == len(want) and all(torch.equal(a, c) and torch.equal(b, d)
                                         for (a, b), (c, d) in zip(got, want))


@pytest.fixture(params=["paged", "dense"])
def cache(request):
    return cache_(request.param)


def test_set_get_per_session_branch_and_name(cache):
    state = open_state(cache, "s")
    assert state.cross_kv("positive", "text") is None
    text_pos, text_neg, image = layers(), layers(), layers(IMAGE)
    state.set_cross_kv("positive", "text", text_pos)
    state.set_cross_kv("negative", "text", text_neg)
    state.set_cross_kv("positive", "image", image)
    assert same(state.cross_kv("positive", "text"), text_pos)
    assert same(state.cross_kv("negative", "text"), text_neg)
    assert same(state.cross_kv("positive", "image"), image)
    assert state.cross_kv("negative", "image") is None
    assert open_state(cache, "t").cross_kv("positive", "text") is None


def test_stored_tensors_are_owned_by_the_cache(cache):
    state = open_state(cache, "s")
    text = layers(fill=1.0)
    state.set_cross_kv("positive", "text", text)
    text[0][0].fill_(7.0)  # the pipeline reuses its buffer
    assert torch.equal(state.cross_kv("positive", "text")[0][0], torch.ones(TEXT, H, HS))


def test_nbytes_follow_the_plan(cache):
    state = open_state(cache, "s")
    for branch in ("positive", "negative"):
        state.set_cross_kv(branch, "text", layers())
        state.set_cross_kv(branch, "image", layers(IMAGE))
    assert cache.stats().cross_attention_bytes == cache.plan.cross_attention_bytes_per_session
    state.set_cross_kv("positive", "text", layers())  # replacing does not grow
    assert cache.stats().cross_attention_bytes == cache.plan.cross_attention_bytes_per_session


@pytest.mark.parametrize("bad, said", [
    (layers(num_layers=L - 1), r"set_cross_kv\('positive', 'text'\): got 1 layers; expected "
                               r"num_layers=2 \(k, v\) pairs"),
    (layers(num_layers=L + 1), r"got 3 layers; expected num_layers=2"),
    (layers()[:1] + layers(TEXT + 1)[:1], r"set_cross_kv\('positive', 'text'\) layer 1: k has "
                                          r"shape \(6, 2, 4\); expected \[num_tokens, "
                                          r"num_kv_heads, head_size\] = \(5, 2, 4\)"),
    (layers()[:1] + [(torch.randn(TEXT, H, HS), torch.randn(TEXT, H + 1, HS))],
     r"layer 1: v has shape \(5, 3, 4\); expected .* = \(5, 2, 4\)"),
    (layers()[:1] + [(torch.randn(TEXT, H, HS),)], r"layer 1: expected a \(k, v\) pair, got tuple"),
    (layers()[:1] + [(torch.randn(TEXT, H, HS), None)], r"layer 1: v is a NoneType, not a tensor"),
    ([(k.double(), v) for k, v in layers()], r"layer 0: k is torch.float64 on cpu; expected "
                                             r"torch.float32 on cpu"),
])
def test_bad_set_leaves_the_previous_cache_intact(cache, bad, said):
    state = open_state(cache, "s")
    good = layers()
    state.set_cross_kv("positive", "text", good)
    nbytes = cache.stats().cross_attention_bytes
    with pytest.raises(KVStateError, match=said):
        state.set_cross_kv("positive", "text", bad)
    assert same(state.cross_kv("positive", "text"), good)
    assert cache.stats().cross_attention_bytes == nbytes
    with pytest.raises(KVStateError):
        state.set_cross_kv("negative", "text", bad)
    assert state.cross_kv("negative", "text") is None


def test_undeclared_name(cache):
    state = open_state(cache, "s")
    said = r"cross-attention cache 'audio' is not declared by the spec \(declared: text, image\)"
    with pytest.raises(KVStateError, match=said):
        state.set_cross_kv("positive", "audio", layers())
    with pytest.raises(KVStateError, match=said):
        state.cross_kv("positive", "audio")
    state.set_cross_kv("positive", "text", layers())
    with pytest.raises(KVStateError, match=said):
        state.clear_cross_kv("positive", ["text", "audio"])
    assert state.cross_kv("positive", "text") is not None, "a failed clear drops nothing"


def test_clear_drops_cross_kv_but_keeps_history(cache):
    state = open_state(cache, "s")
    with state.block("positive", commit=True) as blk:
        for layer in range(L):
            x = torch.randn(3, H, HS)
            blk.attend(layer, x, x, x)
    for branch in ("positive", "negative"):
        state.set_cross_kv(branch, "text", layers())
        state.set_cross_kv(branch, "image", layers(IMAGE))
    state.clear_cross_kv("positive", ["text"])
    assert state.cross_kv("positive", "text") is None
    assert state.cross_kv("positive", "image") is not None
    state.clear_cross_kv("negative")
    assert state.cross_kv("negative", "text") is None and state.cross_kv("negative", "image") is None
    assert state.cross_kv("positive", "image") is not None
    assert state.num_committed_frames("positive") == 1


def test_release_frees_only_that_session(cache):
    a, b = open_state(cache, "a"), open_state(cache, "b")
    a.set_cross_kv("positive", "text", layers())
    kept = layers()
    b.set_cross_kv("positive", "text", kept)
    cache.release_session("a")
    assert cache.cross.num_entries("a") == 0
    assert same(b.cross_kv("positive", "text"), kept)
    assert open_state(cache, "a").cross_kv("positive", "text") is None
