"""Prompt cleaning as Wan2.1 does it before tokenising (and so Self-Forcing, CausVid and
LongLive, which keep Wan's tokenizer wrapper, and diffusers' `WanPipeline`):

    clean_prompt("  a  cat &amp;amp; a “dog”\\n")   ->   'a cat & a "dog"'

    text -> ftfy.fix_text            mojibake, curly quotes, control characters, ...
         -> html.unescape, twice     '&amp;amp;' -> '&'
         -> strip
         -> each run of whitespace -> one space, strip

Whitespace is Unicode's White_Space, as the `regex` module's `\\s` that Wan uses matches it
(the stdlib's `\\s` also takes U+001C..U+001F). ftfy is required, not optional: it is part
of the `wan` extra, and without it `require_ftfy` (called at `load`) and `clean_prompt`
raise one line naming the install, rather than feed the model text it was not trained on.
"""

from __future__ import annotations

import html
import re
from types import ModuleType

from ardiff.errors import PipelineLoadError

WHITESPACE = re.compile(r"[^\S\x1c-\x1f]+")  # the `regex` module's \s on str


def require_ftfy() -> ModuleType:
    """The `ftfy` module, or a one-line `PipelineLoadError` saying how to install it."""
    try:
        import ftfy
    except ImportError:
        raise PipelineLoadError("pipeline: causal-wan cleans every prompt with ftfy before "
                                "tokenising, as Wan does, and ftfy is not installed; pip "
                                "install 'ardiff[wan]' (or ftfy)") from None
    return ftfy


def clean_prompt(text: str) -> str:
    """`text` as Wan's tokenizer (`clean='whitespace'`) cleans it before tokenising."""
    text = require_ftfy().fix_text(text)
    text = html.unescape(html.unescape(text)).strip()
    return WHITESPACE.sub(" ", text).strip()
