"""Triton's interpreter without its repeated patching of ``triton.language``.

Under ``TRITON_INTERPRET=1`` a kernel launch patches the language modules in its
function's globals (``_patch_lang``: each builtin of ``tl``, ``tl.tensor``, ``tl.math``
... wrapped to run on NumPy) and restores them when the grid is done. Every call of a
``@triton.jit`` helper inside the kernel, in every program, patches them again. By then
the modules are patched: each builtin is already wrapped (``_patch_builtin`` wraps only
builtins), and the other attributes are set to equivalent new closures. Only the
``inspect.getmembers`` walks cost: a fifth of the interpreter's time in
``tests/test_triton.py``.

:func:`install` skips a helper's patch while a kernel runs whose own patch, or an
earlier helper's in the same launch, covered every language module the helper's
globals hold; any other call patches as before. The kernels run the same interpreted
code. CI has no GPU, so every Triton test runs this way; on a GPU the interpreter is
not used and this does nothing.
"""

from __future__ import annotations

import functools
import inspect


def install() -> None:
    """Patch Triton's interpreter (once; a Triton without the expected functions is
    left as it is)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    patch_lang = getattr(interpreter, "_patch_lang", None)
    executor = getattr(interpreter, "GridExecutor", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    if (patch_lang is None or executor is None or scope_type is None
            or getattr(patch_lang, "skips_repeats", False)):
        return
    running = []  # per running kernel: [its function, the modules patched so far]
    known = {}  # per function, the language modules its globals hold

    def languages(fn) -> frozenset:
        found = known.get(fn)
        if found is None:
            found = known[fn] = frozenset(
                id(value) for value in fn.__globals__.values()
                if inspect.ismodule(value) and value in (tl, tl.core))
        return found

    @functools.wraps(patch_lang)
    def patch_once(fn):
        if running:
            kernel = running[-1]
            if kernel[1] is None and fn is kernel[0]:  # the kernel's own patch
                kernel[1] = languages(fn)
            elif kernel[1] is not None:
                needed = languages(fn)
                if needed <= kernel[1]:
                    return scope_type()  # a helper: already patched, nothing to restore
                # patched below, and Triton never restores a helper's patch: covered for
                # the rest of the launch (tl.zeros's module holds tl.core, not tl)
                kernel[1] = kernel[1] | needed
        return patch_once.__wrapped__(fn)

    patch_once.skips_repeats = True
    launch = executor.__call__

    @functools.wraps(launch)
    def run_grid(self, *args, **kwargs):
        running.append([self.fn, None])
        try:
            return launch(self, *args, **kwargs)
        finally:
            running.pop()

    interpreter._patch_lang = patch_once
    executor.__call__ = run_grid
