"""Checkpoints of ``poolgrad train``, written after every epoch so that ``--resume``
goes on from the last one: the NumPy engine's ``checkpoint.npz`` (weights, optimizer
state, metadata as JSON; no pickles) and the torch engine's ``checkpoint.pt`` (state
dicts, loaded with ``weights_only``). Each engine resumes only its own kind
(:func:`poolgrad.train.run.check_folder`).

Both hold the same metadata: the run's settings, the epochs done, the history and the
seconds of training so far.
"""

from __future__ import annotations

import json
import os
import pickle
import zipfile

import numpy as np

from ..tools.files import write_atomically
from .config import TrainError, require_torch

CHECKPOINTS = {"numpy": "checkpoint.npz", "torch": "checkpoint.pt"}


def _meta(run, epoch: int) -> dict:
    """What a checkpoint records of ``run`` after ``epoch`` epochs."""
    return {"settings": run.settings, "epoch": epoch, "history": run.history,
            "train_time_s": run.train_time}


def check_meta(meta) -> dict:
    """``meta`` if it has what resuming needs; otherwise a ValueError saying what lacks."""
    missing = {"settings", "epoch", "history", "train_time_s"} - set(meta)
    if missing:
        raise ValueError(f"its metadata lacks {sorted(missing)}")
    return meta


def save_numpy(path: str, model, optimizer, run, epoch: int) -> None:
    """The NumPy engine's checkpoint: ``model``'s and ``optimizer``'s arrays, and
    the metadata as JSON."""
    arrays = {f"weight/{k}": v for k, v in model.state_dict().items()}
    arrays.update({f"optimizer/{k}": v for k, v in optimizer.state_dict().items()})
    arrays["meta"] = np.array(json.dumps(_meta(run, epoch)))
    write_atomically(path, lambda stream: np.savez(stream, **arrays))


def load_numpy(path: str, purpose: str = "to resume from"):
    """``(weights, optimizer_state, meta)`` of a checkpoint written by
    :func:`save_numpy`; ``purpose`` says in an error what was looked for."""
    try:
        if not zipfile.is_zipfile(path):  # NumPy would try it as a pickle and say so
            if not os.path.exists(path):
                raise FileNotFoundError(path)
            raise ValueError("not a .npz archive")
        with np.load(path, allow_pickle=False) as archive:
            arrays = {k: archive[k] for k in archive.files}
        meta = check_meta(json.loads(str(arrays.pop("meta"))))
    except FileNotFoundError:
        raise TrainError(f"no checkpoint {purpose}: {path} does not exist") from None
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as error:
        raise TrainError(f"{path} is not a poolgrad checkpoint ({error})") from None
    weights = {k[len("weight/"):]: v for k, v in arrays.items() if k.startswith("weight/")}
    state = {k[len("optimizer/"):]: v for k, v in arrays.items() if k.startswith("optimizer/")}
    return weights, state, meta


def save_torch(path: str, model, optimizer, run, epoch: int) -> None:
    """The torch engine's checkpoint: the state dicts of ``model`` and ``optimizer``,
    and the metadata."""
    torch = require_torch()
    state = {"engine": "torch", "model": model.state_dict(),
             "optimizer": optimizer.state_dict(), "meta": _meta(run, epoch)}
    write_atomically(path, lambda stream: torch.save(state, stream))


def load_torch(path: str) -> dict:
    """``{"model", "optimizer", "meta"}`` of a checkpoint written by
    :func:`save_torch`."""
    torch = require_torch()
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or state.get("engine") != "torch":
            raise ValueError("it is not a torch engine checkpoint")
        check_meta(state["meta"])
    except FileNotFoundError:
        raise TrainError(f"no checkpoint to resume from: {path} does not exist") from None
    except (OSError, EOFError, RuntimeError, ValueError, KeyError, TypeError,
            pickle.UnpicklingError) as error:  # what torch.load raises on a bad file
        reason = (str(error).strip() or type(error).__name__).splitlines()[0]
        raise TrainError(f"{path} is not a poolgrad checkpoint ({reason})") from None
    return state
