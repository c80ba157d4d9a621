"""Studies that answer a question with trained networks: ``poolgrad study``.

``poolgrad study shift`` asks whether pooling makes a network shift-invariant. It
trains the CNN of ``poolgrad train --engine torch`` with every downsampling and head on
MNIST-1D and on digits placed on a larger canvas, several seeds each
(:mod:`~poolgrad.study.runner`), measures how its predictions move under shifts
(:mod:`~poolgrad.study.shifts`), and writes the runs, a table, plots and the findings
(:mod:`~poolgrad.study.report`, :mod:`~poolgrad.study.findings`). The method and a full
run's results are in docs/shift_study.md.
"""

from __future__ import annotations

import os
import platform
import sys
from contextlib import nullcontext
from dataclasses import asdict

from ..tools import folders, processes
from ..tools.files import check_output_folder
from .runner import DATASETS, HEADS, POOLS, Plan, StudyError, make_plan

__all__ = ["DATASETS", "HEADS", "POOLS", "Plan", "StudyError", "make_plan", "shift_study"]


def resolve_device(device: str) -> str:
    """``"cpu"`` or ``"cuda"``; ``"auto"``: the GPU when torch sees one."""
    from ..train.config import require_torch
    torch = require_torch()
    if device not in ("auto", "cpu", "cuda"):
        raise StudyError(f"unknown device {device!r}: choose auto, cpu or cuda")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise StudyError("--device cuda: torch sees no CUDA GPU here; use --device cpu")
    return device


def shift_study(out: str, plan: Plan | None = None, *, device: str = "auto",
                workers: int | None = None, progress=None, overwrite: bool = False) -> dict:
    """Run (or go on with) the shift study into ``out`` and write its report; returns
    the paths of what it wrote. ``workers``: processes training runs side by side
    (default: one per core on the CPU, one on the GPU). ``out`` holds a study and
    nothing else (:func:`poolgrad.tools.folders.survey`); ``overwrite``: replace the
    study in it whole once this one is written, leaving it as it was until then
    (:func:`poolgrad.tools.folders.replacing`)."""
    from . import report, runner
    plan = plan or make_plan()
    check_output_folder(out, StudyError)  # before the work, not after it
    restored = folders.recover(out)
    if restored:
        print(f"poolgrad study: {restored}", file=sys.stderr)
    folders.survey(out, folders.STUDY, StudyError)
    report.check_plotting(StudyError)
    device = resolve_device(device)
    if workers is None:
        workers = processes.cores() if device == "cpu" else 1
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise StudyError(f"workers must be an integer >= 1, got {workers!r}")
    about = {"plan": asdict(plan), "settings": {d: plan.settings(d) for d in plan.datasets},
             "device": device, "workers": workers,
             "machine": {"cpu": platform.processor() or platform.machine(),
                         "cores": os.cpu_count()}}
    with folders.replacing(out, StudyError) if overwrite else nullcontext(out) as folder:
        try:
            records = runner.run_all(folder, plan, device=device, workers=workers,
                                     progress=progress)
        except ChildProcessError as error:  # say what is left of the study
            kept = (f"{out} holds the old study still" if overwrite else
                    f"the finished runs are kept in {out}, to go on from when run again")
            raise ChildProcessError(f"{error}; {kept}") from None
        written = report.write(folder, records, about)
    return {name: os.path.join(out, os.path.relpath(path, folder))
            for name, path in written.items()}
