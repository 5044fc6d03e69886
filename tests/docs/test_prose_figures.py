"""Every measured figure in the prose of README and docs/ comes from a results file (issue 34, item 3).

The tables are rendered by `benchmarks/report/` (`tests/docs/test_readme_figures.py`);
this file covers the rest: prose, and tables written by hand. A number with a unit
(ms, s, BLEU, x, %, GFLOP/s, MiB, tok/s, ...) outside the rendered blocks and the
code blocks passes only

- with a marker right after it, an HTML comment naming where it comes from, checked
  here against the file:

      1.22x<!-- figure: kernels:results[kernel=loss].speedup -->

  `NAME:KEY` is `benchmarks/results/NAME.json` and a path into it (`.`-separated; a
  number indexes a list; `list[field=value,field=value]` picks the one record
  with those values). A figure with several numbers ("4.6 to 4.8 s") names one `NAME:KEY`
  each, in order. A number must equal the value rounded as printed (a percentage
  may also be 100 times a fraction); a string value must contain the figure;
- or on `ALLOWED` below: figures that are not measurements of this project (the
  paper's, an issue's goal, a test's setting), each with its source.

A figure that has neither is either re-measured into a results file or removed. A figure
is also a number with a leading minus, one followed by a Korean particle (`27.3 BLEU에`,
`1.5배`), a correlation or p-value (`r = 0.92`), nats and bits, and a plain number
compared with another (`59 vs 16 ms`, `3,335 against 1,707`). A marker that names a
results file which a newer file of the same measurement supersedes fails too, unless the
page says why it shows the older one (`<!-- older: NAME -->`, `benchmarks.report`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
SIGNED = rf"[-−+]?(?:{NUMBER})"  # a leading minus (or plus) is part of the figure
UNITS = (
    r"ms|s|seconds?|µs|us|BLEU|chrF|%|GFLOP/s|TFLOP/s|MFLOP|GFLOP|MiB|GiB|KiB|MB|GB|"
    r"tok/s|tokens/s|sentences/s|updates/s|nats?/token|nats?|bits"
)
# After a unit only an ASCII letter or digit continues a word: a Korean particle
# (`27.3 BLEU에`, `1.5배를`) ends the figure.
FIGURE = re.compile(
    rf"(?<![\w.`/-])(?:{SIGNED})(?:\s*(?:to|-|–)\s*(?:{SIGNED}))?"
    rf"(?:\s?(?:{UNITS})(?![A-Za-z0-9_/])|[x×배](?![A-Za-z0-9_]))"
    rf"|\b[rp]\s?=\s?(?:{SIGNED})"  # a correlation or a p-value
    rf"|(?<![\w.`/-])(?:{NUMBER})(?=\s+(?:vs\.?|versus|against)\s+(?:{NUMBER}))"
)
MARKER = re.compile(r"\s*<!-- figure: ([^>]*?) -->")
RENDERED = re.compile(r"<!-- report:([a-z0-9-]+) -->\n.*?<!-- /report:\1 -->", re.DOTALL)
FENCED = re.compile(
    r"^[ \t]*```.*?^[ \t]*```", re.DOTALL | re.MULTILINE
)  # indented too (exercise solutions)

# Figures that are not this project's measurements: (a phrase of README or docs/ holding the
# figure, its source). Each must still occur in one of them.
ALLOWED: dict[str, str] = {
    # goals set by the issues, not measured
    "1.2× the faster peer": "issue 35's training goal",
    "on test, above the 30% goal": "issue 31's ListOps goal",
    "against a goal of 30%": "issue 31's ListOps goal",
    "(full attention at 30% or more)": "issue 31's ListOps goal",
    "LRA's ListOps accuracies of about 36%": "LRA's Table 1 (Tay et al. 2021)",
    "do not fall to LRA's 16 to 18%": "LRA's Table 1 (Tay et al. 2021)",
    "Issue 29's serving goals (5x one at a": "issue 29's serving goals",
    "time at 16 clients with p99 under 1 s, 8x at 64)": "issue 29's serving goals",
    "against goals of 5x and 8x": "issue 29's serving goals",
    "목표 5x와 8x에 대해": "issue 29's serving goals (known-limits.ko.md)",
    "Issue 29's goal of 2x:": "issue 29's file-translation goal",
    "Both are above 1.5x `transformers`'": "issue 29's generation goal",
    "Generation, 1.5x `transformers` fp32": "issue 29's generation goal",
    "`transformers` fp32의 1.5x": "issue 29's generation goal (known-limits.ko.md)",
    "against a goal of 50%": "issue 35's MFU goal",
    "Issue 35's goals: an MFU of 50%": "issue 35's MFU goal",
    "목표 50%에 대해": "issue 35's MFU goal (known-limits.ko.md)",
    "against a goal of 3x": "issue 35's decoding goal",
    "목표 3x에 대해": "issue 35's decoding goal (known-limits.ko.md)",
    "the goal of 3× at beam 4": "issue 35's decoding goal",
    # vendor data, not measured
    "data sheet, 989.4 TFLOP/s": "NVIDIA's H200 data sheet (benchmarks/common.py PEAK_BF16_TFLOPS)",
    "a median of 25 BLEU after": "issue 18's quality goal",
    "a median of 26 BLEU over three seeds": "issue 45's quality goal",
    "against issue 45's 26 BLEU": "issue 45's quality goal",
    "이슈 45의 26 BLEU에 대해": "issue 45's quality goal (known-limits.ko.md)",
    # the paper's figures, quoted by the tutorials
    "heads of a large model for 0.15 BLEU": "Voita et al. 2019, the pruning result",
    "section 3.1), 15% of the": "BERT's masking rate (Devlin et al. 2019, section 3.1)",
    "of those, 80% become `[MASK]`, 10%": "BERT's masking split (Devlin et al. 2019)",
    "15%를 고르고, 그중 80%는 `[MASK]`로, 10%는 무작위 토큰으로 바꾸고, 10%는":
        "BERT's masking split (Devlin et al. 2019; the Korean twin of the tutorial)",
    "(7의 15%를 반올림": "BERT's masking rate, applied to the tutorial's sentences (Korean twin)",
    "a random token and 10% stay as they are": "BERT's masking split (Devlin et al. 2019)",
    "(15% of 7, rounded, at": "BERT's masking rate, applied to the tutorial's sentences",
    "one head was 0.9 BLEU": "the paper's Table 3, row (A)",
    "base model reached 27.3 BLEU": "the paper's Table 2 (WMT 2014 English-German)",
    "27.3 BLEU에 도달했습니다": "the paper's Table 2 (the Korean twin of the tutorial)",
    "pruned 38 of 48 encoder heads for -0.15 BLEU": "Voita et al. 2019, the pruning result",
    "int8 within 0.3 BLEU of fp32": "issue 17's quality goal",
    "keeps within 0.3 BLEU); the": "issue 17's quality goal, as bench_decode's fixed best",
    "(every cell at 1.0x CTranslate2 int8 or more": "the decoding-engine issue's speed goal",
    "on at least 90% of the test sentences": "issue 17's quality goal",
    "greedy outputs identical on 90%": "issue 17's quality goal",
    "precision reaches 90% on any seed": "issue 17's quality goal",
    "1.2x CTranslate2 int8 or more, in all 8 cells)": "issue 17's speed goal",
    "also keeps 90% of the greedy": "issue 17's quality goal",
    "issue's goal allows (at most 10%)": "issue 17's quality goal",
    "이슈의 목표가 허용하는 것(최대 10%)": "issue 17's quality goal (known-limits.ko.md)",
    "(the goal: >= 1.5x transformers fp32": "the generation issue's goal",
    "The goal is ≥ 5× the": "the serving issue's goal",
    "with p99 under 1 s": "the serving issue's goal",
    "the issue asks 2x Hugging Face at": "the speed issue's goal",
    "decoding at batch 32, 2x HF": "the speed issue's goal",
    "training, 1.2x HF,": "the speed issue's goal",
    "(HF generate의 2x)": "the speed issue's goal (known-limits.ko.md)",
    "(HF의 1.2x)": "the speed issue's goal (known-limits.ko.md)",
    "in fp32, the 2x over Hugging Face the issue asks": "the speed issue's goal",
    "decoding and 1.2x at training": "the speed issue's goal",
    "the 1.2x over": "the speed issue's goal",
    # the papers' settings and arithmetic
    "(4x the residual's size)": "the paper's d_ff = 4 d_model (section 3.3)",
    "text with 15 % masked": "BERT (Devlin et al. 2019, section 3.1)",
    "15% of the non-special positions, of those 80% `[MASK]`, 10% a random piece, 10%":
        "BERT (Devlin et al. 2019, section 3.1)",
    "Its loss is on 15% of the positions": "BERT's masking rate (above)",
    "(chance: 4.8%)": "1 in 21 symbols",
    "all 124M float32 weights (500 MB)": "124M weights x 4 bytes",
    "8 MB for a 100-token sentence": "an estimate by the rule README states, not measured",
    "about 15% of the ordinary tokens are chosen": "BERT's masking rate (tutorial 08's exercise)",
    "about 80% of the chosen ones become": "BERT's masking rate (tutorial 08's exercise)",
    "보통 토큰의 약 15%가 골라지고": "BERT's masking rate (tutorial 08's exercise, Korean)",
    "고른 토큰의 약 80%가": "BERT's masking rate (tutorial 08's exercise, Korean)",
    "(ln 60 ≈ 4.09 nats per token for 60 ordinary tokens)": "ln 60, arithmetic",
    "falls only to about 3.4-3.5 nats": "benchmarks/results/induction-causes.json's runs",
    # a tutorial's own output on another CPU (issue 41 reported it from an Intel Xeon)
    "Intel Xeon printed 95, 86 and 5% for the sinusoids, 100, 74 and 23%":
        "tutorial 03's own table, as issue 41 reports it from an Intel Xeon",
    "80, 62 and 31% for ALiBi": "tutorial 03's own table, as issue 41 reports it",
    "사인파는 95, 86, 5%, 로터리는 100, 74, 23%, ALiBi는 80, 62, 31%를":
        "tutorial 03's own table, as issue 41 reports it (03-positions.ko.md)",
    # settings of the code, the benchmarks and the tests
    "at least 1.1x faster": "aiayn.training.precision.BF16_MIN_SPEEDUP",
    "plus 4 KiB": "aiayn.apps.serve.settings: 6 * max_chars + 4096 bytes",
    "weights would pass 2 GiB": "bench_attention.py's skip rule",
    "a test checks they agree within 0.1%": "the tolerance of that test",
    "loss within 0.03 nats of fp32": "the tolerance of that test (known-limits.md)",
    "fp32와 0.03 nat 안": "the tolerance of that test (known-limits.ko.md)",
    "a real 2 MB tmpfs": "the test's setup",
    "a filled 4 MiB": "the test's setup",
    "the test fails after 180 s": "the test's timeout",
}  # fmt: skip

# Measurements in pages another helper owns, not yet marked with their results file (the
# checker began to see them with issue 48's units and Korean particles): each is to get
# its marker from that page's owner, and leaves this list then.
UNMARKED_ELSEWHERE: dict[str, str] = {
    "head (0.43 nats per token without it)": "docs/tutorials/07: the heads run's ablation",
    "(최대 2.7배)": "docs/tutorials/10 (Korean): int8-kernels.json's largest speed-up",
}
ALLOWED |= UNMARKED_ELSEWHERE


def documents() -> list[Path]:
    """README.md and every docs page (docs/**/*.md)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose(text: str) -> str:
    """`text` with its rendered blocks and code blocks blanked (line numbers kept)."""

    def blank(match: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", match.group(0))

    return FENCED.sub(blank, RENDERED.sub(blank, text))


def lookup(data: object, key: str) -> object:
    """The value at `key` in a results file's data (see the module docstring).

    Raises:
        KeyError: naming the part of `key` that does not resolve.
    """
    for part in key.split("."):
        selector = re.fullmatch(r"([^\[]+)\[([^\]]+)\]", part)
        if selector:
            name, conditions = selector.groups()
            wanted = dict(c.split("=", 1) for c in conditions.split(","))
            records = data.get(name) if isinstance(data, dict) else None
            found = [
                r
                for r in records or []
                if all(str(r.get(field)) == value for field, value in wanted.items())
            ]
            if len(found) != 1:
                raise KeyError(f"{part}: {len(found)} records match, not 1")
            data = found[0]
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        elif isinstance(data, dict) and part in data:
            data = data[part]
        else:
            raise KeyError(f"{part}: not in the file")
    return data


def matches(printed: str, value: object, percent: bool) -> bool:
    """Whether the printed number is `value` rounded as printed."""
    if isinstance(value, str):
        return printed in value
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    number = float(printed.replace(",", ""))
    decimals = len(printed.partition(".")[2])
    candidates = [value, 100 * value] if percent else [value]
    return any(abs(c - number) <= 0.5 * 10**-decimals + 1e-9 for c in candidates)


def check_marker(figure: str, marker: str) -> str | None:
    """What is wrong with a figure's marker, or None."""
    numbers = re.findall(NUMBER, figure)
    sources = marker.split()
    if len(sources) != len(numbers):
        return f"{len(numbers)} number(s) but {len(sources)} source(s) in its marker"
    for printed, named in zip(numbers, sources, strict=True):
        name, _, key = named.partition(":")
        path = RESULTS / f"{name}.json"
        if not path.is_file():
            return f"no results file benchmarks/results/{name}.json"
        try:
            value = lookup(json.loads(path.read_text(encoding="utf-8")), key)
        except KeyError as err:
            return f"{named}: {err.args[0]}"
        whole = figure if isinstance(value, str) else printed
        if not matches(whole, value, figure.endswith("%")):
            return f"{named} is {value!r}, not {whole}"
    return None


def problems(text: str, where: str, allowed: dict[str, str]) -> tuple[list[str], set[str]]:
    """Each figure of `text` that is neither marked rightly nor allowed, each marker that
    names a superseded results file the page does not say why it shows, and the allowed
    phrases used."""
    from benchmarks import report

    found, used = [], set()
    for number, line in enumerate(prose(text).splitlines(), 1):
        for match in FIGURE.finditer(line):
            figure = match.group(0)
            marker = MARKER.match(line, match.end())
            if marker:
                wrong = check_marker(figure, marker.group(1))
                if wrong:
                    found.append(f"{where}:{number}: {figure!r}: {wrong}")
                continue
            phrase = next((p for p in allowed if figure in p and p in line), None)
            if phrase is None:
                found.append(
                    f"{where}:{number}: {figure!r} is neither marked with its results "
                    f"file nor allowed: {line.strip()[:100]}"
                )
            else:
                used.add(phrase)
    index = None  # every results file's measures, read once a document names one
    for number, line in enumerate(prose_markers(text).splitlines(), 1):
        named = [s.partition(":")[0] for m in MARKER.finditer(line) for s in m.group(1).split()]
        if named:
            index = report.measurements() if index is None else index
            found += [
                f"{where}:{number}: {why}" for why in report.older_sources(text, named, index)
            ]
    return found, used


def prose_markers(text: str) -> str:
    """`text` with its code blocks blanked (markers in rendered blocks are the report's)."""
    return FENCED.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), RENDERED.sub("", text))


def test_every_figure_in_prose_is_rendered_or_listed_with_its_source():
    found, used = [], set()
    for path in documents():
        where = str(path.relative_to(ROOT))
        more, seen = problems(path.read_text(encoding="utf-8"), where, ALLOWED)
        found += more
        used |= seen
    assert found == []
    assert sorted(set(ALLOWED) - used) == []  # an entry whose phrase is gone goes too


def write_results(tmp_path: Path, monkeypatch) -> None:
    from benchmarks import report

    monkeypatch.setitem(globals(), "RESULTS", tmp_path)
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    data = {"results": [{"kernel": "loss", "speedup": 1.2237}, {"kernel": "adam", "x": 2}]}
    data |= {"share": 0.952, "command": "make demo (16 min 14 s in all)", "seconds": [4.6, 4.8]}
    data |= {"date": "2026-11-25 10:00", "measures": {"system": "k", "cell": "c", "harness": "h"}}
    (tmp_path / "kernels.json").write_text(json.dumps(data), encoding="utf-8")
    # the same measurement as old.json, run later: old.json is superseded
    same = {"system": "aiayn against HF", "cell": "batch 32", "harness": "spinning threads"}
    old = {"date": "2026-11-24 09:00", "measures": [same], "ratio": 2.39}
    new = {"date": "2026-11-25 21:30", "measures": [same | {"harness": "fair race"}]}
    (tmp_path / "old.json").write_text(json.dumps(old), encoding="utf-8")
    (tmp_path / "new.json").write_text(json.dumps(new | {"ratio": 1.58}), encoding="utf-8")


@pytest.mark.parametrize(
    "line",
    [
        "the loss is 1.22x<!-- figure: kernels:results[kernel=loss].speedup --> faster",
        "it holds 95.2%<!-- figure: kernels:share --> of them",
        "16 min 14 s <!-- figure: kernels:command --> in all",
        "4.6 to 4.8 s<!-- figure: kernels:seconds.0 kernels:seconds.1 --> for 296 verses",
        "a 25 BLEU goal",  # allowed below
        "```\n3 seconds in a code block\n```",
        "<!-- report:x -->\n3 seconds in a rendered block\n<!-- /report:x -->",
        "a 2,048-token batch, 128 x 512 weights, section 6, BLEU through sacreBLEU",
        "a 2-core CPU, layer 0 vs layer 2, batch 32 against HF, 3+3 layers",
        "2.39x<!-- figure: old:ratio --> in the old harness.<!-- older: old -->",
        "1.58x<!-- figure: new:ratio --> in the fair race",
    ],
)
def test_figures_with_their_source_pass(line, tmp_path, monkeypatch):
    write_results(tmp_path, monkeypatch)
    found, _ = problems(line, "X.md", {"a 25 BLEU goal": "issue 18"})
    assert found == []


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("about 3 seconds.", "'3 seconds' is neither marked with its results file nor allowed"),
        ("0.8 to 0.95× the rate", "'0.8 to 0.95×' is neither marked"),
        ("5 to 15 ms more", "'5 to 15 ms' is neither marked"),
        ("441 GFLOP/s in bf16", "'441 GFLOP/s' is neither marked"),
        ("1.23x<!-- figure: kernels:results[kernel=loss].speedup -->", "is 1.2237, not 1.23"),
        ("1.2x<!-- figure: kernels:results[kernel=nope].speedup -->", "0 records match, not 1"),
        ("2 s<!-- figure: kernels:results.5 -->", "results.5: 5: not in the file"),
        ("2 s<!-- figure: other:x -->", "no results file benchmarks/results/other.json"),
        ("4.6 to 4.8 s<!-- figure: kernels:seconds.0 -->", "2 number(s) but 1 source(s)"),
        ("16 min 15 s <!-- figure: kernels:command -->", "not 15 s"),
        ("a 25 BLEU goal", "'25 BLEU' is neither marked"),  # not on this allowlist
        # issue 48: what slipped past the checker before
        ("27.3 BLEU에 도달했습니다", "'27.3 BLEU' is neither marked"),  # a Hangul particle
        ("목표인 1.5배를 넘습니다", "'1.5배' is neither marked"),
        ("the alignment (r = 0.92 to 0.94)", "'r = 0.92' is neither marked"),
        ("ablation 0.43 nats per token", "'0.43 nats' is neither marked"),
        ("at 3.4 bits per character", "'3.4 bits' is neither marked"),
        ("pruned for -0.15 BLEU here", "'-0.15 BLEU' is neither marked"),
        ("the encoder reads 59 vs 16 a second", "'59' is neither marked"),  # a plain count
        ("reads 3,335 against 1,707 a second", "'3,335' is neither marked"),
        ("2.39x<!-- figure: old:ratio --> at batch 32", "old.json is superseded by"),
    ],
)
def test_a_figure_without_its_source_or_off_its_value_is_named(
    line, complaint, tmp_path, monkeypatch
):
    write_results(tmp_path, monkeypatch)
    found, _ = problems(f"first line\n{line}\n", "X.md", {"a 26 BLEU goal": "x"})
    assert len(found) == 1 and found[0].startswith("X.md:2: "), found
    assert complaint in found[0]
