"""Two nodes simulated on one machine: two `torchrun --nnodes 2 --nproc-per-node 1` launches
meeting at a c10d rendezvous on 127.0.0.1 (gloo), training the tiny recipe.

- Their weights after 10 updates equal, bit for bit, those of one node running two
  processes (`torchrun --standalone --nproc-per-node 2`): same ranks, same global batch.
- One rank SIGKILLed right after the checkpoint of update 5 (tests/multinode_worker.py):
  with `--max-restarts 1` both nodes restart, every rank resumes from update 5, and the
  weights after update 10 are bit-identical to the uninterrupted run (a resume restores
  weights, optimizer, schedule, data position and each rank's RNG state). Without
  restarts both launches exit non-zero well within `LAUNCH_TIMEOUT`: the surviving rank's
  next collective fails at once on the closed connection; nothing is written after
  update 5.

Every launch sets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, as the docs' command does (docs/how-to/several-gpus.md):
without it torchrun's restarts can hang (see `aiayn.training.distributed`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aiayn.training import distributed
from train_helpers import RECIPE, make_corpus

TESTS = Path(__file__).resolve().parents[1]  # tests/, where the worker script is
SRC = TESTS.parent / "src"
LAUNCH_TIMEOUT = 180  # seconds for a whole launch (both nodes), restart included
STEPS, KILL_AFTER = 10, 5  # tiny-test.yaml checkpoints every 5 updates


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("multinode") / "corpus")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass(frozen=True)
class Launch:
    process: subprocess.Popen
    log: Path  # its stdout and stderr

    def output_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


def launch(
    launcher: list[str],
    corpus: Path,
    run_dir: Path,
    log: Path,
    extra_env: dict[str, str] | None = None,
) -> Launch:
    """One torchrun (one node) running `aiayn train` through tests/multinode_worker.py."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # restarts need it: see aiayn.training.distributed
        **(extra_env or {}),
    }
    command = [
        sys.executable, "-m", "torch.distributed.run", *launcher, "--monitor-interval", "0.5",
        str(TESTS / "multinode_worker.py"), "train", str(RECIPE), f"data.corpus={corpus}",
        f"train.max_steps={STEPS}", "train.valid_bleu_sentences=0",
        "--run-dir", str(run_dir), "--device", "cpu", "--no-progress",
    ]  # fmt: skip
    with log.open("w", encoding="utf-8") as output:  # a file: a pipe could fill up and block
        process = subprocess.Popen(
            command, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Launch(process, log)


def wait_all(launches: list[Launch]) -> list[tuple[int, str]]:
    """Each launch's exit code and output; past `LAUNCH_TIMEOUT`, kill them all and fail."""
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    try:
        for launched in launches:
            launched.process.wait(timeout=max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
        for launched in launches:
            if launched.process.poll() is None:
                os.killpg(launched.process.pid, signal.SIGKILL)
                launched.process.wait()
        tails = [launched.output_text()[-3000:] for launched in launches]
        pytest.fail(f"still running after {LAUNCH_TIMEOUT} s, killed:\n" + "\n=====\n".join(tails))
    return [(launched.process.returncode, launched.output_text()) for launched in launches]


def two_nodes(
    corpus: Path, run_dir: Path, max_restarts: int, extra_env: dict[str, str] | None = None
) -> list[tuple[int, str]]:
    port = free_port()
    launcher = [
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_dir.name,
        "--max-restarts", str(max_restarts),
    ]  # fmt: skip
    logs = [run_dir.parent / f"{run_dir.name}-node-{node}.log" for node in (1, 2)]
    return wait_all([launch(launcher, corpus, run_dir, log, extra_env) for log in logs])


def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run_dir / f"checkpoints/step-{step:08d}/model.safetensors")


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    differ = [name for name in a if not torch.equal(a[name], b[name])]
    assert not differ, f"{len(differ)} of {len(a)} tensors differ: {differ[:3]}"


@pytest.fixture(scope="module")
def one_node(corpus, tmp_path_factory) -> Path:
    """The reference: one node, two processes, uninterrupted."""
    run_dir = tmp_path_factory.mktemp("one-node") / "run"
    launcher = ["--standalone", "--nproc-per-node", "2"]
    ((code, output),) = wait_all([launch(launcher, corpus, run_dir, run_dir.parent / "log")])
    assert code == 0, output
    return run_dir


def kill_rank_one(events: Path) -> dict[str, str]:
    return {
        "AIAYN_TEST_KILL_RANK": "1",
        "AIAYN_TEST_KILL_AFTER_STEP": str(KILL_AFTER),
        "AIAYN_TEST_EVENTS": str(events),
    }


def read_events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.slow
def test_two_nodes_equal_one_node_with_two_processes(corpus, one_node, tmp_path):
    run_dir = tmp_path / "two-nodes"
    for code, output in two_nodes(corpus, run_dir, max_restarts=0):
        assert code == 0, output
    assert_identical(weights(run_dir, STEPS), weights(one_node, STEPS))


@pytest.mark.slow
def test_a_killed_rank_restarts_and_resumes_with_nothing_lost(corpus, one_node, tmp_path):
    run_dir, events = tmp_path / "restarted", tmp_path / "events.jsonl"
    for code, output in two_nodes(corpus, run_dir, 1, kill_rank_one(events)):
        assert code == 0, output
    happened = read_events(events)
    assert {"attempt": 0, "rank": 1, "killed_after": KILL_AFTER} in happened
    starts = [(e["rank"], e["resumed_at"]) for e in happened if "resumed_at" in e]
    assert sorted(starts) == [(0, 0), (0, KILL_AFTER), (1, 0), (1, KILL_AFTER)]
    assert_identical(weights(run_dir, STEPS), weights(one_node, STEPS))


@pytest.mark.slow
def test_a_killed_rank_without_restarts_fails_both_nodes_cleanly(corpus, one_node, tmp_path):
    run_dir, events = tmp_path / "failed", tmp_path / "events.jsonl"
    results = two_nodes(corpus, run_dir, 0, kill_rank_one(events))  # bounded by LAUNCH_TIMEOUT
    assert all(code != 0 for code, _ in results), results
    assert {"attempt": 0, "rank": 1, "killed_after": KILL_AFTER} in read_events(events)
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step-*")) == [
        f"step-{KILL_AFTER:08d}"
    ]
    assert_identical(weights(run_dir, KILL_AFTER), weights(one_node, KILL_AFTER))  # intact


def test_warns_of_restarts_with_the_shared_rendezvous_store(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    assert distributed.restarts_share_the_rendezvous_store()
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    assert not distributed.restarts_share_the_rendezvous_store()
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")  # TORCH_DISABLE_SHARE_..=1
    assert not distributed.restarts_share_the_rendezvous_store()
