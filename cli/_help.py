"""How every command's `--help` reads: paragraphs Rich wraps, one metavar style, defaults.

    app.command("rollout", cls=Command)(rollout_command)

A docstring is written wrapped at 100 columns; Typer would keep those line breaks and Rich
wrap again at the terminal's width, leaving half-empty lines. `Command` joins the lines of
each paragraph, so Rich wraps them once. Every value an option takes is named in capitals
(TEXT, INTEGER, NUMBER, PATH, or the option's own metavar such as SIZE), an argument by its
name (CONFIG), and a flag by nothing. An option whose default comes from the config says
so (`FROM_CONFIG`), the others show their default.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

if TYPE_CHECKING:  # annotations only: Typer vendors click (typer._click), which may be absent
    import click

FROM_CONFIG = "from the config"  # show_default= of a flag that overrides a config key

# Typer's type labels -> the metavar shown when an option names none
METAVARS = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "path": "PATH", "bool": "",
            "int range": "INTEGER", "float range": "NUMBER"}


def paragraphs(text: str | None) -> str | None:
    """`text` with each paragraph on one line (blank lines still separate paragraphs)."""
    if text is None:
        return None
    blocks = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in block.splitlines()) for block in blocks)


def tidy_param(param: click.Parameter) -> None:
    """One metavar style: flags none, arguments their name, options their type in capitals."""
    if isinstance(param, TyperArgument):
        param.metavar = param.metavar or (param.name or "value").upper()
        param.display_type_rich = _no_type  # type: ignore[method-assign]  # named: enough
        if param.required:  # CONFIG, as click writes it (Typer writes {CONFIG}); [CONFIG] else
            param._usage_display_name = lambda: param.metavar  # type: ignore[method-assign]
    elif isinstance(param, TyperOption):
        if param.is_flag:
            param.metavar = ""
        elif param.metavar is None:
            label = param.display_type(None).strip("<>")  # type: ignore[arg-type]
            param.metavar = METAVARS.get(label.lower(), label.upper())
        param.help = paragraphs(param.help)


def _no_type(ctx: click.Context) -> None:
    return None


class Command(TyperCommand):
    """A Typer command whose help reads as `paragraphs` and `tidy_param` say."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = paragraphs(self.help)

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)  # its own and --help, made when asked for
        for param in params:
            tidy_param(param)
        return params


class Group(TyperGroup):
    """The root, tidied as `Command` is."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = paragraphs(self.help)

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)
        for param in params:
            tidy_param(param)
        return params
