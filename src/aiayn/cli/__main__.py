"""`python -m aiayn.cli ...`: the `aiayn` command, also as `torchrun ... -m aiayn.cli train ...`."""

from aiayn.cli import app

if __name__ == "__main__":
    app()
