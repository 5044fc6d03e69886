"""The main job in one call: prepare the Bible, train, average, evaluate, show, plot.

`aiayn quickstart` (and `make demo`) runs `run_quickstart`. Everything lands in one
directory:

    OUT/data/         the prepared corpus (English -> Spanish Bible, subword model)
    OUT/run/          the training run (config.yaml, checkpoints, metrics, TensorBoard)
    OUT/eval/         test-set hypotheses.txt and scores.json
    OUT/attention/    encoder.png, decoder.png, cross.png for one test sentence
    OUT/results.json  the headline figures (BLEU, chrF, seed, device, ...), the
                      run's `budget` (steps, epochs, tokens/s, FLOPs, % of peak:
                      `aiayn.training.budget`), and the precision of training and of the
                      test translation, with the timed ratios that chose them

A second call with the same OUT reuses the corpus and resumes training: the time
budget counts the run's total training time, so `--minutes 30` after a 15-minute
run trains 15 minutes more, and the same budget again only re-evaluates. A run
resumes with the seed it started with: another `--seed` needs another OUT.

Next to BLEU it prints the reference: the median and range of BLEU over the seeds
recorded for this recipe and budget, scored with the same beam, alpha and weights rule
(`configs/quickstart-reference.json`, written by the release step
`python -m benchmarks.release` from `benchmarks/results/quickstart-*.json`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shlex
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from aiayn.analysis.viz import plot_translation_attention
from aiayn.apps.translate import Translator
from aiayn.config import check_seed
from aiayn.config.devices import cpu_model, machine, usable_device
from aiayn.config.recipes import find_recipe, recipes_dir
from aiayn.data.batching import TokenBatcher
from aiayn.data.corpus import CORPUS_FILE, PreparedCorpus
from aiayn.data.files import strict_json, write_atomic
from aiayn.data.prepare import BIBLE_VOCAB_SIZE, PrepareConfig, prepare_bible
from aiayn.data.tokenizer import TOKENIZER_FILE
from aiayn.io.checkpoint import (
    BEST_DIR,
    WEIGHTS_FILE,
    average_last,
    latest_checkpoint,
    step_checkpoints,
    step_of,
)
from aiayn.training.budget import budget_line, training_budget
from aiayn.training.distributed import DistEnv
from aiayn.training.evaluate import score, write_report
from aiayn.training.precision import auto_choice, choice_line
from aiayn.training.recipe import CONFIG_FILE, load_recipe
from aiayn.training.tasks import build_task
from aiayn.training.trainer import TrainResult, train_from_recipe

log = logging.getLogger(__name__)

RESULTS_FILE = "results.json"
CPU_RECIPE = "bible-en-es-cpu.yaml"
GPU_RECIPE = "bible-en-es-gpu.yaml"
REFERENCE_FILE = "quickstart-reference.json"


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
            `aiayn/config/recipes/bible-en-es-{cpu,gpu}.yaml`.
        overrides: extra `section.key=value` settings for the recipe.
        vocab_size: the shared subword vocabulary of the prepared corpus.
        average_last: average this many of the last checkpoints; 1 (the default)
            averages nothing and scores the lowest-validation-loss checkpoint
            (`evaluated_weights`). The recipe's rate decays to zero at the end of the
            budget, where training validates once more, and there the last checkpoint
            scored higher on the valid split than the average of the last 3 in all 4
            runs measured (the recipe's header). Averaging helps under the paper's
            schedule.
        beam, alpha: beam search on the test set: beam 8 and length penalty alpha
            1.0, chosen on the valid split over the recipe's three seeds (median
            valid BLEU 28.95, against 28.48 for beam 4 and alpha 1.0 and 28.23 for
            the paper's beam 4 and alpha 0.6; docs/explanation/results/quickstart.md).
        test_pairs: score only the first N test pairs (None: all of them).
        samples: sample translations to show.
        seed: the training seed (`train.seed`: initialisation, data order,
            dropout); None keeps the recipe's. A run resumes only with its own seed.
    """

    out: Path = Path("quickstart")
    minutes: float = 15.0
    device: str = field(default_factory=default_device)
    recipe: Path | None = None
    overrides: tuple[str, ...] = ()
    vocab_size: int = BIBLE_VOCAB_SIZE
    average_last: int = 1
    beam: int = 8
    alpha: float = 1.0
    test_pairs: int | None = None
    samples: int = 5
    seed: int | None = None

    def __post_init__(self) -> None:
        seeded = [o for o in self.overrides if o.startswith("train.seed=")]
        if self.seed is not None and seeded:
            raise ValueError(
                f"seed {self.seed} and the override {seeded[0]!r} both set train.seed; "
                "give one of them"
            )
        if not 0 < self.minutes < math.inf:  # nan too
            raise ValueError(f"minutes must be a positive finite number, got {self.minutes}")
        if self.seed is not None:
            check_seed(self.seed, "seed")
        if self.average_last < 1:
            raise ValueError(f"average_last must be at least 1, got {self.average_last}")
        if self.test_pairs is not None and self.test_pairs < 1:
            raise ValueError(f"test_pairs must be at least 1, got {self.test_pairs}")
        usable_device(self.device, "device")

    def recipe_overrides(self, corpus: Path) -> list[str]:
        """The `section.key=value` settings the quickstart puts on its recipe."""
        seed = [f"train.seed={self.seed}"] if self.seed is not None else []
        return [
            f"data.corpus={corpus.resolve()}",
            f"train.max_minutes={self.minutes}",
            *seed,
            *self.overrides,
        ]


def prepared_bible(directory: Path, vocab_size: int, echo: Callable[[str], None]) -> PreparedCorpus:
    """The Bible corpus in `directory`, prepared unless it already is (with this vocabulary)."""
    if (directory / CORPUS_FILE).is_file():
        corpus = PreparedCorpus.load(directory)
        if corpus.stats.get("vocab_size") == vocab_size:
            echo(f"corpus: reusing {directory}")
            return corpus
        echo(f"corpus: {directory} has another vocabulary size; preparing it again")
    echo("corpus: preparing the Bible, English (World English Bible) -> Spanish (RV 1909) ...")
    corpus = prepare_bible(directory, config=PrepareConfig(vocab_size=vocab_size), force=True)
    splits = corpus.stats["splits"]
    echo(
        "corpus: "
        + ", ".join(f"{name} {splits[name]['pairs']:,} pairs" for name in splits)
        + f", {vocab_size:,} shared subwords"
    )
    return corpus


def evaluated_weights(run_dir: Path, k: int, echo: Callable[[str], None]) -> tuple[Path, str]:
    """The weights the quickstart scores, and the rule that picked them.

    With `k` >= 2 (and at least 2 step checkpoints): the average of the last `k` (fewer
    if fewer exist), rule "average-last-K". Otherwise RUN/checkpoints/best, the lowest
    validation loss, rule "best"; the newest step checkpoint, rule "last", where no
    validation ran. With `k` = 1 it never takes an average, not even one that
    `aiayn average` left current (which `resolve_weights` would prefer).

    Training validates once more at its last update (`Trainer._finish`), so "best" is
    the last checkpoint whenever the validation loss still falls at the end, as it
    does when the rate decays to zero there; the line echoed says which update it is.
    """
    steps = step_checkpoints(run_dir)
    if k >= 2 and len(steps) >= 2:
        k = min(k, len(steps))
        path = average_last(run_dir, k)
        echo(f"averaged the last {k} checkpoints -> {path}")
        return path, f"average-last-{k}"
    best = run_dir / "checkpoints" / BEST_DIR
    if (best / WEIGHTS_FILE).is_file():
        step = _best_step(best)
        newest = step_of(steps[-1]) if steps else None
        at = f"update {step:,}" if step is not None else "an unrecorded update"
        last = f"; the last update is {newest:,}" if newest is not None else ""
        echo(f"weights: {best} (the lowest validation loss, at {at}{last})")
        return best / WEIGHTS_FILE, "best"
    if not steps:
        raise FileNotFoundError(f"{run_dir} holds no checkpoint to evaluate")
    echo(f"weights: {steps[-1]} (the last checkpoint: no validation ran)")
    return steps[-1] / WEIGHTS_FILE, "last"


def _best_step(best_dir: Path) -> int | None:
    """The update RUN/checkpoints/best was saved at (its info.json), None if unrecorded."""
    try:
        return int(json.loads((best_dir / "info.json").read_text(encoding="utf-8"))["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


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
        ValueError: the recipe or an override is invalid, or OUT holds a run of
            another seed.
    """
    out = config.out
    recipe = find_recipe(config.recipe) if config.recipe else default_recipe(config.device)
    if not Path(recipe).is_file():
        raise FileNotFoundError(f"training recipe not found: {recipe}")
    out.mkdir(parents=True, exist_ok=True)

    corpus = prepared_bible(out / "data", config.vocab_size, echo)

    overrides = config.recipe_overrides(corpus.root)
    loaded = load_recipe(recipe, overrides)
    seed = loaded.train.seed
    check_same_seed(out / "run", seed)
    echo(
        f"train: {recipe.name if isinstance(recipe, Path) else recipe} on {config.device}, "
        f"seed {seed}, {config.minutes:g} minutes in all (a second run resumes)"
    )
    trained = train_from_recipe(recipe, out / "run", overrides, device=config.device)
    echo(
        f"train: {trained.steps:,} steps, {trained.epochs:.2f} epochs, "
        f"{trained.train_minutes:.1f} minutes (stopped: {trained.stopped})"
    )
    precision = auto_choice(loaded.train.precision, torch.device(config.device))
    echo(choice_line(precision))
    budget = run_budget(recipe, overrides, corpus, trained, config.device)
    if budget is not None:
        echo(budget_line(budget))

    weights, weights_rule = evaluated_weights(trained.run_dir, config.average_last, echo)
    translator = Translator.load(
        weights, device=config.device, tokenizer=trained.run_dir / TOKENIZER_FILE
    )
    pairs = corpus.read("test")[: config.test_pairs]
    sources = [s for s, _ in pairs]
    references = [t for _, t in pairs]
    decoding = translator.choose_precision(translator.encode(sources), config.beam)
    echo(decoding.line())
    echo(f"test: translating {len(pairs)} held-out verses with beam {config.beam} ...")
    started = time.perf_counter()
    hypotheses = translator.translate(sources, beam=config.beam, alpha=config.alpha, progress=True)
    translate_seconds = time.perf_counter() - started
    scores = score(hypotheses, references)
    scores_path = write_report(scores, hypotheses, out / "eval")

    echo("")
    echo(scores.summary())
    scoring = Scoring(config.beam, config.alpha, weights_rule)
    here = this_machine(config.device)
    recorded = (recipe, config.minutes, config.device, scoring, config.overrides, here)
    echo(reference_line(*recorded))
    reference = recorded_reference(*recorded)
    elsewhere = other_machine_line(reference, here, decoding.chosen)
    if elsewhere is not None:
        echo(elsewhere)
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
        "minutes": config.minutes,
        "train_minutes": round(trained.train_minutes, 2),
        "stopped": trained.stopped,
        "seed": seed,
        "device": config.device,
        "device_name": _device_name(config.device),
        "machine": here,
        "reference_machine": None if reference is None else reference.get("machine"),
        "test_pairs": len(pairs),
        "average_last": config.average_last,
        "beam": config.beam,
        "alpha": config.alpha,
        "translate_seconds": round(translate_seconds, 1),
        "parameters": translator.model.num_parameters(),
        "vocab_size": config.vocab_size,
        "recipe": str(recipe),
        "recipe_sha256": recipe_digest(recipe),
        "overrides": list(config.overrides),
        "weights": str(weights),
        "weights_rule": weights_rule,
        "attention_sentence": sentence,
        "samples": samples,
        "precision": precision,
        "decode_precision": decoding.record(),
        "budget": budget,
        "date": time.strftime("%Y-%m-%d"),
    }
    results_path = out / RESULTS_FILE
    write_atomic(results_path, strict_json(results, ensure_ascii=False))

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


def check_same_seed(run_dir: Path, seed: int) -> None:
    """Refuse to resume a run that started with another seed (before any work is done).

    Raises:
        ValueError: naming both seeds and the fix.
    """
    config = run_dir / CONFIG_FILE
    if latest_checkpoint(run_dir) is None or not config.is_file():
        return  # nothing to resume: any seed starts the run
    started = (yaml.safe_load(config.read_text(encoding="utf-8")) or {}).get("train", {})
    if started.get("seed", seed) != seed:
        raise ValueError(
            f"{run_dir} was trained with seed {started['seed']}, not {seed}: a run resumes "
            f"with its own seed (--seed {started['seed']}); give another --out for another seed"
        )


def run_budget(
    recipe: str | Path,
    overrides: list[str],
    corpus: PreparedCorpus,
    trained: TrainResult,
    device: str,
) -> dict[str, object] | None:
    """The run's `aiayn.training.budget.training_budget`; None (logged) where it is not counted.

    The training batches are cut again from the corpus (a second or so on the Bible)
    to count the tokens and FLOPs of exactly those the run read.
    """
    loaded = load_recipe(recipe, overrides)
    tokenizer = corpus.tokenizer()
    cfg = loaded.model_config(
        tokenizer.vocab_size, tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
    )
    data = build_task(loaded.task, cfg, loaded.task_options).build_data(
        corpus, tokenizer, loaded.train, DistEnv()
    )
    if not isinstance(data.train, TokenBatcher):
        log.info("no budget: task %s does not batch pairs", loaded.task)
        return None
    try:
        return training_budget(
            cfg, data.train, trained.steps, trained.epochs, trained.train_minutes, device
        )
    except ValueError as err:
        log.info("no budget: %s", err)
        return None


def recipe_digest(recipe: str | Path) -> str | None:
    """The first 12 hex digits of the recipe file's SHA-256 (None when it is not a file):
    which version of a recipe a recorded run trained, as the file changes over time."""
    path = Path(recipe)
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12] if path.is_file() else None


def reference_file() -> Path:
    """The packaged reference figures (see `reference_line`)."""
    return recipes_dir() / REFERENCE_FILE


@dataclass(frozen=True)
class Scoring:
    """What a quickstart's test score depends on besides the training: the beam, the
    length penalty alpha, and the rule that picked the weights (`evaluated_weights`:
    "best", "last" or "average-last-K"). Runs are compared only when these are equal."""

    beam: int
    alpha: float
    weights: str

    def describe(self) -> str:
        return f"beam {self.beam}, alpha {self.alpha:g}, weights {self.weights}"


def recorded_reference(
    recipe: str | Path,
    minutes: float,
    device: str,
    scoring: Scoring,
    overrides: tuple[str, ...] = (),
    machine: str | None = None,
) -> dict | None:
    """The recorded runs this quickstart compares with, or None where none are recorded.

    From `configs/quickstart-reference.json`: the entry of the same recipe, minutes, device
    kind, overrides (`--set`, the seed's excepted) and `scoring` (beam, alpha, weights
    rule); of those, the one recorded on `machine` (`this_machine`'s name) where there is
    one, else the first. Runs of another version of the recipe file (`recipe_digest`,
    where both are known), and entries that do not record their scoring, do not count.
    """
    name, kind = Path(recipe).name, device.split(":")[0]
    wanted = [o for o in overrides if not o.startswith("train.seed=")]
    digest = recipe_digest(recipe)
    path = reference_file()
    entries = json.loads(path.read_text(encoding="utf-8"))["references"] if path.is_file() else []
    matching = []
    for entry in entries:
        same_run = (entry["recipe"], entry["minutes"], entry["device"]) == (name, minutes, kind)
        recorded = entry.get("recipe_sha256")
        same_version = digest is None or recorded is None or recorded == digest
        scored = (entry.get("beam"), entry.get("alpha"), entry.get("weights"))
        same_scoring = scored == (scoring.beam, scoring.alpha, scoring.weights)
        if same_run and same_version and same_scoring and entry.get("overrides", []) == wanted:
            matching.append(entry)
    here = [entry for entry in matching if entry.get("machine") == machine]
    return (here or matching or [None])[0]


def reference_line(
    recipe: str | Path,
    minutes: float,
    device: str,
    scoring: Scoring,
    overrides: tuple[str, ...] = (),
    machine: str | None = None,
) -> str:
    """The line printed next to BLEU: recorded runs of this recipe, budget and scoring.

    The median and range of test BLEU over the seeds of `recorded_reference`'s entry
    (those of `machine` where recorded); says so when none is recorded.
    """
    entry = recorded_reference(recipe, minutes, device, scoring, overrides, machine)
    if entry is None:
        wanted = [o for o in overrides if not o.startswith("train.seed=")]
        settings = "".join(f" {o}" for o in wanted)
        return (
            f"reference: none recorded yet for {Path(recipe).name}{settings} at {minutes:g} "
            f"minutes on {device.split(':')[0]} with {scoring.describe()}"
        )
    bleu = entry["bleu"]
    return (
        f"reference on {entry['machine']}: median {statistics.median(bleu):.2f} BLEU "
        f"(range {min(bleu):.2f}-{max(bleu):.2f}) over {len(bleu)} seed"
        f"{'s' if len(bleu) != 1 else ''}, {minutes:g} minutes, {scoring.describe()}"
    )


def this_machine(device: str) -> str:
    """The machine a quickstart runs on, named as the references name theirs: the CPU and
    its cores ("AMD EPYC, 2 cores"), or the CUDA device's name."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return machine()


REFERENCE_DTYPE = "float32"
"""The type a recorded reference decoded its test set in where it does not say (runs
recorded before `--dtype auto`); newer ones list theirs (`decode_dtypes`)."""


def other_machine_line(
    reference: dict | None, here: str, dtype: str = REFERENCE_DTYPE
) -> str | None:
    """One line where the references came from another machine than `here`, or decoded
    the test set in another type than `dtype` (`--dtype auto`'s choice); else None.

    A 15-minute run's BLEU depends on the machine twice over: its speed sets how many
    updates fit in the budget, and its float sums (other SIMD widths, other kernels) take
    training along another path. And the test translation's type changes some outputs:
    bfloat16 keeps 8 significant bits of each weight, float32 24.
    """
    if reference is None:
        return None
    other_cpu = reference.get("machine") not in (None, here)
    theirs = sorted(set(reference.get("decode_dtypes") or [REFERENCE_DTYPE]))
    other_dtype = theirs != [dtype]
    if not other_cpu and not other_dtype:
        return None
    decoded = (
        f"the references decoded the test set in {' and '.join(theirs)}, this run in {dtype} "
        "(timed faster here): some translations change, and BLEU with them by a few tenths"
    )
    if not other_cpu:
        return decoded
    line = (
        f"the references came from {reference['machine']}; this is {here}: another CPU "
        "makes another number of updates in the same minutes and sums floats in another "
        "order, so expect BLEU to differ by more than the seeds' range"
    )
    return f"{line}; and {decoded}" if other_dtype else line


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
    if config.seed is not None:
        args += ["--seed", str(config.seed)]
    for override in config.overrides:
        args += ["--set", override]
    if config.vocab_size != BIBLE_VOCAB_SIZE:
        args += ["--vocab-size", str(config.vocab_size)]
    return shlex.join(args)


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"{cpu_model()}, {torch.get_num_threads()} threads"
