"""`python -m benchmarks.report`: see the package's docstring."""

from benchmarks.report.pages import main

main()
