"""The one check of a name against a menu (``--pool``, ``--head``, ``--kind``), so that
every tool refuses an unknown name with the same sentence."""

from __future__ import annotations

from collections.abc import Sequence


def check_choice(name, choices: Sequence[str], what: str,
                 error: type[ValueError] = ValueError) -> str:
    """``name`` if it is one of ``choices``; otherwise ``error`` saying ``unknown {what}
    {name!r}: choose one of ...`` with the choices in their order."""
    if name not in choices:
        raise error(f"unknown {what} {name!r}: choose one of {', '.join(choices)}")
    return name
