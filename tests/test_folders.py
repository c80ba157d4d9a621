"""Run folders (poolgrad/tools/folders.py): a folder is told apart as a train run, a
study or something else, and --overwrite's swap leaves the old run or the new one
wherever a crash stops it, never a mix."""

import os

import pytest

from poolgrad.tools import folders


def contents(folder):
    """Every file under ``folder`` with its bytes, by relative path."""
    return {os.path.relpath(os.path.join(root, name), folder):
            open(os.path.join(root, name), "rb").read()
            for root, _, names in os.walk(folder) for name in names}


def make(folder, files):
    for relative, data in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return folder


OLD = {"checkpoint.npz": b"old weights", "metrics.json": b"old", "training.png": b"old plot"}
NEW = {"checkpoint.pt": b"new weights", "metrics.json": b"new"}


def test_survey_tells_a_run_a_study_and_other_files_apart(tmp_path):
    assert folders.survey(str(tmp_path / "missing"), folders.TRAIN) == []
    run = make(tmp_path / "run", {**OLD, ".poolgrad-1f2e.npz": b"a killed write"})
    assert folders.survey(str(run), folders.TRAIN) == ["checkpoint.npz", "metrics.json"]
    study = make(tmp_path / "study", {"results.json": b"{}", "table.md": b"",
                                      "runs/digits16/max-gap-seed0.json": b"{}"})
    assert folders.survey(str(study), folders.STUDY) == ["results.json", "runs"]
    with pytest.raises(ValueError, match=r"^\S+/study holds a study of poolgrad study shift, "
                                         r"not a run of poolgrad train: give another --out$"):
        folders.survey(str(study), folders.TRAIN)
    with pytest.raises(ValueError, match=r"/run holds a run of poolgrad train, not a study"):
        folders.survey(str(run), folders.STUDY)
    # a folder of runs of poolgrad train is not a study, though it has a runs/ folder
    nested = make(tmp_path / "project", {"runs/digits/checkpoint.npz": b"weights"})
    with pytest.raises(ValueError, match=r"holds files that poolgrad study shift does not "
                                         r"write \(runs/digits/checkpoint\.npz\)"):
        folders.survey(str(nested), folders.STUDY)
    home = make(tmp_path / "home", {**OLD, ".bashrc": b"", "notes.txt": b"", "a/b": b"",
                                    "z": b""})
    with pytest.raises(ValueError, match=r"holds files that poolgrad train does not write "
                                         r"\(\.bashrc, a/, notes\.txt and 1 more\): a run's "
                                         r"folder holds it alone; give another --out"):
        folders.survey(str(home), folders.TRAIN)


def test_the_layouts_name_the_files_the_commands_write():
    from poolgrad.study import report
    from poolgrad.train import checkpoints, run
    assert set(folders.TRAIN.patterns) == {*checkpoints.CHECKPOINTS.values(), run.METRICS,
                                           run.PLOT}
    assert set(report.FILES.values()) < set(folders.STUDY.patterns)


@pytest.mark.parametrize("swap", ["exchange", "two renames"])
def test_replacing_swaps_in_the_new_run_and_removes_the_old(tmp_path, monkeypatch, swap):
    if swap == "two renames":
        monkeypatch.setattr(folders, "exchange", lambda a, b: False)
    out = make(tmp_path / "out", OLD)
    with folders.replacing(str(out)) as staged:
        assert os.path.dirname(staged) == str(tmp_path) and contents(out) == OLD
        make(tmp_path / os.path.basename(staged), NEW)
    assert contents(out) == NEW and os.listdir(tmp_path) == ["out"]
    with folders.replacing(str(tmp_path / "fresh" / "run")) as staged:  # nothing to replace
        make(tmp_path / "fresh" / os.path.basename(staged), NEW)
    assert contents(tmp_path / "fresh" / "run") == NEW


class Killed(BaseException):
    """The process dies here: nothing after it runs (but the test's finally blocks)."""


@pytest.mark.parametrize("failing, old_removal_dies, left", [
    ({1}, False, OLD),  # the old run cannot be moved aside
    ({2}, False, OLD),  # the new one cannot be moved in: the old one is moved back
    ({2, 3}, False, OLD),  # killed between the two renames: OUT is missing until recover()
    (set(), True, NEW),  # killed before the old run, moved aside, was removed
])
def test_a_crash_in_the_two_rename_swap_leaves_one_run_whole(tmp_path, monkeypatch, failing,
                                                            old_removal_dies, left):
    monkeypatch.setattr(folders, "exchange", lambda a, b: False)
    calls, rename, rmtree = [], os.rename, folders.shutil.rmtree

    def dying_rename(source, target):
        calls.append(source)
        if len(calls) in failing:
            raise Killed
        rename(source, target)

    def dying_rmtree(path, **options):
        if old_removal_dies and folders.OLD in path:
            raise Killed
        rmtree(path, **options)

    monkeypatch.setattr(folders.os, "rename", dying_rename)
    monkeypatch.setattr(folders.shutil, "rmtree", dying_rmtree)
    out = make(tmp_path / "out", OLD)
    with pytest.raises(Killed):
        with folders.replacing(str(out)) as staged:
            make(tmp_path / os.path.basename(staged), NEW)
    monkeypatch.setattr(folders.os, "rename", rename)
    restored = folders.recover(str(out))  # what the next start does first
    assert (restored is not None) == (failing == {2, 3})
    assert contents(out) == left
