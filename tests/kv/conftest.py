"""tests/kv helpers: `kvdrive` (tiny specs, the DESIGN §3 window model, the paged-vs-dense lockstep)."""

from __future__ import annotations

import sys
from pathlib import Path


# Importable as `import kvdrive` whatever pytest's import mode.
sys.path.insert(0, str(Path(__file__).parent))


