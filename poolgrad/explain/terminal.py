"""``poolgrad explain``'s terminal output: small grids of a routing, coloured with rich
where it is installed."""

from __future__ import annotations

from .routing import Routing


def render_terminal(routing: Routing, examples: int = 1, color: bool = True) -> str:
    """Small grids as text: input (winners marked), routed gradient, and the batch's
    sender counts. Coloured with rich when it is installed and ``color`` is set."""
    lines = []
    h, w = routing.x.shape[1:]
    if h * w > 400:
        return f"(maps of {h}x{w} are too large for the terminal; see the figures)"
    for n in range(min(examples, len(routing.x))):
        won = set()
        if routing.winners is not None:
            won = {(int(f) // w, int(f) % w) for f in routing.winners[n].ravel()}
        lines.append(f"example {n}: input ([x] won a window)")
        lines += ["  " + " ".join((f"[{v:5.2f}]" if (i, j) in won else f" {v:5.2f} ")
                                  for j, v in enumerate(row))
                  for i, row in enumerate(routing.x[n])]
        lines.append(f"example {n}: gradient routed back (dy = given upstream gradient)")
        lines += ["  " + " ".join(f" {v:5.2f} " if v else "    .   " for v in row)
                  for row in routing.dx[n]]
    lines.append(f"examples sending gradient to each position (of {len(routing.x)}):")
    lines += ["  " + " ".join(f"{int(v):4d}" for v in row) for row in routing.senders]
    text = "\n".join(lines)
    if not color:
        return text
    try:
        from rich.text import Text
    except ImportError:
        return text
    rich_text = Text(text)
    rich_text.highlight_regex(r"\[[ \-0-9.]+\]", "bold red")
    return rich_text
