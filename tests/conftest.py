"""Shared test setup: deterministic, single-threaded torch (pytest-xdist runs 2 workers),
and under CI=true no silent skip: every skip, skipif, importorskip, xfail or xpass fails,
except the few on CI_ALLOWED_SKIPS below."""

from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(1)

# `aiayn translate` and `aiayn serve` decode in float32 here, in this process and in every
# command a test starts: their default, `--dtype auto`, would time bfloat16 against
# float32 on the CPU at hand and could take either (a busy machine times noise), while
# tests compare their outputs with float32's. Tests of auto itself unset it.
os.environ["AIAYN_DTYPE"] = "float32"

# Training keeps glibc's freed memory and raises oneDNN's kernel cache for the whole process
# (aiayn.training.host_memory); in a test worker that would make tests that measure memory
# depend on whether a trainer ran before them. Tests of those settings use their own
# processes and dictionaries (tests/unit/test_host_memory.py).
os.environ["AIAYN_HOST_MEMORY"] = "default"

# The skips that CI=true lets stand, by a phrase of their reason, each with why CI cannot
# run that test. Everything else CI must run: the Bible's SWORD modules, Chromium and
# Selenium, transformers, a wheel build, a tmpfs mount (CI runs as root) are all installed
# by `make test`, so a skip for want of one of them is a broken CI machine, not a pass.
CI_ALLOWED_SKIPS = {
    # tests/unit/test_translate.py: `--device cuda:7` must fail as "no such device", which can
    # only be checked where CUDA is absent. CI's torch is the CPU wheel (Makefile), so
    # there it runs; a CI=true run on a GPU machine skips it.
    "a CUDA device exists here": "needs a machine without CUDA",
    # tests/cuda: the GPU paths, checked against the CPU. CI's machine has no GPU (and its
    # torch is the CPU wheel); they run on a lent GPU machine (docs: results/gpu.md).
    "needs CUDA: no CUDA device here": "needs a CUDA GPU",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules that hold long tests (marked `slow` or `trains`) first, each whole (its
    module-scoped fixtures are built once), in their order: pytest-xdist hands them out
    while the short ones still fill both workers, instead of one worker running a
    minute-long tutorial alone at the end."""

    def long(item: pytest.Item) -> bool:
        return any(item.get_closest_marker(name) for name in ("slow", "trains"))

    modules_first = {item.path for item in items if long(item)}
    items.sort(key=lambda item: item.path not in modules_first)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _decode_float32_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--dtype auto` (aiayn translate and serve, the quickstart) times bfloat16 against
    float32 on the CPU at hand. Tests compare translations with float32's, so here the
    timing finds the two alike on every CPU (auto keeps float32); the tests of the choice
    (tests/unit/test_precision_choice.py) fake their own ratios or call the real one."""
    import aiayn.apps.precision_choice as precision_choice

    monkeypatch.setattr(precision_choice, "bf16_decoding_speedup", lambda *args: 1.0)


def _under_ci() -> bool:
    return os.environ.get("CI") == "true"


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """Why a report skipped (or was expected to fail): pytest's own words."""
    wasxfail = getattr(report, "wasxfail", None)
    if wasxfail is not None:
        return f"xfail: {wasxfail}" if wasxfail else "xfail"
    longrepr = report.longrepr
    return longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)


def _fail_unless_allowed(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Turn a skip (or an xfail or xpass) into a failure that quotes its reason, unless
    CI_ALLOWED_SKIPS names it."""
    reason = _reason(report)
    if any(phrase in reason for phrase in CI_ALLOWED_SKIPS):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"CI=true: a skip is a failure ({reason}); install what it needs, or add it to "
        "CI_ALLOWED_SKIPS in tests/conftest.py with why CI cannot run it"
    )


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    """Under CI=true a test that skipped, xfailed or xpassed fails instead (a skipif
    mark or a skipping fixture skips at setup, so its failure reads as an error)."""
    report = yield
    xpassed = report.passed and hasattr(report, "wasxfail")
    if _under_ci() and (report.skipped or xpassed):
        _fail_unless_allowed(report)
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_make_collect_report(collector: pytest.Collector) -> pytest.CollectReport:
    """Under CI=true a module skipped while collected (a module-level importorskip or
    skip) is a collection error instead."""
    report = yield
    if _under_ci() and report.skipped:
        _fail_unless_allowed(report)
    return report
