"""What the hyper-parameters dump costs a command: Lightning's ``_dump_config`` (which checks the parsed config a
second time) against ``LitICLCLI._dump_config`` (which does not), alternating, in one process.

    python benchmarks/cli_dump.py --repeats 8

Each run is a tiny IC-SSL ``fit`` (the test suite's arguments) refused at the model's construction
(``--model.init_args.lr -1``), after the dump: what a bad-input test row, or a command refused late, pays.
Prints the median seconds of each.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_options import at_least
from lightning.pytorch.cli import LightningCLI

from lit_icl.cli import main as cli_main
from lit_icl.cli.app import LitICLCLI

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from icssl.helpers import tiny_args


def refused_fit() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["fit", *tiny_args(Path(tmp)), "--model.init_args.lr", "-1"]
        start = time.perf_counter()
        with contextlib.redirect_stderr(io.StringIO()), contextlib.suppress(SystemExit):
            cli_main(argv)
        return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=at_least(1), default=8)
    args = parser.parse_args(argv)
    ours = LitICLCLI._dump_config
    dumps = {"lightning": LightningCLI._dump_config, "lit_icl": ours}
    refused_fit()  # imports and first-use costs, unmeasured
    seconds: dict[str, list[float]] = {name: [] for name in dumps}
    for _ in range(args.repeats):
        for name, dump in dumps.items():
            LitICLCLI._dump_config = dump
            seconds[name].append(refused_fit())
    LitICLCLI._dump_config = ours
    for name, values in seconds.items():
        print(f"{name:10s} dump: median {statistics.median(values):.3f} s over {args.repeats} refused fits")


if __name__ == "__main__":
    main()
