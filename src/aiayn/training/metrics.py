"""What a training run reports: metrics.jsonl, TensorBoard, train.log and the progress bar.

    RUN/metrics.jsonl    one JSON object per line: {"kind": "train" | "valid" |
                         "non_finite", "step": N, "time": UNIX SECONDS, ...values}
    RUN/tb/              the same values as TensorBoard scalars "KIND/NAME"
                         (when tensorboard is installed)
    RUN/train.log        the library's log lines

Only the writing process (rank 0) has files; elsewhere `MetricsLog` writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tqdm.auto import tqdm

from aiayn.data.files import strict_json

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
LOG_FILE = "train.log"
BOARD_DIR = "tb"


def validation_records(run_dir: str | Path) -> list[dict] | None:
    """The "valid" records of RUN/metrics.jsonl in the order written, or None without the file."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return None
    records = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return [record for record in records if record.get("kind") == "valid"]


class Window:
    """Training statistics summed since the last log line.

    `started` is when the window began; the loop moves it forward by the time
    spent validating and saving, so tokens per second count training alone.
    """

    def __init__(self) -> None:
        self.loss = self.nll = self.tokens = 0.0
        self.updates = 0
        self.lr = 0.0
        self.started = time.monotonic()

    def add(self, stats: dict[str, float]) -> None:
        """Add one update's summed loss, nll and target tokens, and its learning rate."""
        self.loss += stats["loss"]
        self.nll += stats["nll"]
        self.tokens += stats["tokens"]
        self.updates += 1
        self.lr = stats["lr"]

    def flush(self) -> dict[str, float]:
        """Per-token means, perplexity and throughput of the window; then start a new one."""
        seconds = max(time.monotonic() - self.started, 1e-9)
        out = {
            "loss": self.loss / self.tokens,
            "nll": self.nll / self.tokens,
            "ppl": math.exp(min(self.nll / self.tokens, 50.0)),
            "lr": self.lr,
            "tgt_tokens_per_s": self.tokens / seconds,
            "tokens_per_update": self.tokens / self.updates,
        }
        self.__init__()
        return out


class MetricsLog:
    """RUN/metrics.jsonl (appended; a resumed run repeats the steps after its checkpoint)
    and TensorBoard scalars in RUN/tb when tensorboard is installed.

    Args:
        run_dir: the run directory.
        step: the update the run starts from (TensorBoard drops later events of an
            earlier attempt).
        enabled: False on the processes that do not write (then `write` does nothing).
    """

    _warned = False

    def __init__(self, run_dir: Path, step: int, enabled: bool = True) -> None:
        self.file = self.board = None
        if not enabled:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        self.file = open(run_dir / METRICS_FILE, "a", encoding="utf-8")  # noqa: SIM115
        try:
            from torch.utils.tensorboard import SummaryWriter

            purge = step + 1 if step else None
            self.board = SummaryWriter(str(run_dir / BOARD_DIR), purge_step=purge)
        except ImportError:
            if not MetricsLog._warned:
                log.warning(
                    "tensorboard is not installed: no TensorBoard events (pip install tensorboard)"
                )
                MetricsLog._warned = True

    def write(self, kind: str, step: int, values: dict[str, float]) -> None:
        """One metrics.jsonl line, and one TensorBoard scalar per value."""
        if self.file is None:
            return
        record = {"kind": kind, "step": step, "time": time.time(), **values}
        self.file.write(strict_json(record, indent=None))  # a NaN loss as null
        self.file.flush()
        if self.board is not None:
            for name, value in values.items():
                self.board.add_scalar(f"{kind}/{name}", value, step)

    def close(self) -> None:
        """Close the files (idempotent)."""
        if self.file is not None:
            self.file.close()
        if self.board is not None:
            self.board.close()
        self.file = self.board = None

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class ProgressBar:
    """The loop's tqdm bar: one tick per update, then its loss, lr, tokens/s and ETA.

    Args:
        total: the update the run stops at, if known (max_steps).
        initial: the update the run (or resume) starts from.
        enabled: show it (rank 0, when asked for).
    """

    def __init__(self, total: int | None, initial: int, enabled: bool) -> None:
        self.initial, self.enabled, self.started = initial, enabled, time.monotonic()
        self.bar = tqdm(
            total=total, initial=initial, unit="step", disable=not enabled, dynamic_ncols=True
        )

    def advance(
        self, step: int, stats: dict[str, float], seconds_left: Callable[[float], float]
    ) -> None:
        """One update made; `seconds_left(seconds_per_update)` estimates the rest."""
        self.bar.update(1)
        if self.enabled:
            per_update = (time.monotonic() - self.started) / max(step - self.initial, 1)
            postfix = progress_postfix(stats, per_update, seconds_left(per_update))
            self.bar.set_postfix_str(postfix, refresh=False)

    def close(self) -> None:
        """Leave the bar as it is on the terminal."""
        self.bar.close()


@contextlib.contextmanager
def log_to_file(run_dir: Path, enabled: bool = True) -> Iterator[None]:
    """The library's log lines (INFO and above) also go to RUN/train.log, while inside."""
    if not enabled:
        yield
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(run_dir / LOG_FILE, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    handler.setLevel(logging.INFO)
    package = logging.getLogger("aiayn")
    level = package.level
    package.addHandler(handler)
    if package.getEffectiveLevel() > logging.INFO:
        package.setLevel(logging.INFO)
    try:
        yield
    finally:
        package.removeHandler(handler)
        package.setLevel(level)
        handler.close()


def train_line(step: int, metrics: dict[str, float]) -> str:
    """The log line of a `Window.flush()` plus 'epoch'."""
    return (
        f"update {step}: loss {metrics['loss']:.4f}, lr {metrics['lr']:.3g}, "
        f"{metrics['tgt_tokens_per_s']:.0f} tgt tok/s, epoch {metrics['epoch']:.2f}"
    )


def valid_line(step: int, metrics: dict[str, float]) -> str:
    """The log line of a validation: loss, perplexity and BLEU when there is one."""
    bleu = f", BLEU {metrics['bleu']:.2f}" if "bleu" in metrics else ""
    return f"valid at update {step}: loss {metrics['loss']:.4f}, ppl {metrics['ppl']:.2f}{bleu}"


def progress_postfix(stats: dict[str, float], seconds_per_update: float, eta: float) -> str:
    """The progress bar's text after one update: its loss, lr, throughput and the ETA."""
    return (
        f"loss {stats['loss'] / stats['tokens']:.3f} lr {stats['lr']:.2e} "
        f"tok/s {stats['tokens'] / seconds_per_update:,.0f} eta {format_duration(eta)}"
    )


def format_duration(seconds: float) -> str:
    """Seconds as H:MM:SS (hours unbounded)."""
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
