"""What the tools share to draw (train's plot, explain's figures, the study's plots):
matplotlib's Figure without pyplot (which would change the caller's backend and keep
figures alive), a clear error when matplotlib is missing, and PNGs written atomically."""

from __future__ import annotations

import io

from .files import write_atomically


def figure_class(purpose: str, extra: str, error: type[ValueError] = ValueError):
    """matplotlib's ``Figure`` class; when matplotlib is missing, ``error`` saying
    that ``purpose`` needs it and how to install it (with ``poolgrad[extra]``)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise error(f"matplotlib is needed for {purpose}: pip install matplotlib (or pip "
                    f"install 'poolgrad[{extra}]')") from None
    return Figure


def save_png(figure, path: str, **options) -> str:
    """``figure`` as a PNG at ``path``, written atomically; ``options`` go to savefig."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", **options)
    write_atomically(path, lambda stream: stream.write(buffer.getvalue()))
    return path
