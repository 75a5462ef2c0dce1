"""Matrix-Game 2.0's released streaming loop and ardiff's matrix-game on one tiny random model
in the released file layout, from the same image with the same actions and noise: per mode
(universal, gta_drive, templerun) at the released 352 x 640 (880 tokens a frame), 4 blocks
(window eviction from block 2, 1 for gta_drive), actions changing every block.

    latents per block     within 1e-4 relative of `CausalInferenceStreamingPipeline`'s
    frames                within 8/255 of its VAEDecoderWrapper's in float32 (the tiny random
                          VAE amplifies rounding: measured 5), within 1/255 for the same
                          latents decoded in float64 (the decode's logic, not its rounding)
    CLIP image tokens     equal (1e-5) to its CLIPModel.encode_video's
    image latents         equal (1e-5) to its WanVAE.encode's (tiled, as the scripts call it)

The released code is never copied here: it is imported from a checkout of
SkyworkAI/Matrix-Game (commit 3ceb311) named by ARDIFF_MATRIX_GAME_SRC (its `Matrix-Game-2/`
folder), and the test skips without one (docs/matrix-game.md says how). Shims, test-only:
`flash_attn` (absent on CPU) is float32 SDPA, and so are the released `attention` /
`flash_attention` (they cast to bfloat16 without flash-attn); `torch.cuda.current_device`
answers "cpu" while the action module builds its rotary table; the console / video helpers
(`get_current_action`, `input`, `process_video`) are replaced by the test's actions and a
frame catcher; `wan/__init__.py` and the tokenizer module are not imported (text and the
14B image-to-video code are not used); torchvision's `Normalize` (the CLIP transform) is
torch arithmetic; `Tensor.half` is the identity while the loop runs (its one use casts the
latents for the float16 decoder; ardiff's `vae_dtype` is float32 here: on the tiny random
VAE float16 latents alone move frames by up to 76 levels); the released sizes hard-coded for the 1.3B model (30 layers, KV cache
tensors of 12 x 128 and 16 x 64, `MLPProj(1280, ...)`, the VAE's width 96) are the tiny
model's. The image goes through the released `_resizecrop` + `frame_process` steps.
"""

from __future__ import annotations

import builtins
import functools
import importlib
import os
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from tests.support.matrix_game import CHECKPOINTS, make_pipeline, make_runner

pytestmark = [pytest.mark.heavy, pytest.mark.extra("wan")]

SRC_ENV = "ARDIFF_MATRIX_GAME_SRC"
TOLERANCE, FRAME_TOLERANCE, FLOAT32_FRAME_TOLERANCE = 1e-4, 1, 8
HEIGHT, WIDTH, BLOCKS, SEED = 352, 640, 4, 3
ACTIONS = {"universal": ["w", "w+l", "a+i", "d+k+j"], "gta_drive": ["w", "w+a", "s+d", "idle"],
           "templerun": ["nomove", "w", "z", "d"]}
PACKAGES = ("pipeline", "utils", "wan", "demo_utils", "flash_attn")
STEPS = {"universal": [1000, 666, 333], "gta_drive": [1000, 666, 333],
         "templerun": [1000, 750, 500, 250]}


def source() -> Path:
    src = os.environ.get(SRC_ENV)
    if not src:
        pytest.skip(f"set {SRC_ENV} to the Matrix-Game-2/ folder of SkyworkAI/Matrix-Game")
    path = Path(src)
    if not (path / "pipeline" / "causal_inference.py").is_file():
        pytest.skip(f"{SRC_ENV}={src} holds no pipeline/causal_inference.py")
    return path


def sdpa(q, k, v, causal=False, **_):
    """[B, L, H, D] attention in float32 (flash-attn's layout)."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2).float(), k.transpose(1, 2).float(),
                                         v.transpose(1, 2).float(), is_causal=causal)
    return out.transpose(1, 2).type_as(q)


def _package(name: str, path: Path) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [str(path)]  # its __init__ is not run
    return module


@pytest.fixture
def released(monkeypatch):
    """The released modules, imported from the checkout (and forgotten afterwards)."""
    src = source()
    pytest.importorskip("einops")
    monkeypatch.syspath_prepend(str(src))
    before = set(sys.modules)
    flash = types.ModuleType("flash_attn")
    flash.flash_attn_func = sdpa
    stubs = {"flash_attn": flash, "wan": _package("wan", src / "wan"),
             "wan.modules": _package("wan.modules", src / "wan" / "modules"),
             "wan.vae": _package("wan.vae", src / "wan" / "vae"),
             "wan.vae.wanx_vae_src": _package("wan.vae.wanx_vae_src",
                                              src / "wan" / "vae" / "wanx_vae_src"),
             "wan.modules.tokenizers": types.ModuleType("wan.modules.tokenizers"),
             "wan.vae.wanx_vae_src.tokenizers": types.ModuleType("tokenizers"),
             "utils.visualize": types.ModuleType("utils.visualize")}
    stubs["wan.modules.tokenizers"].HuggingfaceTokenizer = None
    stubs["wan.vae.wanx_vae_src.tokenizers"].HuggingfaceTokenizer = None
    stubs["utils.visualize"].process_video = None
    if importlib.util.find_spec("torchvision") is None:
        vision = types.ModuleType("torchvision")
        vision.transforms = types.ModuleType("torchvision.transforms")
        stubs.update({"torchvision": vision, "torchvision.transforms": vision.transforms})
    for name, module in stubs.items():
        monkeypatch.setitem(sys.modules, name, module)
    try:
        modules = {name: importlib.import_module(name) for name in (
            "pipeline.causal_inference", "wan.modules.causal_model", "wan.modules.model",
            "utils.wan_wrapper", "demo_utils.vae_block3", "wan.vae.wanx_vae_src.vae",
            "wan.vae.wanx_vae_src.clip")}
    except ImportError as exc:
        pytest.skip(f"the released code needs {exc.name}")
    monkeypatch.setattr(modules["wan.modules.causal_model"], "attention",
                        lambda q, k, v, **_: sdpa(q, k, v))
    monkeypatch.setattr(modules["wan.modules.model"], "flash_attention",
                        lambda q, k, v, k_lens=None, **_: sdpa(q, k, v))
    monkeypatch.setattr(modules["wan.vae.wanx_vae_src.clip"], "flash_attention",
                        lambda q, k, v, **kw: sdpa(q, k, v))
    yield modules
    for name in set(sys.modules) - before:
        if name.split(".")[0] in PACKAGES:
            del sys.modules[name]


def frame_process(image) -> torch.Tensor:
    """The scripts' `_resizecrop` then `v2.Compose([Resize, ToTensor, Normalize])`, with
    torchvision's PIL path written out (Resize of a PIL image is Pillow's bilinear)."""
    import numpy as np
    from PIL import Image

    w, h = image.size
    if h / w > HEIGHT / WIDTH:
        new_w, new_h = int(w), int(int(w) * HEIGHT / WIDTH)
    else:
        new_h, new_w = int(h), int(int(h) * WIDTH / HEIGHT)
    box = ((w - new_w) / 2, (h - new_h) / 2, (w + new_w) / 2, (h + new_h) / 2)
    image = image.crop(box).resize((WIDTH, HEIGHT), Image.BILINEAR)
    pixels = torch.from_numpy(np.array(image, copy=True)).permute(2, 0, 1).float() / 255
    return ((pixels - 0.5) / 0.5)[None, :, None]


def released_vae(modules, mg_dir: Path):
    vae_module = modules["wan.vae.wanx_vae_src.vae"]
    tiny = functools.partial(vae_module.VideoVAE_, dim=2)  # the released width: 96
    original = vae_module.VideoVAE_
    vae_module.VideoVAE_ = tiny
    try:
        return vae_module.WanVAE(pretrained_path=str(mg_dir / "Wan2.1_VAE.pth")).to(torch.float32)
    finally:
        vae_module.VideoVAE_ = original


def released_clip_tokens(modules, mg_dir: Path, pixels: torch.Tensor) -> torch.Tensor:
    """CLIPModel.encode_video on the tiny vision tower (its ViT-H sizes made tiny)."""
    from ardiff.pipelines.matrix_game.clip import CLIP_MEAN, CLIP_STD
    from ardiff.pipelines.matrix_game.make_tiny import TINY_CLIP

    clip = modules["wan.vae.wanx_vae_src.clip"]
    state = torch.load(mg_dir / "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth")
    visual = clip.VisionTransformer(image_size=224, patch_size=TINY_CLIP["patch"],
                                    dim=TINY_CLIP["dim"], mlp_ratio=4, out_dim=16, num_heads=16,
                                    num_layers=TINY_CLIP["layers"], pool_type="token",
                                    activation="gelu")
    visual.load_state_dict({k[len("visual."):]: v for k, v in state.items()})
    mean = torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CLIP_STD).view(1, 3, 1, 1)
    normalize = lambda x: x.sub_(mean).div_(std)  # noqa: E731 - torchvision's Normalize
    fake = SimpleNamespace(model=SimpleNamespace(image_size=224, visual=visual),
                           transforms=SimpleNamespace(transforms=[normalize]),
                           dtype=torch.float32, device=torch.device("cpu"))
    with torch.no_grad():
        return clip.CLIPModel.encode_video(fake, pixels.clone())


def run_released(modules, mg_dir: Path, mode: str, pipeline, image, monkeypatch):
    """The released streaming loop (inference_streaming.py's steps) on the tiny files."""
    from safetensors.torch import load_file

    from ardiff.pipelines.matrix_game.actions import SPACES

    causal, wrapper = modules["pipeline.causal_inference"], modules["utils.wan_wrapper"]
    folder = (mg_dir / CHECKPOINTS[mode]).parent
    clip_dim = pipeline.clip.pos_embedding.shape[-1]
    mlp = modules["wan.modules.model"].MLPProj
    monkeypatch.setattr(modules["wan.modules.causal_model"], "MLPProj",
                        lambda in_dim, out_dim: mlp(clip_dim, out_dim))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    generator = wrapper.WanDiffusionWrapper(model_config=str(folder), timestep_shift=5.0)
    decoder = modules["demo_utils.vae_block3"].VAEDecoderWrapper()
    decoder.decoder = modules["demo_utils.vae_block3"].VAEDecoder3d(dim=2)
    vae_state = torch.load(mg_dir / "Wan2.1_VAE.pth")
    decoder.load_state_dict({k: v for k, v in vae_state.items()
                             if "decoder." in k or "conv2" in k})
    args = SimpleNamespace(denoising_step_list=STEPS[mode], warp_denoising_step=True,
                           num_frame_per_block=3, context_noise=0)
    loop = causal.CausalInferenceStreamingPipeline(args, generator=generator,
                                                   vae_decoder=decoder.eval())
    loop.generator.load_state_dict(load_file(str(mg_dir / CHECKPOINTS[mode])))
    config = generator.model.config
    loop.num_transformer_blocks = config.num_layers
    shim_caches(loop, config)
    pixels = frame_process(image)
    vae = released_vae(modules, mg_dir)
    frames = BLOCKS * 3
    video = torch.cat([pixels, torch.zeros_like(pixels).repeat(1, 1, 4 * (frames - 1), 1, 1)],
                      dim=2)
    with torch.no_grad():
        img_cond = vae.encode(video, device="cpu", tiled=True, tile_size=[44, 80],
                              tile_stride=[23, 38])
    mask = torch.ones_like(img_cond)
    mask[:, :, 1:] = 0
    tokens = released_clip_tokens(modules, mg_dir, pixels)
    space = SPACES[mode]
    video_frames = 1 + 4 * (frames - 1)
    conditional = {"cond_concat": torch.cat([mask[:, :4], img_cond], dim=1),
                   "visual_context": tokens,
                   "keyboard_cond": torch.zeros(1, video_frames, len(space.keyboard))}
    if space.has_mouse:
        conditional["mouse_cond"] = torch.zeros(1, video_frames, 2)
    actions = iter(ACTIONS[mode])

    def current_action(mode):
        keyboard, mouse = space.vectors(next(actions))
        return {"keyboard": torch.tensor(keyboard), "mouse": torch.tensor(mouse)}

    caught = {}
    monkeypatch.setattr(causal, "get_current_action", current_action)
    monkeypatch.setattr(causal, "process_video",
                        lambda video, path, *a, **k: caught.setdefault(Path(path).name, video))
    monkeypatch.setattr(builtins, "input", lambda *_: "")
    noise = torch.cat([pipeline.noise(SEED, b, 0, (1, 16, 3, HEIGHT // 8, WIDTH // 8),
                                      torch.device("cpu"), torch.float32)
                       for b in range(BLOCKS)], dim=2)
    renoise = [pipeline.noise(SEED, b, s, (1, 16, 3, HEIGHT // 8, WIDTH // 8),
                              torch.device("cpu"), torch.float32)[0].transpose(0, 1)
               for b in range(BLOCKS) for s in range(1, len(STEPS[mode]))]
    monkeypatch.setattr(torch, "randn_like", lambda like, *a, **k: renoise.pop(0))
    # the loop's one `.half()` casts the latents for its float16 decoder: float32 here
    monkeypatch.setattr(torch.Tensor, "half", lambda self, *a, **k: self)
    with torch.no_grad():
        latents = loop.inference(noise, conditional, return_latents=True, output_folder=".",
                                 name="x", mode=mode)
    assert not renoise
    return latents, caught["x.mp4"], tokens, img_cond


def shim_caches(loop, config) -> None:
    """The released cache tensors at the tiny model's head sizes (it hard-codes 1.3B's)."""
    heads, action_heads = config.num_heads, config.action_config["heads_num"]
    kv, actions = loop._initialize_kv_cache, loop._initialize_kv_cache_mouse_and_keyboard

    def resize(caches, heads, head_size):
        for layer in caches:
            for name in ("k", "v"):
                layer[name] = layer[name].new_zeros(*layer[name].shape[:2], heads, head_size)

    def tiny_kv(*a, **k):
        kv(*a, **k)
        resize(loop.kv_cache1, heads, config.dim // heads)

    def tiny_actions(*a, **k):
        actions(*a, **k)
        resize(loop.kv_cache_mouse, action_heads, 64)
        resize(loop.kv_cache_keyboard, action_heads, 64)

    loop._initialize_kv_cache, loop._initialize_kv_cache_mouse_and_keyboard = tiny_kv, tiny_actions


def run_ardiff(pipeline, mode: str, image) -> tuple[list, torch.Tensor]:
    """Each block's output, and the session's image latents of the blocks' frames."""
    from ardiff import RolloutRequest

    outputs = []
    with make_runner(pipeline) as runner:
        for block, action in enumerate(ACTIONS[mode]):
            request = RolloutRequest("s", block_index=block, seed=SEED, actions=(action,),
                                     extra={"image": image})
            outputs.append(runner.execute(request).output)
        image_latents = pipeline.sessions["s"].image.block(0, 3 * BLOCKS)[:, 4:]
    return outputs, image_latents


@pytest.mark.parametrize("mode", ["universal", "gta_drive", "templerun"])
def test_released_streaming_loop_equals_matrix_game(released, mg_dir, image_path, mode,
                                                     monkeypatch, capsys):
    from PIL import Image

    from ardiff.pipelines.matrix_game.conditioning import image_pixels

    image = Image.open(image_path).convert("RGB")
    pipeline = make_pipeline(mg_dir, mode, height=HEIGHT, width=WIDTH)
    theirs, their_video, their_tokens, their_latents = run_released(
        released, mg_dir, mode, pipeline, image, monkeypatch)
    pixels = image_pixels(image, HEIGHT, WIDTH)
    assert torch.equal(pixels, frame_process(image))
    tokens = pipeline.clip(pixels[:, :, 0])
    token_error = float((tokens - their_tokens).abs().max() / their_tokens.abs().max())
    outputs, mine = run_ardiff(pipeline, mode, image)
    latent_error = float((mine - their_latents).abs().max() / their_latents.abs().max())
    ours = [o.extra["latents"] for o in outputs]
    errors = [float((latents - theirs[:, :, 3 * b:3 * b + 3]).abs().max()
                    / theirs[:, :, 3 * b:3 * b + 3].abs().max())
              for b, latents in enumerate(ours)]
    frames = torch.cat([o.frames for o in outputs])
    frame_error = int((frames.int() - torch.from_numpy(their_video).int()).abs().max())
    with capsys.disabled():
        print(f"\nMatrix-Game {mode}: latents per block {['%.1e' % e for e in errors]}, "
              f"frames {frame_error}/255, CLIP tokens {token_error:.1e}, image latents "
              f"{latent_error:.1e}")
    assert token_error <= 1e-5
    assert latent_error <= 1e-5
    assert max(errors) <= TOLERANCE, errors
    assert frame_error <= FLOAT32_FRAME_TOLERANCE
    assert frames.shape[0] == their_video.shape[0]


def test_the_streaming_decode_equals_the_released_decoder(released, mg_dir, capsys):
    """ardiff's streaming decode (causal-Wan's, diffusers' VAE) and the released
    VAEDecoderWrapper on the same latents, block by block with their caches, in float64:
    frames within 1/255 (the released conversion floors, ardiff's rounds)."""
    import numpy as np

    from ardiff.pipelines.causal_wan.decode import StreamingDecoder
    from ardiff.pipelines.causal_wan.models import wan_vae

    ours = StreamingDecoder(wan_vae(mg_dir, torch.float64).eval())
    blocks = released["demo_utils.vae_block3"]
    theirs = blocks.VAEDecoderWrapper()
    theirs.decoder = blocks.VAEDecoder3d(dim=2)  # the released width: 96
    state = torch.load(mg_dir / "Wan2.1_VAE.pth")
    theirs.load_state_dict({k: v for k, v in state.items() if "decoder." in k or "conv2" in k})
    theirs = theirs.double().eval()
    latents = torch.randn(1, 16, 3 * BLOCKS, HEIGHT // 8, WIDTH // 8,
                          generator=torch.Generator().manual_seed(SEED), dtype=torch.float64)
    cache, errors = [None] * 32, []
    with torch.no_grad():
        for block in range(BLOCKS):
            z = latents[:, :, 3 * block:3 * block + 3]
            video, cache = theirs(z.transpose(1, 2), *cache)
            expected = ((video[0].float() + 1) * 127.5).clip(0, 255).numpy().astype(np.uint8)
            expected = torch.from_numpy(expected).permute(0, 2, 3, 1)
            errors.append(int((ours.decode("s", z).int() - expected.int()).abs().max()))
    with capsys.disabled():
        print(f"\nstreaming decode vs the released decoder (float64): {errors} levels")
    assert max(errors) <= FRAME_TOLERANCE
