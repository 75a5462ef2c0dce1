"""Bounds shared across the layers: past them a value is a typo, not a request.

Every number a config holds has a ceiling here, so what passes validation does not fail
later (docs/configs.md lists them with their reasons). A leaf: it imports nothing.
"""

# Config values.
MAX_FRAMES = 1_000_000  # frames, positions, windows: below sampling.SEED_STRIDE (1_000_003),
#                         so noise streams seed * stride + frame never collide, and below the
#                         spec's default max_model_len (2**20)
MAX_SEED = 2**32 - 1    # seed * 1_000_003 + frame must fit torch's 64-bit manual_seed
MAX_NUM_STEPS = 1000    # the longest schedule diffusion models are trained with
MAX_SESSIONS = 65_536   # resident sessions of one process; far above what a device holds
MAX_PAGE_TOKENS = 2**20  # tokens of one KV page; far above any frame
MAX_CRF = 63            # the largest crf of any codec (libvpx-vp9; libx264 stops at 51)
MAX_SCALE = 32          # output.scale: a 32x32 frame -> 1024x1024; memory grows with scale**2
MIN_FPS, MAX_FPS = 0.01, 1000.0  # every format stores these rates: a GIF delay is at most
#                         655 s, Matroska and WebM count milliseconds, MP4 fails past ~3000


# runtime.parallel
MAX_WORKERS = 1024      # processes of one job; far above the devices of one cluster

# ardiff bench (blocks and sweep lengths: MAX_FRAMES; threads: MAX_WORKERS)
MAX_REPEATS = 1000      # repeats of every arm; the medians settle within a few
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week: a group that waits longer is a typo

# User text and paths (ardiff.text, ardiff.path_text)
MAX_SHOWN_CHARS = 200  # the longest quote of a user's value in any message
MAX_KEY_CHARS = 60     # the longest key shown as part of a dotted path
MAX_NAME_BYTES = 255   # one file or folder name (NAME_MAX of Linux, macOS and Windows)
MAX_PATH_BYTES = 4095  # a whole path (PATH_MAX of Linux, less its NUL)
