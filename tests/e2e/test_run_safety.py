"""Run directories under stress: failed starts, a second trainer, kills, a full disk,
the umask, signals, and the rule that picks the weights to translate with."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from aiayn.cli import app
from aiayn.data.files import (
    LockHeld,
    WriteFailed,
    exclusive_lock,
    remove_temporaries,
    system_error,
    write_dir_atomic,
)
from aiayn.io import checkpoint
from aiayn.io.checkpoint import latest_checkpoint, load_model, load_trainer_state, step_checkpoints
from aiayn.training.trainer import train_from_recipe
from train_helpers import RECIPE, make_corpus

runner = CliRunner()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("corpus") / "en-de")


def settings(corpus: Path, **train) -> list[str]:
    """Overrides for a fast tiny-test run: a log line every update."""
    values = {"valid_bleu_sentences": 0, "log_every_steps": 1, **train}
    return [f"data.corpus={corpus}", *(f"train.{k}={v}" for k, v in values.items())]


def snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    """Every path under `directory` with its size and modification time."""
    return {
        str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
    }


def temporaries(run: Path) -> list[str]:
    return sorted(p.name for p in [*run.glob(".*.tmp"), *run.glob("checkpoints/.*")])


def assert_checkpoints_load(run: Path) -> None:
    for directory in step_checkpoints(run):
        load_model(directory / "model.safetensors")
        assert load_trainer_state(directory)["state"]["step"] == checkpoint.step_of(directory)


# ----- a failed start writes nothing ----------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        "train.precision=fp16",  # needs CUDA
        "model.max_len=3",  # every training pair is too long
        "train.seed=abc",
    ],
)
def test_a_failed_start_leaves_the_run_directory_as_it_was(corpus, tmp_path, bad):
    run = tmp_path / "run"
    with pytest.raises(ValueError):
        train_from_recipe(RECIPE, run, [*settings(corpus, max_steps=1), bad], progress=False)
    assert not run.exists()

    train_from_recipe(RECIPE, run, settings(corpus, max_steps=1), progress=False)
    before = snapshot(run)
    with pytest.raises(ValueError):
        train_from_recipe(RECIPE, run, [*settings(corpus, max_steps=2), bad], progress=False)
    assert snapshot(run) == before


def test_a_run_without_a_checkpoint_accepts_another_recipe(corpus, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    # what a start killed before its first checkpoint leaves: another recipe, another
    # subword model
    (run / "config.yaml").write_text("model: {d_model: 999}\n")
    (run / "spm.model").write_bytes(b"not this corpus's model")
    result = train_from_recipe(RECIPE, run, settings(corpus, max_steps=1), progress=False)
    assert result.steps == 1
    assert (run / "spm.model").read_bytes() == (corpus / "spm.model").read_bytes()
    with pytest.raises(ValueError, match=r"model\.d_model"):  # now it has a checkpoint
        train_from_recipe(
            RECIPE, run, [*settings(corpus, max_steps=2), "model.d_model=16"], progress=False
        )


def test_a_run_directory_that_is_a_file_is_refused_before_any_work(corpus, tmp_path):
    path = tmp_path / "run"
    path.write_text("a file\n")
    args = ["train", str(RECIPE), *settings(corpus, max_steps=1), "--run", str(path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert f"{path} is an existing file" in result.output
    assert "Traceback" not in result.output and path.read_text() == "a file\n"


# ----- one trainer per run ----------------------------------------------------------


def test_exclusive_lock_names_the_holder_and_is_released_on_exit(tmp_path):
    path = tmp_path / ".lock"
    with exclusive_lock(path):
        with pytest.raises(LockHeld) as caught, exclusive_lock(path):
            pass
        assert caught.value.holder == os.getpid()
    with exclusive_lock(path):  # free again
        pass


def test_a_held_run_is_refused_in_one_line_naming_the_holder(corpus, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    args = ["train", str(RECIPE), *settings(corpus, max_steps=1), "--run", str(run)]
    with exclusive_lock(run / checkpoint.LOCK_FILE):
        result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert f"run {run} is in use by another trainer (process {os.getpid()})" in result.output
    assert "Traceback" not in result.output
    assert not (run / "config.yaml").exists()


# ----- what killed writes leave -------------------------------------------------------


def test_remove_temporaries_deletes_leftovers_and_restores_a_directory_moved_aside(tmp_path):
    write_dir_atomic(tmp_path / "best", lambda tmp: (tmp / "w").write_text("whole"))
    (tmp_path / ".step-00000003.1a2b3c4d.tmp").mkdir()  # killed while writing step 3
    (tmp_path / ".step-00000003.1a2b3c4d.tmp" / "model.safetensors").write_bytes(b"half")
    (tmp_path / ".config.yaml.5e6f7a8b.tmp").write_text("half")
    os.replace(tmp_path / "best", tmp_path / ".best.4242.old")  # killed while replacing best
    (tmp_path / ".other.1a2b3c4d.tmp").write_text("not ours")  # someone else's
    removed = remove_temporaries(tmp_path, ["step-*", "best", "config.yaml"])
    assert sorted(p.name for p in removed) == [
        ".config.yaml.5e6f7a8b.tmp",
        ".step-00000003.1a2b3c4d.tmp",
    ]
    assert (tmp_path / "best" / "w").read_text() == "whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.1a2b3c4d.tmp", "best"]


# ----- a full or read-only disk ---------------------------------------------------------


def test_system_error_finds_the_os_error_behind_a_writer_s_failure():
    full = OSError(errno.ENOSPC, "No space left on device")
    try:
        try:
            raise full
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos")  # noqa: B904
    except RuntimeError as err:
        assert system_error(err) is full  # torch.save to an open file
    from_message = system_error(
        RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")
    )
    assert from_message.errno == errno.ENOSPC  # safetensors
    assert system_error(RuntimeError("a bug")) is None
    refused = WriteFailed(errno.EROFS, os.strerror(errno.EROFS), "/run/config.yaml")
    assert str(refused) == "cannot write /run/config.yaml: Read-only file system"


@pytest.mark.parametrize("number", [errno.ENOSPC, errno.EACCES, errno.EROFS])
def test_a_refused_write_names_its_target_and_leaves_the_old_one(tmp_path, number):
    target = tmp_path / "checkpoints" / "best"
    write_dir_atomic(target, lambda tmp: (tmp / "w").write_text("whole"))

    def refused(tmp: Path) -> None:
        (tmp / "w").write_text("half")
        raise OSError(number, os.strerror(number))

    with pytest.raises(WriteFailed) as caught:
        write_dir_atomic(target, refused)
    assert str(caught.value) == f"cannot write {target}: {os.strerror(number)}"
    assert caught.value.errno == number
    assert (target / "w").read_text() == "whole"
    assert [p.name for p in target.parent.iterdir()] == ["best"]


def test_disk_full_during_a_checkpoint_is_one_line_and_the_run_resumes(
    corpus, tmp_path, monkeypatch
):
    run = tmp_path / "run"
    args = ["train", str(RECIPE), *settings(corpus, checkpoint_every_steps=3), "--run", str(run)]
    assert runner.invoke(app, [*args, "train.max_steps=3"]).exit_code == 0
    kept = (run / "checkpoints/step-00000003/model.safetensors").read_bytes()
    real_save = torch.save

    def full_disk(obj, file) -> None:  # as torch reports it: a RuntimeError during the OSError
        file.write(b"part of it")
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos")  # noqa: B904

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    result = runner.invoke(app, [*args, "train.max_steps=6", "--no-progress"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if "error" in line]
    step = run / "checkpoints" / "step-00000006"
    assert len(errors) == 1 and f"cannot write {step}: No space left on device" in errors[0]
    assert [d.name for d in step_checkpoints(run)] == ["step-00000003"]
    assert (run / "checkpoints/step-00000003/model.safetensors").read_bytes() == kept
    assert temporaries(run) == []

    monkeypatch.setattr(checkpoint.torch, "save", real_save)  # space again
    result = runner.invoke(app, [*args, "train.max_steps=6", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert latest_checkpoint(run).name == "step-00000006"
    assert "resumed from" in (run / "train.log").read_text()


def mount_tmpfs(directory: Path, size: str) -> None:
    directory.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")


def fill_disk(directory: Path, leave: int) -> Path:
    """Fill the file system of `directory`, then free `leave` bytes."""
    filler = directory / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as err:
            assert err.errno == errno.ENOSPC
    os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler


def aiayn(*args: str) -> list[str]:
    """The command line of `aiayn ARGS` in a new process."""
    return [sys.executable, "-m", "aiayn.cli", *args]


def test_a_real_full_disk_at_start_and_in_a_checkpoint(corpus, tmp_path):
    disk = tmp_path / "disk"
    mount_tmpfs(disk, "2m")
    try:
        run = disk / "run"
        args = ["train", str(RECIPE), *settings(corpus), "--run", str(run), "--no-progress"]

        filler = fill_disk(disk, leave=0)  # full at the start
        result = runner.invoke(app, [*args, "train.max_steps=3"])
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert f"cannot write {run}" in result.output and "No space left" in result.output
        assert latest_checkpoint(run) is None
        for name in ("spm.model", "config.yaml"):  # never a truncated one
            assert not (run / name).exists() or (run / name).stat().st_size > 0
        assert temporaries(run) == []

        filler.unlink()
        result = runner.invoke(app, [*args, "train.max_steps=3"])
        assert result.exit_code == 0, result.output
        assert (run / "spm.model").read_bytes() == (corpus / "spm.model").read_bytes()

        filler = fill_disk(disk, leave=48 * 1024)  # room for the logs, not a checkpoint
        kept = snapshot(run / "checkpoints")
        result = runner.invoke(app, [*args, "train.max_steps=6"])
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert f"cannot write {run / 'checkpoints'}" in result.output
        assert "No space left on device" in result.output
        assert snapshot(run / "checkpoints") == kept
        assert_checkpoints_load(run)

        filler.unlink()
        result = runner.invoke(app, [*args, "train.max_steps=6"])
        assert result.exit_code == 0, result.output
        assert latest_checkpoint(run).name == "step-00000006"
        assert temporaries(run) == []

        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)  # read-only
        kept = snapshot(run)
        result = runner.invoke(app, [*args, "train.max_steps=9"])
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert str(run) in result.output and "read-only" in result.output
        assert snapshot(run) == kept
    finally:
        subprocess.run(["umount", str(disk)], check=False)


# ----- the user's umask -------------------------------------------------------------------


def test_everything_in_a_run_gets_the_user_s_umask(corpus, tmp_path):
    previous = os.umask(0o027)
    try:
        run = tmp_path / "run"
        train_from_recipe(RECIPE, run, settings(corpus, max_steps=2), progress=False)
        checkpoint.average_last(run, 1)
    finally:
        os.umask(previous)
    paths = list(run.rglob("*"))
    assert {"model.safetensors", "trainer.pt", "config.yaml", "spm.model", ".lock"} <= {
        p.name for p in paths
    }
    for path in paths:
        assert path.stat().st_mode & 0o777 == (0o750 if path.is_dir() else 0o640), path


# ----- real processes: signals, kills, a second trainer ---------------------------------


def wait_for(condition: Callable[[], bool], process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 120
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"exited ({process.returncode}) before {what}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def train_steps(run: Path) -> list[int]:
    """The steps of RUN/metrics.jsonl's training lines, in order."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return [line["step"] for line in lines if line["kind"] == "train"]


@pytest.mark.slow
def test_sigterm_exits_143_and_sigint_130_and_resuming_is_logged(corpus, tmp_path):
    run = tmp_path / "run"
    train = aiayn("train", str(RECIPE), *settings(corpus, max_steps=100000), "--run", str(run))
    for number, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        seen = len(train_steps(run))

        def updated(seen: int = seen) -> bool:
            return len(train_steps(run)) > seen + 2

        process = subprocess.Popen(
            [*train, "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        wait_for(updated, process, "three updates")
        process.send_signal(number)
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == code, stderr
        assert "Traceback" not in stderr
        assert latest_checkpoint(run).name == f"step-{train_steps(run)[-1]:08d}"  # saved
    log = (run / "train.log").read_text()
    assert f"resumed from {run / 'checkpoints'}" in log


@pytest.mark.slow
def test_kills_at_any_point_lose_nothing_and_a_second_trainer_is_refused(corpus, tmp_path):
    run = tmp_path / "run"
    overrides = settings(corpus, max_steps=100000, checkpoint_every_steps=4)
    train = aiayn("train", str(RECIPE), *overrides, "--run", str(run), "--no-progress")

    def start(slow_save: float = 0) -> subprocess.Popen:
        env = {**os.environ, checkpoint.SLOW_SAVE_VARIABLE: str(slow_save)}
        return subprocess.Popen(train, env=env, stderr=subprocess.PIPE, text=True)

    def kill_and_restart_at(
        first: subprocess.Popen, when: Callable[[], bool], what: str, slow_save: float = 0
    ) -> subprocess.Popen:
        wait_for(when, first, what)
        first.kill()
        first.wait()
        assert_checkpoints_load(run)
        last = latest_checkpoint(run)
        last_step = 0 if last is None else checkpoint.step_of(last)
        seen, left = len(train_steps(run)), set(temporaries(run))
        again = start(slow_save)
        wait_for(lambda: len(train_steps(run)) > seen, again, "an update after the restart")
        assert train_steps(run)[seen] == last_step + 1
        assert not left & set(temporaries(run))  # (the new process may be writing its own)
        return again

    # 1. killed before its first checkpoint
    first = start()
    second = kill_and_restart_at(first, lambda: len(train_steps(run)) >= 2, "two updates")

    # 2. killed between checkpoints; the next one pauses in each checkpoint write
    slow = kill_and_restart_at(
        second,
        lambda: latest_checkpoint(run) is not None and train_steps(run)[-1] % 4 == 2,
        "an update between checkpoints",
        slow_save=600,
    )

    # 3. killed while writing a checkpoint, with a second trainer refused meanwhile
    writing = lambda: any(run.glob("checkpoints/.step-*.tmp/model.safetensors"))  # noqa: E731
    wait_for(writing, slow, "a checkpoint being written")
    refused = subprocess.run(train, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"aiayn: error: run {run} is in use by another trainer (process {slow.pid}); "
        "wait for it to end or stop it, or give another --run directory"
    )
    assert any(name.startswith(".step-") for name in temporaries(run))  # not touched
    last = kill_and_restart_at(slow, writing, "a checkpoint being written")
    last.kill()
    last.wait()


@pytest.mark.slow
def test_under_torchrun_rank_0_holds_the_lock_and_a_refusal_ends_every_rank(corpus, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "-m", "aiayn.cli", "train", str(RECIPE), *settings(corpus, max_steps=1),
        "--run-dir", str(run), "--device", "cpu", "--no-progress",
    ]  # fmt: skip
    with exclusive_lock(run / checkpoint.LOCK_FILE):  # another trainer holds the run
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0  # both ranks ended: rank 1 did not wait for rank 0
    assert f"run {run} is in use by another trainer (process {os.getpid()})" in done.stderr
    assert f"rank 0 could not start the run {run}" in done.stderr
    assert latest_checkpoint(run) is None and not (run / "config.yaml").exists()
    # (two ranks training under one lock: tests/e2e/test_distributed.py)


@pytest.mark.slow
def test_under_torchrun_a_full_disk_ends_every_rank_in_one_line(corpus, tmp_path):
    disk = tmp_path / "disk"
    mount_tmpfs(disk, "2m")
    try:
        run = disk / "run"
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            "2", "-m", "aiayn.cli", "train", str(RECIPE), *settings(corpus, max_steps=2),
            "--run-dir", str(run), "--device", "cpu", "--no-progress",
        ]  # fmt: skip
        filler = fill_disk(disk, leave=400 * 1024)  # room for the start, not a checkpoint
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        filler.unlink()
    finally:
        subprocess.run(["umount", str(disk)], check=False)
    assert done.returncode != 0  # and in time: rank 1 did not wait for rank 0
    assert f"cannot write {run / 'checkpoints'}" in done.stderr
    assert "No space left on device" in done.stderr
    assert "rank 0 could not" in done.stderr  # rank 1's line
