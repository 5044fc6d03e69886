"""aiayn.training.host_memory: oneDNN's kernel cache and glibc's malloc for a training process.

The malloc checks run in a process of their own (mallopt changes the whole process), and
read glibc's own account of its blocks (`mallinfo2`) before and after a large allocation:
with the defaults it is a block mapped on its own, after `keep_freed_memory` it is not.
"""

from __future__ import annotations

import ctypes.util
import os
import random
import subprocess
import sys
import textwrap

import pytest

from aiayn.training import host_memory
from aiayn.training.host_memory import (
    OPT_OUT_ENV,
    PRIMITIVE_CACHE_CAPACITY,
    PRIMITIVE_CACHE_ENV,
    _apply,
    _glibc,
)

GLIBC = _glibc() is not None and hasattr(_glibc(), "mallinfo2")

# One 64 MiB block (above glibc's default mmap threshold of 128 KiB, and above the most
# it raises that threshold to, 32 MiB): is it mapped on its own (mallinfo2's hblks)?
MAPPED_CHECK = textwrap.dedent(
    """
    import ctypes, sys
    from aiayn.training.host_memory import keep_freed_memory

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    if sys.argv[1] == "tuned":
        print(keep_freed_memory(), file=sys.stderr)
    before = libc.mallinfo2().hblks
    block = libc.malloc(64 << 20)
    during = libc.mallinfo2().hblks
    libc.free(block)
    print(during - before)
    """
)


def mapped_blocks(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", MAPPED_CHECK, mode], capture_output=True, text=True, check=True
    )
    return int(done.stdout.strip())


@pytest.mark.skipif(not GLIBC, reason="needs glibc 2.33 or later (mallinfo2)")
def test_large_blocks_come_from_the_heap_after_keep_freed_memory():
    assert mapped_blocks("default") == 1  # glibc's default: mapped on its own
    assert mapped_blocks("tuned") == 0  # served from the heap, kept when freed


@pytest.fixture
def no_mallopt(monkeypatch):
    """`_apply` without changing this test process's malloc (checked in a subprocess above)."""
    monkeypatch.setattr(host_memory, "keep_freed_memory", lambda: "malloc: (not called)")


def test_the_cache_capacity_is_set_where_unset(no_mallopt):
    environ: dict[str, str] = {}
    applied = _apply(environ)
    assert environ[PRIMITIVE_CACHE_ENV] == str(PRIMITIVE_CACHE_CAPACITY)
    assert applied[0] == f"{PRIMITIVE_CACHE_ENV}={PRIMITIVE_CACHE_CAPACITY}"
    assert applied[1] == "malloc: (not called)"


def test_a_users_cache_capacity_is_kept(no_mallopt):
    environ = {PRIMITIVE_CACHE_ENV: "2048"}
    applied = _apply(environ)
    assert environ[PRIMITIVE_CACHE_ENV] == "2048"
    assert applied[0] == f"{PRIMITIVE_CACHE_ENV}=2048 (as set)"


def test_opting_out_changes_nothing(monkeypatch):
    calls = []
    monkeypatch.setattr(host_memory, "keep_freed_memory", lambda: calls.append(1) or "")
    environ = {OPT_OUT_ENV: "default"}
    applied = _apply(environ)
    assert environ == {OPT_OUT_ENV: "default"}
    assert calls == []
    assert "defaults kept" in applied[0]


def test_tune_host_memory_applies_once(monkeypatch):
    calls = []
    monkeypatch.setattr(host_memory, "_applied", None)
    monkeypatch.setattr(host_memory, "_apply", lambda environ: calls.append(1) or ["x"])
    assert host_memory.tune_host_memory() == ["x"]
    assert host_memory.tune_host_memory() == ["x"]
    assert calls == [1]


def test_the_trainer_tunes_its_process_and_logs_it(monkeypatch, tmp_path):
    from aiayn import ModelConfig, Transformer
    from aiayn.config import TrainConfig
    from aiayn.data.batching import TokenBatcher
    from aiayn.training import trainer as trainer_module
    from aiayn.training.tasks import TranslationTask
    from train_helpers import copy_pairs

    calls = []
    monkeypatch.setattr(trainer_module, "tune_host_memory", lambda: calls.append(1) or ["y z"])
    cfg = ModelConfig.tiny(vocab_size=13, d_model=32, n_heads=2, d_ff=64, n_layers=1, max_len=32)
    train = TrainConfig(
        max_tokens=256, max_steps=1, warmup=1, valid_every_steps=None,
        checkpoint_every_minutes=None,
    )  # fmt: skip
    data = TokenBatcher(copy_pairs(50, random.Random(0)), 256, 0, 1, 2)
    trainer = trainer_module.Trainer(
        Transformer(cfg), TranslationTask(cfg), train, data, tmp_path, progress=False
    )
    assert calls == [1]
    trainer.fit()
    assert "host memory: y z" in (tmp_path / "train.log").read_text()


JEMALLOC_INSTALLED = sys.platform.startswith("linux") and bool(ctypes.util.find_library("jemalloc"))


@pytest.fixture
def no_exec(monkeypatch):
    """A restart in this test process would run pytest again: any execve fails the test."""

    def refuse(*args):
        raise AssertionError(f"execve called: {args[1]}")

    monkeypatch.setattr(host_memory.os, "execve", refuse)


def test_only_the_aiayn_command_restarts(no_exec, monkeypatch):
    monkeypatch.delenv(OPT_OUT_ENV, raising=False)
    assert host_memory.restart_with_jemalloc() == "not started as the aiayn command"


@pytest.mark.parametrize("choice", ["default", "glibc", " GLIBC "])
def test_an_opted_out_command_does_not_restart(no_exec, monkeypatch, choice):
    monkeypatch.setattr(host_memory, "_started_as_aiayn", lambda: True)
    monkeypatch.setenv(OPT_OUT_ENV, choice)
    assert host_memory.restart_with_jemalloc() == f"{OPT_OUT_ENV}={choice.strip().lower()}"


def test_a_restarted_command_does_not_restart_again(no_exec, monkeypatch):
    monkeypatch.setattr(host_memory, "_started_as_aiayn", lambda: True)
    monkeypatch.delenv(OPT_OUT_ENV, raising=False)
    monkeypatch.setenv(host_memory.RESTARTED_ENV, "1")
    assert host_memory.restart_with_jemalloc() == "restarted once already"


def test_the_restart_keeps_the_command_and_the_users_preload(monkeypatch):
    execs = []
    monkeypatch.setattr(host_memory.os, "execve", lambda *args: execs.append(args))
    monkeypatch.setattr(host_memory, "_started_as_aiayn", lambda: True)
    monkeypatch.setattr(host_memory.ctypes.util, "find_library", lambda name: "libjemalloc.so.2")
    monkeypatch.setattr(host_memory, "jemalloc_loaded", lambda: False)
    monkeypatch.setattr(host_memory.sys, "platform", "linux")
    monkeypatch.setattr(host_memory.sys, "orig_argv", ["python", "-m", "aiayn", "train", "x"])
    monkeypatch.delenv(OPT_OUT_ENV, raising=False)
    monkeypatch.delenv(host_memory.RESTARTED_ENV, raising=False)
    monkeypatch.setenv("LD_PRELOAD", "libmine.so")
    with pytest.raises(AssertionError, match="unreachable"):  # the stub execve returns
        host_memory.restart_with_jemalloc()
    ((executable, argv, env),) = execs
    assert executable == sys.executable
    assert argv == ["python", "-m", "aiayn", "train", "x"]
    assert env["LD_PRELOAD"] == "libjemalloc.so.2 libmine.so"
    assert env[host_memory.RESTARTED_ENV] == "1"


def test_with_jemalloc_loaded_glibcs_malloc_is_left_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(host_memory, "keep_freed_memory", lambda: calls.append(1) or "")
    monkeypatch.setattr(host_memory, "jemalloc_loaded", lambda: True)
    applied = _apply({})
    assert applied[1] == "malloc: jemalloc (preloaded)"
    assert calls == []


def test_glibc_keeps_the_cache_and_the_malloc_setting(no_mallopt):
    environ = {OPT_OUT_ENV: "glibc"}
    applied = _apply(environ)
    assert environ[PRIMITIVE_CACHE_ENV] == str(PRIMITIVE_CACHE_CAPACITY)
    assert applied[1] == "malloc: (not called)"


# A process that is "the aiayn command" restarts itself once and finds jemalloc mapped in.
RESTART_CHECK = textwrap.dedent(
    """
    from aiayn.training import host_memory
    host_memory._started_as_aiayn = lambda: True
    reason = host_memory.restart_with_jemalloc()
    print(host_memory.jemalloc_loaded(), reason)
    """
)


@pytest.mark.skipif(not JEMALLOC_INSTALLED, reason="needs libjemalloc2 (make test installs it)")
def test_a_command_restarts_once_with_jemalloc(monkeypatch):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in (OPT_OUT_ENV, host_memory.RESTARTED_ENV, "LD_PRELOAD")
    }
    done = subprocess.run(
        [sys.executable, "-c", RESTART_CHECK], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "True jemalloc loaded\n"  # one restart, then loaded
    assert "True" not in subprocess.run(  # and without the restart, not loaded
        [sys.executable, "-c", "from aiayn.training import host_memory as h; print(h.jemalloc_loaded())"],
        capture_output=True, text=True, env=env, timeout=60,
    ).stdout  # fmt: skip


def test_a_misspelt_choice_is_refused_not_taken_as_tuning(no_exec, monkeypatch):
    with pytest.raises(ValueError, match="AIAYN_HOST_MEMORY='defaults': expected 'glibc'"):
        _apply({OPT_OUT_ENV: "defaults"})
    monkeypatch.setattr(host_memory, "_started_as_aiayn", lambda: True)
    monkeypatch.setenv(OPT_OUT_ENV, "jemalloc")
    with pytest.raises(ValueError, match="AIAYN_HOST_MEMORY='jemalloc'"):
        host_memory.restart_with_jemalloc()


def test_the_cli_says_a_misspelt_choice_in_one_line(tmp_path):
    env = {**os.environ, OPT_OUT_ENV: "defaults"}
    done = subprocess.run(
        [sys.executable, "-m", "aiayn", "train", "tiny-test", "--run", str(tmp_path / "run")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.startswith("aiayn: error: AIAYN_HOST_MEMORY='defaults': expected")
    assert len(done.stderr.splitlines()) == 1
    assert not (tmp_path / "run").exists()
