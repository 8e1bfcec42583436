"""What every command pays besides training: building the CLI, and drawing a ``test`` run's figures.

    python benchmarks/cli_overhead.py                                   # the main command's config
    python benchmarks/cli_overhead.py --config configs/icssl/manifolds.yaml --repeats 7

Prints, in this process (imports already done, as in the test suite):

- the seconds to build the CLI's parser, parse the config and build the run (``fit ... --print_config``), for the
  subcommand named on the command line, with the parser of only that subcommand (what ``LitICLCLI`` does) and
  with the parsers of all four (what LightningCLI does);
- the seconds to draw a results figure once and save it with its TensorBoard image (what ``ResultsWriter`` does),
  and the way before: ``savefig(bbox_inches="tight")`` and TensorBoard's ``add_figure``, three drawings.

The median over ``--repeats`` runs after one unmeasured run of each.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_options import at_least
from matplotlib.backends.backend_agg import FigureCanvasAgg

from lit_icl.cli.app import LitICLCLI
from lit_icl.cli.app import main as lit_icl_main
from lit_icl.core.figures import PNG_DPI, line_figure, save_png
from lit_icl.core.results import result_row


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # unmeasured: first-call caches
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _print_config(config: str, save_dir: str) -> None:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        lit_icl_main(["fit", "--config", config, "--trainer.logger.init_args.save_dir", save_dir, "--print_config"])


def _figure():
    rows = [result_row("accuracy", 0.1 * i + 0.01 * seed, method=f"method {m}", label_ratio=ratio)
            for seed in range(3) for m in range(5) for i, ratio in enumerate([0.05, 0.1, 0.2, 0.4, 0.8])]
    return line_figure(rows, "label_ratio", metric="accuracy", title="accuracy against the label ratio")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/coqe_omniglot.yaml", help="the config to build a run of")
    parser.add_argument("--repeats", type=at_least(1), default=5,
                        help="measured runs of each (their median is printed)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        one = _median_seconds(lambda: _print_config(args.config, tmp), args.repeats)
        original = LitICLCLI._add_subcommands

        def all_four(self, parser, **kwargs):  # LightningCLI's own: a parser for each subcommand
            return super(LitICLCLI, self)._add_subcommands(parser, **kwargs)

        LitICLCLI._add_subcommands = all_four
        try:
            four = _median_seconds(lambda: _print_config(args.config, tmp), args.repeats)
        finally:
            LitICLCLI._add_subcommands = original
        print(f"CLI, {args.config}: {one:.3f} s with the named subcommand's parser, {four:.3f} s with all four")

        path = Path(tmp) / "figure.png"

        def once() -> None:
            pixels = save_png(_figure(), path)
            pixels[..., :3].copy()  # what goes to TensorBoard

        def three_drawings() -> None:
            fig = _figure()
            fig.savefig(path, dpi=PNG_DPI, bbox_inches="tight")
            canvas = FigureCanvasAgg(fig)  # what TensorBoard's add_figure does
            canvas.draw()

        drawn_once = _median_seconds(once, args.repeats)
        drawn_three_times = _median_seconds(three_drawings, args.repeats)
        built = _median_seconds(_figure, args.repeats)
        print(f"figure (5 lines with sd bands): {drawn_once:.3f} s drawn once for the PNG and TensorBoard, "
              f"{drawn_three_times:.3f} s drawn three times (savefig tight + add_figure); building it: {built:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
