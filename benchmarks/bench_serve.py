"""`aiayn serve` under load: dynamic batching against one sentence at a time.

    python -m benchmarks.bench_serve --run RUN [--seconds 20]

Two servers run the same model on loopback, one batching (the defaults of `aiayn
serve`, but `--max-wait-ms`; or with `--continuous N`, `aiayn serve --continuous N`:
N sentences decoded at once, each joining and leaving at a step boundary) and one not (`--max-batch 1`: each sentence decoded alone, in arrival
order). For 1, 4, 16 and 64 concurrent clients the servers take turns, `--rounds`
slices of each cell in alternation, so that both see the same machine load. Each
client sends one sentence per request (beam `--beam`), waits for the answer, then
pauses for an exponentially distributed time (`--think-ms` on average: Poisson
arrivals per client) and sends the next. The sentences are the run's test split
(its recipe's prepared corpus), or `--sentences FILE`, drawn at random, seeded.

Reported per cell: sentences/s answered, latency percentiles (request sent to
answer received), the mean batch size (from the server's /metrics) and requests
refused with 429. The ratio column is batching's sentences/s over one-at-a-time's
at the same number of clients.

With `--offline`, the scheduling limit too (issue 44's goal: a server under load within
90% of it): every sentence once through `aiayn translate` at the same beam and threads,
in sorted batches and through the engine (`--continuous 32`), each timed start to exit
less the same command's time for one sentence (start and loading), the median of
`--rounds`; reported as "offline" cells, the best of the two beside the servers'.
Writes benchmarks/results/serve.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks import common


def test_sentences(run: Path) -> list[str]:
    """Source sentences of the test split of the corpus named by RUN/config.yaml."""
    from aiayn.data.files import read_lines

    return [line for line in read_lines(common.test_files(run)[0]) if line.strip()]


class ServerProcess:
    """`aiayn serve RUN --port P OPTIONS` in a subprocess, with `threads` torch threads."""

    def __init__(self, run: Path, options: list[str], threads: int) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "aiayn", "serve", str(run), "--port", str(self.port)]
        command += ["--no-access-log", "--threads", str(threads), *options]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        # float32 unless the system's options say otherwise (--dtype): settings fixed before
        # the run, not `--dtype auto`'s timing (issue 41), which may pick bf16 run to run
        env.setdefault("AIAYN_DTYPE", "float32")
        self.process = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
        limit = time.monotonic() + 120
        while time.monotonic() < limit:
            if self.process.poll() is not None:
                raise RuntimeError(f"{' '.join(command)} exited with {self.process.returncode}")
            try:
                if httpx.get(f"{self.url}/ready", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        raise RuntimeError(f"{' '.join(command)} did not become ready")

    def batches(self) -> tuple[float, float]:
        """(sentences decoded, batches run) so far."""
        text = httpx.get(f"{self.url}/metrics", timeout=30).text

        def value(name: str) -> float:
            return float(re.search(rf"^{name} (\S+)$", text, re.MULTILINE).group(1))

        return value("aiayn_batch_size_sum"), value("aiayn_batch_size_count")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


@dataclass
class Tally:
    """What the clients of one cell saw, summed over its rounds."""

    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0
    refused: int = 0
    failed: int = 0
    decoded: float = 0.0  # from the server's /metrics
    batches: float = 0.0

    def summary(self) -> dict[str, float]:
        cuts = statistics.quantiles(self.latencies, n=100, method="inclusive")
        return {
            "sentences_per_s": len(self.latencies) / self.seconds,
            "answered": len(self.latencies),
            "p50_ms": 1000 * cuts[49],
            "p95_ms": 1000 * cuts[94],
            "p99_ms": 1000 * cuts[98],
            "mean_batch": self.decoded / max(self.batches, 1),
            "refused_429": self.refused,
            "failed": self.failed,
        }


async def drive(
    url: str,
    sentences: list[str],
    clients: int,
    seconds: float,
    args,
    round_seed: int,
    tally: Tally,
) -> None:
    """`clients` closed-loop clients for `seconds`, counted into `tally`."""
    stop_at = time.monotonic() + seconds
    think = args.think_ms / 1000

    async def client(index: int, http: httpx.AsyncClient) -> None:
        rng = random.Random(round_seed * 1000 + index)
        await asyncio.sleep(rng.expovariate(1 / think))  # clients do not start in step
        while time.monotonic() < stop_at:
            sent = time.monotonic()
            body = {"text": rng.choice(sentences), "beam": args.beam}
            reply = await http.post("/v1/translate", json=body)
            if reply.status_code == 200:
                tally.latencies.append(time.monotonic() - sent)
            elif reply.status_code == 429:
                tally.refused += 1
            else:
                tally.failed += 1
            await asyncio.sleep(rng.expovariate(1 / think))

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        started = time.monotonic()
        await asyncio.gather(*(client(i, http) for i in range(clients)))
        tally.seconds += time.monotonic() - started


def measure(servers: dict[str, ServerProcess], sentences: list[str], n: int, args) -> dict:
    """One cell per server at `n` clients, the servers taking turns round by round."""
    tallies = {mode: Tally() for mode in servers}
    for round_index in range(args.rounds):
        for mode, server in servers.items():
            before = server.batches()
            seconds = args.seconds / args.rounds
            asyncio.run(drive(server.url, sentences, n, seconds, args, round_index, tallies[mode]))
            after = server.batches()
            tallies[mode].decoded += after[0] - before[0]
            tallies[mode].batches += after[1] - before[1]
    return {mode: tally.summary() for mode, tally in tallies.items()}


OFFLINE = {
    "offline, sorted batches": ["--continuous", "0"],
    "offline, continuous 32": ["--continuous", "32"],
}


def offline_seconds(run: Path, lines: list[str], options: list[str], args, tmp: Path) -> float:
    """Seconds `aiayn translate` takes for `lines` (beam, threads and float32 as the
    servers), start to exit."""
    source, out = tmp / "source.txt", tmp / "out.txt"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    env.setdefault("AIAYN_DTYPE", "float32")
    return common.time_translate(run, source, out, ["--beam", str(args.beam), *options], env)


def offline_cells(run: Path, sentences: list[str], args) -> list[dict]:
    """The scheduling limit: each sentence once, offline, per decoder (see the module)."""
    import tempfile

    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, options in OFFLINE.items():
            rates = []
            for _ in range(args.rounds):
                whole = offline_seconds(run, sentences, options, args, Path(tmp))
                one = offline_seconds(run, sentences[:1], options, args, Path(tmp))
                rates.append(common.decoding_rate(len(sentences), whole, one))
            cells.append(
                dict(server=name, clients=0, sentences_per_s=statistics.median(rates), speedup=None)
            )
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="the model to serve")
    parser.add_argument("--sentences", type=Path, help="source sentences, one per line")
    parser.add_argument("--clients", default="1,4,16,64")
    parser.add_argument("--seconds", type=float, default=20.0, help="per cell and server")
    parser.add_argument("--rounds", type=int, default=4, help="turns per cell")
    parser.add_argument("--think-ms", type=float, default=20.0, help="mean pause per client")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each server")
    parser.add_argument("--beam", type=int, default=4, help="beam width of every request")
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help="the batching server's")
    parser.add_argument(
        "--continuous",
        type=int,
        metavar="N",
        help="the batching server batches continuously, N sentences at once",
    )
    parser.add_argument("--results", default="serve", help="results file name")
    parser.add_argument(
        "--offline", action="store_true", help="also the same sentences offline (see above)"
    )
    args = parser.parse_args()

    if args.sentences is not None:
        from aiayn.data.files import read_lines

        sentences = [line for line in read_lines(args.sentences) if line.strip()]
    else:
        sentences = test_sentences(args.run)
    batching = (
        ["--continuous", str(args.continuous)]
        if args.continuous
        else ["--max-wait-ms", str(args.max_wait_ms)]
    )
    modes = {
        "batching": batching,
        "one at a time": ["--max-batch", "1"],
    }
    servers = {
        mode: ServerProcess(args.run, options, args.threads) for mode, options in modes.items()
    }
    rows, cells = [], []
    try:
        for server in servers.values():  # warm up: the first batches pay for allocation
            asyncio.run(drive(server.url, sentences, 4, 3.0, args, -1, Tally()))
        for n in (int(c) for c in args.clients.split(",")):
            by_mode = measure(servers, sentences, n, args)
            speedup = (
                by_mode["batching"]["sentences_per_s"] / by_mode["one at a time"]["sentences_per_s"]
            )
            for mode, cell in by_mode.items():
                cell.update(clients=n, server=mode, speedup=speedup if mode == "batching" else 1.0)
                print(cell, file=sys.stderr)
                cells.append(cell)
                rows.append(
                    [n, mode, cell["sentences_per_s"], cell["p50_ms"], cell["p95_ms"],
                     cell["p99_ms"], cell["mean_batch"], cell["refused_429"],
                     f"{cell['speedup']:.2f}x"]
                )  # fmt: skip
    finally:
        for server in servers.values():
            server.stop()
    if args.offline:  # after the servers have exited: one process at a time
        for cell in offline_cells(args.run, sentences, args):
            print(cell, file=sys.stderr)
            cells.append(cell)
            rows.append([0, cell["server"], cell["sentences_per_s"], *[""] * 6])

    headers = ["clients", "server", "sentences/s", "p50 ms", "p95 ms", "p99 ms", "mean batch",
               "429s", "vs one at a time"]  # fmt: skip
    print(common.table(headers, rows))
    path = common.write_json(
        args.results,
        {
            "measures": [
                {
                    "system": "the batching server against one sentence at a time, "
                    + (
                        f"the engine (--continuous {args.continuous})"
                        if args.continuous
                        else f"dynamic batcher (--max-wait-ms {args.max_wait_ms:g})"
                    )
                    + (", and the same sentences offline" if args.offline else ""),
                    "cell": f"{args.run}, beam {args.beam}, {args.clients} clients, "
                    f"{args.threads} torch thread(s), {common.machine()}",
                    "harness": "bench_serve",
                }
            ],
            "run": str(args.run),
            "sentences": str(args.sentences) if args.sentences else "test split of the run",
            "seconds_per_cell": args.seconds,
            "rounds": args.rounds,
            "think_ms": args.think_ms,
            "beam": args.beam,
            "max_wait_ms": args.max_wait_ms,
            "continuous": args.continuous,
            "threads": args.threads,
            "cells": cells,
        },
    )
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
