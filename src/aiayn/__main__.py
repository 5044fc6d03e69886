"""`python -m aiayn ...`: the `aiayn` command, also as `torchrun ... -m aiayn train ...`."""

from aiayn.cli import app

if __name__ == "__main__":
    app(prog_name="aiayn")
