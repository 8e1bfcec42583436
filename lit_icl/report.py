"""Tables and figures from the tidy rows of any paper's ``test`` runs.

    python -m lit_icl.report runs/icssl_manifolds/version_1 runs/icssl_manifolds/version_3 \\
        runs/icssl_eig/version_1 --metric accuracy --out comparison.png

Each argument is a run folder or a ``results.json`` (see :mod:`lit_icl.core.results`). Runs whose configs differ
only in their seeds (``seed_everything``, ``data_seed``) and in where they log form one *experiment*, and their
rows are averaged: cells read ``mean ± sd`` over the runs (the table header says how many). The config of the
fit that trained a tested checkpoint counts too (its early-stopping rule and CLI optimizer included), and so does
which of its checkpoints was tested (``last.ckpt`` or ``best-*.ckpt``). A run that repeats
another's test (the same checkpoint, config and seeds) gives the same numbers again: it is counted once, with a
note. An experiment is
named by its TensorBoard logger name (the part its runs' names share, with ``*``, when its seeds logged under
names of their own: ``coqe_s*``) unless ``--labels`` gives one label per run (runs with the same label are
then pooled). A row coordinate named ``seed`` (I2CL writes one) marks a replicate too, so its values are pooled
the same way unless ``--x seed`` asks for one column per seed.

One Markdown table is printed per metric: a line per (experiment, method, other coordinates), a column per
value of the ``--x`` coordinate. ``--out`` draws the same numbers as a figure: lines over a numeric ``--x``,
grouped bars over a categorical one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from matplotlib.figure import Figure

from lit_icl.core.figures import PNG_DPI, aggregate, bar_figure, line_figure, sort_key
from lit_icl.core.results import ROW_KEYS, load_results

#: Config entries that do not change what an experiment is.
SEED_KEYS = ("seed_everything", "data_seed", "ckpt_path")
#: Trainer entries that do not either: where and how a run logs, and ``max_time``, one sitting's wall-clock budget.
LOGGING_KEYS = ("logger", "default_root_dir", "enable_progress_bar", "enable_model_summary", "callbacks", "max_time")
#: Row coordinates that number replicates, not conditions: averaged over like runs, never a line or column of their own
#: (unless asked for as ``--x``). I2CL's rows carry the data seed that picked the demonstrations.
REPLICATE_COORDS = ("seed",)


def _strip(value: Any, skip: Sequence[str], depth: int = 0) -> Any:
    """``value`` without the keys ``skip`` (anywhere) and the logging keys of its sections (``trainer.logger``)."""
    if isinstance(value, Mapping):
        return {
            k: _strip(v, skip, depth + 1)
            for k, v in sorted(value.items())
            if k not in skip and not (depth == 1 and k in LOGGING_KEYS)
        }
    if isinstance(value, list):
        return [_strip(v, skip, depth + 1) for v in value]
    return value


def _sections(config: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: (config or {}).get(k) for k in ("model", "data", "trainer")}


def _training_rules(fit: Mapping[str, Any]) -> dict[str, Any]:
    """The CLI sections of a fit's config besides model, data and trainer that change how it trained, where set:
    an early-stopping rule (on only with a patience) and LightningCLI's ``--optimizer`` / ``--lr_scheduler``."""
    rules = {k: fit.get(k) for k in ("optimizer", "lr_scheduler") if fit.get(k) is not None}
    stopping = fit.get("early_stopping")
    if isinstance(stopping, Mapping) and stopping.get("patience") is not None:
        rules["early_stopping"] = stopping
    return rules


def checkpoint_kind(checkpoint: str | None) -> str | None:
    """Which of its fit's checkpoints a test scored, the same for every seed: the file name without its numbers
    (``last.ckpt``, ``best-epoch=-step=.ckpt`` for ``best-epoch=3-step=120.ckpt``)."""
    return re.sub(r"\d+", "", Path(checkpoint).name) if checkpoint else None


def experiment_fingerprint(meta: Mapping[str, Any]) -> str:
    """A hash of the run's config, and of the config of the fit that trained its checkpoint, without seeds and
    logging: equal for runs that differ only in seed."""
    core = _strip(_sections(meta.get("config")), SEED_KEYS)
    fit = meta.get("fit_config")
    if fit:  # what the tested checkpoint was trained on: tests of models trained differently are not seeds
        # An early-stopping rule or a CLI optimizer is training too: fits with and without one were pooled.
        core["fit"] = _strip({**_sections(fit), **_training_rules(fit)}, SEED_KEYS)
    kind = checkpoint_kind(meta.get("checkpoint"))
    if kind is not None:
        # Tests of last.ckpt and of a best-*.ckpt (or epoch=*.ckpt) of the same fits are two conditions, not
        # replicates: without this the report averaged a seed's best and last checkpoints as two runs (n = 2).
        core["checkpoint"] = kind
    return hashlib.sha1(json.dumps(core, sort_keys=True, default=str).encode()).hexdigest()[:10]


def repeat_key(meta: Mapping[str, Any]) -> str:
    """Equal for two tests of the same checkpoint (path, trained steps and the fit's config) with the same config
    and seeds, wherever they logged: the same numbers twice, which must not count as two replicates."""
    config = meta.get("config") or {}
    key = {"config": _strip(_sections(config), ("ckpt_path",)), "seed": config.get("seed_everything"),
           "checkpoint": meta.get("checkpoint"), "steps": meta.get("trained_steps"),
           "fit": _strip(_sections(meta.get("fit_config")), ())}
    return json.dumps(key, sort_keys=True, default=str)


def drop_repeats(runs: Sequence[Mapping[str, Any]], names: Sequence[str]) -> tuple[list[int], list[str]]:
    """The indices of the runs to keep (the first of each :func:`repeat_key`) and a note per run left out."""
    first: dict[str, int] = {}
    kept, notes = [], []
    for i, run in enumerate(runs):
        j = first.setdefault(repeat_key(run["meta"]), i)
        if j == i:
            kept.append(i)
        else:
            notes.append(f"{names[i]} repeats {names[j]} (the same checkpoint, config and seeds); counted once")
    return kept, notes


def _logger_name(meta: Mapping[str, Any]) -> str | None:
    logger = ((meta.get("config") or {}).get("trainer") or {}).get("logger")
    if isinstance(logger, list):
        logger = logger[0] if logger else None
    if isinstance(logger, Mapping):
        return (logger.get("init_args") or {}).get("name")
    return None


def label_runs(runs: Sequence[Mapping[str, Any]], labels: Sequence[str] | None = None) -> list[str]:
    """One experiment label per run (see the module docstring)."""
    if labels:
        return list(labels)
    prints = [experiment_fingerprint(r["meta"]) for r in runs]
    given: dict[str, list[str]] = {}
    for fp, run in zip(prints, runs):
        given.setdefault(fp, [])
        name = _logger_name(run["meta"]) or fp
        if name not in given[fp]:
            given[fp].append(name)
    names = {fp: _pooled_name(run_names) for fp, run_names in given.items()}
    # Two experiments with the same logger name are told apart by their fingerprint.
    counts: dict[str, int] = {}
    for name in names.values():
        counts[name] = counts.get(name, 0) + 1
    return [names[fp] if counts[names[fp]] == 1 else f"{names[fp]}@{fp}" for fp in prints]


def _pooled_name(names: Sequence[str]) -> str:
    """The label of an experiment whose runs log under ``names``: the one name, or, for seeds logged under names
    of their own (``coqe_s0``, ``coqe_s1``), the part they share with ``*`` (``coqe_s*``), not the first run's."""
    if len(names) == 1:
        return names[0]
    shared = os.path.commonprefix(list(names))
    return f"{shared}*" if shared else f"{names[0]} (+{len(names) - 1} more names)"


def pooled_rows(runs: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> list[dict[str, Any]]:
    """Every row of every run, tagged with its experiment label and run index."""
    out = []
    for i, (run, label) in enumerate(zip(runs, labels)):
        for row in run["rows"]:
            out.append({**row, "experiment": label, "_run": i})
    return out


def choose_x(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The coordinate with the most distinct values (the natural column axis), if any."""
    coords: dict[str, set] = {}
    for row in rows:
        for k, v in row.items():
            if k not in ROW_KEYS and k not in ("experiment", "_run", *REPLICATE_COORDS):
                coords.setdefault(k, set()).add(v)
    varying = {k: len(v) for k, v in coords.items() if len(v) > 1}
    # Ties go to the coordinate the rows name first (IC-SSL's label_ratio before n_labeled).
    return max(varying, key=lambda k: varying[k]) if varying else None


def line_keys(chosen: Sequence[Mapping[str, Any]], x: str | None) -> list[str]:
    """What tells one line of a metric's rows from another: the experiment (when there are several), the method and
    every other coordinate that varies, except ``x``, the replicates and coordinates that ``x`` fixes."""
    ignore = {"value", "metric", "_run", x, *REPLICATE_COORDS}  # replicates are pooled into the cells
    keys = [k for k in dict.fromkeys(k for r in chosen for k in r) if k not in ignore]
    # Drop key columns that are constant across the table (e.g. one split, one experiment).
    keys = [k for k in keys if len({r.get(k) for r in chosen}) > 1 or k == "method"]
    if x is not None:
        # A coordinate fixed by x (IC-SSL's n_labeled by label_ratio) is a second name for the column, not a line.
        keys = [k for k in keys if k in ("method", "experiment") or not _function_of(chosen, k, x)]
    keys.sort(key=lambda k: k != "experiment")  # the experiment first, then the row's own keys
    return keys


def series_label(row: Mapping[str, Any], keys: Sequence[str]) -> str:
    """A figure's name for the line of ``row``: ``experiment: method, coordinate=value, ...``."""
    own = ", ".join(str(row.get(k)) if k == "method" else f"{k}={_fmt_x(row.get(k))}"
                    for k in keys if k != "experiment")
    return f"{row['experiment']}: {own}" if "experiment" in keys else own


def markdown_table(rows: Sequence[Mapping[str, Any]], metric: str, x: str | None) -> str:
    """A Markdown table of one metric: mean ± sd over runs per (experiment, method, coordinates) and ``x``."""
    chosen = [r for r in rows if r["metric"] == metric]
    keys = line_keys(chosen, x)
    xs = sorted({r.get(x) for r in chosen}, key=sort_key) if x else [None]
    stats = aggregate(chosen, [*keys, x] if x else keys)
    runs_per_cell = {v[2] for v in stats.values()}
    n_note = f"n = {min(runs_per_cell)}" if len(runs_per_cell) == 1 else f"n = {min(runs_per_cell)}-{max(runs_per_cell)}"
    header = [*keys, *([f"{x}={_fmt_x(v)}" for v in xs] if x else [metric])]
    lines = [f"**{metric}** ({n_note} runs per cell)", "", "| " + " | ".join(header) + " |",
             "|" + "---|" * len(header)]
    lines_of = sorted({k[: len(keys)] for k in stats}, key=lambda t: tuple(sort_key(v) for v in t))
    for lk in lines_of:
        cells = []
        for v in xs:
            key = (*lk, v) if x else lk
            cells.append(_fmt_cell(*stats[key]) if key in stats else "")
        lines.append("| " + " | ".join([*(str(c) for c in lk), *cells]) + " |")
    return "\n".join(lines)


def _function_of(rows: Sequence[Mapping[str, Any]], key: str, x: str) -> bool:
    """Whether ``key`` takes a single value for each value of ``x`` in ``rows``."""
    seen: dict[Any, Any] = {}
    for r in rows:
        if seen.setdefault(r.get(x), r.get(key)) != r.get(key):
            return False
    return True


def _fmt_x(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _fmt_cell(mean: float, sd: float, n: int) -> str:
    if mean == int(mean) and sd == 0 and abs(mean) >= 100:  # counts such as parameters
        return f"{int(mean)}"
    digits = 3 if abs(mean) < 100 else 1
    return f"{mean:.{digits}f} ± {sd:.{digits}f}" if n > 1 else f"{mean:.{digits}f}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lit_icl.report", description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run folders or results.json files")
    parser.add_argument("--labels", nargs="*", help="one experiment label per run (default: the logger name)")
    parser.add_argument("--metric", nargs="*", help="metrics to report (default: all)")
    parser.add_argument("--x", help="coordinate for the columns and the figure's x axis (default: automatic)")
    parser.add_argument("--split", default=None, help="only rows of this split")
    parser.add_argument("--out", help="write a figure of the first metric to this PNG file")
    parser.add_argument("--title", default="", help="title of the --out figure")

    def one_line(message: str) -> NoReturn:  # as the report's other refusals: one line, status 2, no usage block
        print(f"lit_icl.report: error: {message}", file=sys.stderr)
        sys.exit(2)

    parser.error = one_line  # type: ignore[method-assign]
    args = parser.parse_args(argv)
    if args.labels and len(args.labels) != len(args.runs):
        print(f"lit_icl.report: error: --labels has {len(args.labels)} entries for {len(args.runs)} runs; give one "
              "label per run, in the runs' order, or drop --labels to label each run by its logger name",
              file=sys.stderr)
        sys.exit(2)
    try:
        runs = [load_results(r) for r in args.runs]
    except (FileNotFoundError, ValueError) as err:
        print(f"lit_icl.report: error: {err}", file=sys.stderr)
        sys.exit(2)
    kept, notes = drop_repeats(runs, args.runs)
    for note in notes:
        print(f"lit_icl.report: note: {note}", file=sys.stderr)
    labels = label_runs([runs[i] for i in kept], [args.labels[i] for i in kept] if args.labels else None)
    rows = pooled_rows([runs[i] for i in kept], labels)
    if args.split:
        splits = sorted({str(r["split"]) for r in rows})
        rows = [r for r in rows if r["split"] == args.split]
        if not rows:
            print(f"lit_icl.report: error: --split {args.split}: the runs have no rows of that split; use one of "
                  f"{', '.join(splits) or 'none (the runs have no rows)'}", file=sys.stderr)
            sys.exit(2)
    metrics = args.metric or list(dict.fromkeys(r["metric"] for r in rows))
    missing = [m for m in metrics if not any(r["metric"] == m for r in rows)]
    if missing or not rows:
        there = sorted({r["metric"] for r in rows})
        print(f"lit_icl.report: error: no rows for metric(s) {', '.join(missing or metrics) or '(any)'}"
              + (f" in split {args.split}" if args.split else "") + "; "
              + (f"use --metric with one of {', '.join(there)}" if there else "the runs have no rows"), file=sys.stderr)
        sys.exit(2)
    if args.x and not any(args.x in r for r in rows if r["metric"] in metrics):
        coords = sorted({k for r in rows if r["metric"] in metrics for k in r} - {*ROW_KEYS, "experiment", "_run"})
        print(f"lit_icl.report: error: --x {args.x}: no row of {', '.join(metrics)} has that coordinate; use one of "
              f"{', '.join(coords) or 'none (the rows have no coordinates)'}", file=sys.stderr)
        sys.exit(2)

    def column(chosen: list[dict[str, Any]]) -> str | None:
        return args.x if args.x and any(args.x in r for r in chosen) else choose_x(chosen)

    if args.out:  # the figure's problems are refused before anything is printed
        _check_figure_file(args.out)
        metric = metrics[0]
        chosen = [r for r in rows if r["metric"] == metric]
        x = column(chosen)
        if x is None:
            print(f"lit_icl.report: error: --out {args.out}: the rows of {metric} have no coordinate to draw against; "
                  "report it as a table (no --out) or pick a --metric with one", file=sys.stderr)
            sys.exit(2)
    tables = []
    for name in metrics:
        of_metric = [r for r in rows if r["metric"] == name]
        tables.append(markdown_table(of_metric, name, column(of_metric)))
    print("\n\n".join(tables))
    if args.out:
        fig = report_figure(chosen, x, metric, args.title)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.out, dpi=PNG_DPI)  # one drawing; the format follows the extension


#: The most lines one panel of a report's figure draws; with more, the figure has a panel per value of a coordinate.
MAX_LINES = 8


def facet_key(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> str | None:
    """The coordinate to draw one panel per value of, when one panel would hold more than :data:`MAX_LINES` lines
    (CoQE regression's test: methods x 7 shifts): of the line keys other than the method and the experiment, the one
    with the most values. ``None`` when one panel will do."""
    if len({series_label(r, keys) for r in rows}) <= MAX_LINES:
        return None
    candidates = [k for k in keys if k not in ("method", "experiment")]
    return max(candidates, key=lambda k: len({r.get(k) for r in rows})) if candidates else None


def report_figure(chosen: Sequence[Mapping[str, Any]], x: str, metric: str, title: str = "") -> Figure:
    """The figure of ``metric``'s rows against ``x``: one line (or bar) per line of its table, the other coordinates
    (a test's shifts, manifolds) kept apart, in one panel, or one panel per value of :func:`facet_key`'s coordinate
    when there are too many lines to read in one."""
    keys = line_keys(chosen, x)
    if "method" in keys:  # a coordinate the method fixes (regression's `optimal`) is the table's, not a legend's
        keys = [k for k in keys if k in ("method", "experiment") or not _function_of(chosen, k, "method")]
    rows = [r for r in chosen if x in r]
    numeric = all(isinstance(r.get(x), (int, float)) and not isinstance(r.get(x), bool) for r in rows)
    draw = line_figure if numeric else bar_figure
    facet = facet_key(rows, keys)
    if facet is None:
        return draw([{**r, "series": series_label(r, keys)} for r in rows], x, series="series", title=title,
                    metric=metric)
    inner = [k for k in keys if k != facet]
    values = sorted({r.get(facet) for r in rows}, key=sort_key)
    ncols = min(3, len(values))
    nrows = -(-len(values) // ncols)
    fig = Figure(figsize=(4.6 * ncols, 3.4 * nrows), layout="constrained")
    for i, value in enumerate(values):  # y not shared: a shift's errors can be orders of magnitude apart
        ax = fig.add_subplot(nrows, ncols, i + 1)
        ax.grid(True, alpha=0.3)
        panel = [{**r, "series": series_label(r, inner)} for r in rows if r.get(facet) == value]
        draw(panel, x, series="series", title=f"{facet}={_fmt_x(value)}", metric=metric, ax=ax)
    if title:
        fig.suptitle(title)
    return fig


def figure_file_problem(out: str | Path) -> str | None:
    """Why matplotlib could not write a figure to ``out``, in words a refusal can end with, or ``None``: an
    extension it cannot write, or a folder on the way that is a file (a missing folder is made when saving)."""
    from matplotlib.figure import Figure

    path = Path(out)
    kinds = Figure().canvas.get_supported_filetypes()
    if path.suffix and path.suffix[1:].lower() not in kinds:
        return (f"matplotlib cannot write '{path.suffix}' files; end the name in one of "
                f"{', '.join('.' + k for k in sorted(kinds))}")
    folder = next((f for f in (path.parent, *path.parent.parents) if f.exists()), None)
    if folder is not None and not folder.is_dir():
        return f"{folder} is a file, not a folder; name a figure in a folder"
    return None


def _check_figure_file(out: str) -> None:
    """Refuse, before anything is drawn, a figure file matplotlib could not write (:func:`figure_file_problem`)."""
    problem = figure_file_problem(out)
    if problem is not None:
        print(f"lit_icl.report: error: --out {out}: {problem}", file=sys.stderr)
        sys.exit(2)

if __name__ == "__main__":
    main()
