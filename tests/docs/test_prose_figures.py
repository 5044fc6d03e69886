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

A figure that has neither is either re-measured into a results file or removed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
UNITS = (
    r"ms|s|seconds?|µs|us|BLEU|chrF|%|GFLOP/s|TFLOP/s|MFLOP|GFLOP|MiB|GiB|KiB|MB|GB|"
    r"tok/s|tokens/s|sentences/s|updates/s"
)
FIGURE = re.compile(
    rf"(?<![\w.`/-])(?:{NUMBER})(?:\s*(?:to|-|–)\s*(?:{NUMBER}))?"
    rf"(?:\s?(?:{UNITS})(?![\w/])|[x×](?![\w\d]))"
)
MARKER = re.compile(r"\s*<!-- figure: ([^>]*?) -->")
RENDERED = re.compile(r"<!-- report:([a-z0-9-]+) -->\n.*?<!-- /report:\1 -->", re.DOTALL)
FENCED = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)

# Figures that are not this project's measurements: (a phrase of README or docs/ holding the
# figure, its source). Each must still occur in one of them.
ALLOWED: dict[str, str] = {
    # goals set by the issues, not measured
    "the peers, not 1.2× the best": "issue 35's training goal",
    "on test, above the 30% goal": "issue 31's ListOps goal",
    "(the goal is 30%), and every efficient kernel": "issue 31's ListOps goal",
    "LRA's ListOps accuracies of about 36%": "LRA's Table 1 (Tay et al. 2021)",
    "do not fall to LRA's 16 to 18%": "LRA's Table 1 (Tay et al. 2021)",
    "(5x one at a time at 16 clients with p99 under 1 s, 8x at 64)": "issue 29's serving goals",
    "Issue 29's goal of 2x is not met": "issue 29's file-translation goal",
    "Both meet the goal of 1.5x `transformers`": "issue 29's generation goal",
    "meets its goal of 1.5x `transformers`": "issue 29's generation goal",
    "(the goal is 50%), at": "issue 35's MFU goal",
    "HF `generate` (the goal is 3x)": "issue 35's decoding goal",
    "but the goal of 3× at beam 4": "issue 35's decoding goal",
    # vendor data, not measured
    "data sheet, 989.4 TFLOP/s": "NVIDIA's H200 data sheet (benchmarks/common.py PEAK_BF16_TFLOPS)",
    "a median of 25 BLEU after": "issue 18's quality goal",
    # the paper's figures, quoted by the tutorials
    "heads of a large model for 0.15 BLEU": "Voita et al. 2019, the pruning result",
    "section 3.1), 15% of the": "BERT's masking rate (Devlin et al. 2019, section 3.1)",
    "of those, 80% become `[MASK]`, 10%": "BERT's masking split (Devlin et al. 2019)",
    "a random token and 10% stay as they are": "BERT's masking split (Devlin et al. 2019)",
    "(15% of 7, rounded, at": "BERT's masking rate, applied to the tutorial's sentences",
    "one head was 0.9 BLEU": "the paper's Table 3, row (A)",
    "base model reached 27.3 BLEU": "the paper's Table 2 (WMT 2014 English-German)",
    "int8 within 0.3 BLEU of fp32": "issue 17's quality goal",
    "keeps within 0.3 BLEU); the": "issue 17's quality goal, as bench_decode's fixed best",
    "(every cell at 1.0x CTranslate2 int8 or more": "the decoding-engine issue's speed goal",
    "on at least 90% of the test sentences": "issue 17's quality goal",
    "also keeps 90% of the greedy": "issue 17's quality goal",
    "issue's goal allows (at most 10%)": "issue 17's quality goal",
    "이슈의 목표가 허용하는 것(최대 10%)": "issue 17's quality goal (known-limits.ko.md)",
    "at 1.2x CTranslate2 int8 or more": "issue 17's speed goal",
    "(the goal: >= 1.5x transformers fp32": "the generation issue's goal",
    "The goal is ≥ 5× the": "the serving issue's goal",
    "with p99 under 1 s": "the serving issue's goal",
    "not the 5x aimed at": "the serving issue's goal",
    "the issue asks 2x Hugging Face at": "the speed issue's goal",
    "decoding and 1.2x at training": "the speed issue's goal",
    "does not reach the 2x over Hugging Face": "the speed issue's goal",
    "the 1.2x over": "the speed issue's goal",
    "(decoding 2x and training 1.2x Hugging Face)": "the speed issue's goal",
    # the papers' settings and arithmetic
    "(4x the residual's size)": "the paper's d_ff = 4 d_model (section 3.3)",
    "text with 15 % masked": "BERT (Devlin et al. 2019, section 3.1)",
    "15% of the non-special positions, of those 80% `[MASK]`, 10% a random piece, 10%":
        "BERT (Devlin et al. 2019, section 3.1)",
    "Its loss is on 15% of the positions": "BERT's masking rate (above)",
    "(chance: 4.8%)": "1 in 21 symbols",
    "all 124M float32 weights (500 MB)": "124M weights x 4 bytes",
    "8 MB for a 100-token sentence": "an estimate by the rule README states, not measured",
    # settings of the code, the benchmarks and the tests
    "at least 1.1x faster": "aiayn.training.precision.BF16_MIN_SPEEDUP",
    "plus 4 KiB": "aiayn.apps.serve.settings: 6 * max_chars + 4096 bytes",
    "weights would pass 2 GiB": "bench_attention.py's skip rule",
    "a test checks they agree within 0.1%": "the tolerance of that test",
    "a real 2 MB tmpfs": "the test's setup",
    "a filled 4 MiB": "the test's setup",
    "the test fails after 180 s": "the test's timeout",
}  # fmt: skip


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
    """Each figure of `text` that is neither marked rightly nor allowed, and the
    allowed phrases used."""
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
    return found, used


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
    monkeypatch.setitem(globals(), "RESULTS", tmp_path)
    data = {"results": [{"kernel": "loss", "speedup": 1.2237}, {"kernel": "adam", "x": 2}]}
    data |= {"share": 0.952, "command": "make demo (16 min 14 s in all)", "seconds": [4.6, 4.8]}
    (tmp_path / "kernels.json").write_text(json.dumps(data), encoding="utf-8")


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
    ],
)
def test_a_figure_without_its_source_or_off_its_value_is_named(
    line, complaint, tmp_path, monkeypatch
):
    write_results(tmp_path, monkeypatch)
    found, _ = problems(f"first line\n{line}\n", "X.md", {"a 26 BLEU goal": "x"})
    assert len(found) == 1 and found[0].startswith("X.md:2: "), found
    assert complaint in found[0]
