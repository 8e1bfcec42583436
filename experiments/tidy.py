"""A grid's results as one tidy CSV, and the same records read back from either the CSV or the run folders.

A driver's ``report`` reads its grid through :func:`load`, which takes either the grid's run folder (``--out
runs/<grid>``: every run folder under it with a ``done`` marker) or a CSV this module wrote (``--out
experiments/results/grids/<grid>.csv``), so a committed table is regenerated from the committed CSV alone, with no run
folders and no machine paths:

    python experiments/icssl_paper_tables.py report --out runs/icssl_converged --csv experiments/results/grids/icssl_converged.csv
    python experiments/icssl_paper_tables.py report --out experiments/results/grids/icssl_converged.csv   # the same tables

The CSV has one row per run and metric. Its columns:

- ``run``: the run folder relative to the grid's folder (``tuned_rbf_only_spiral/s0_test_manifolds``);
- ``seed`` (``seed_everything``), ``metric``, ``value``;
- ``steps``: the steps the run trained (a fit's stopping step) or that its tested checkpoint had trained;
- ``cpu_s``: the job's CPU seconds; ``commit``: the commit of the code that ran it, where it was recorded;
- then the keys of the run's ``results.json`` rows that say which number a row is (``method``, ``split``,
  ``manifold``, ``n_labeled`` ...);
- then ``config.<key>``: every config value that differs between the grid's runs (paths, loggers and callbacks
  left out), so a row says what was run without its run folder.

Besides the ``results.json`` rows, a run has a ``wall_s`` row (the job's wall-clock seconds), ``stopping.<field>``
rows (its own early-stopping record, ``stopping.json``) and ``meta.stopping.<field>`` rows (the record of the
checkpoint a test scored, ``meta.stopping``). A driver whose report reads logged curves names their TensorBoard
tags (:data:`Scalars`); each logged point is a ``logged.<tag>`` row whose ``steps`` is the point's step, so the
curves, too, come back from the CSV. Values keep their JSON types: a string that would read as a
number or a boolean is written quoted.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner import logged_scalars, read_done

#: The logged TensorBoard tags a report reads, each with how many of its last points it needs (``None``: all).
Scalars = Mapping[str, int | None]
#: The columns every row has, in this order; the row keys of ``results.json`` and the config values follow.
RUN_COLUMNS = ("run", "seed", "metric", "value", "steps", "cpu_s", "commit")
#: Config keys (dotted, ``init_args`` left out) that never go into the CSV: where a run wrote, not what it ran.
SKIPPED_CONFIG = ("trainer.logger", "trainer.callbacks", "trainer.enable_progress_bar", "trainer.default_root_dir",
                  "ckpt_path", "compile")


@dataclass
class RunRecord:
    """What a grid's report reads of one finished run."""

    #: The job's wall-clock seconds (``None``: run by hand, without the runner's ``done`` marker).
    wall: float | None = None
    cpu: float | None = None
    commit: str | None = None
    #: ``results.json`` of a test run (``{"rows": [...], "meta": {"trained_steps", "stopping"}}``), else ``None``.
    results: dict[str, Any] | None = None
    #: ``stopping.json`` of a fit that used the early-stopping rule, else ``None``.
    stopping: dict[str, Any] | None = None
    #: The run's config, flattened to dotted keys (``model.net.head.kernel``; ``init_args`` left out).
    config: dict[str, Any] = field(default_factory=dict)
    #: ``{tag: {step: value}}``: the logged points of the TensorBoard tags the report asked for.
    scalars: dict[str, dict[int, float]] = field(default_factory=dict)

    @property
    def seed(self) -> Any:
        return self.config.get("seed_everything")


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A config as ``{dotted key: leaf}``, with ``init_args`` levels dropped (``model.net.head.kernel``) and lists
    of plain values kept whole (``data.train_manifolds: [spiral]``)."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flatten(value, prefix if key == "init_args" else f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(tree, list) and any(isinstance(x, (dict, list)) for x in tree):
        out = {}
        for i, value in enumerate(tree):
            out.update(flatten(value, f"{prefix}.{i}"))
        return out
    return {prefix: tree}


def _kept(key: str, value: Any) -> bool:
    """Whether a config value says what was run (not where it wrote or read: no absolute paths)."""
    if any(key == s or key.startswith(s + ".") for s in SKIPPED_CONFIG):
        return False
    return not (isinstance(value, str) and value.startswith("/"))


def read_run(folder: Path, scalars: Scalars | None = None) -> RunRecord:
    """One finished run folder's record (its ``done`` marker, ``results.json``, ``stopping.json``, config, and the
    last points of the logged ``scalars``)."""
    import yaml

    wall, cpu, commit = None, None, None
    if (folder / "done").is_file():
        wall, cpu = read_done(folder)
        commit = next((line.split()[1] for line in (folder / "done").read_text().splitlines()
                       if line.startswith("commit ")), None)
    results = json.loads((folder / "results.json").read_text()) if (folder / "results.json").is_file() else None
    stopping = json.loads((folder / "stopping.json").read_text()) if (folder / "stopping.json").is_file() else None
    config = yaml.safe_load((folder / "config.yaml").read_text()) if (folder / "config.yaml").is_file() else None
    if config is None and results is not None:
        config = results.get("meta", {}).get("config")
    if results is not None:  # what the reports read of the provenance; the rest names the machine's paths
        meta = results.get("meta", {})
        results = {"rows": results["rows"],
                   "meta": {"trained_steps": meta.get("trained_steps"), "stopping": meta.get("stopping")}}
    logged = {}
    if scalars and any(folder.glob("events.out.tfevents.*")):
        for tag, points in logged_scalars(folder, list(scalars)).items():
            keep = sorted(points)[-scalars[tag]:] if scalars[tag] is not None else sorted(points)
            if keep:
                logged[tag] = {step: points[step] for step in keep}
    return RunRecord(wall, cpu, commit, results, stopping, flatten(config or {}), logged)


#: The files that mark a finished run: the runner's marker, a test's results, a fit's early-stopping record (the
#: last two also in runs made by hand, without the runner).
FINISHED = ("done", "results.json", "stopping.json")


def is_summary(folder: Path) -> bool:
    """Whether ``folder`` holds a summary of other runs rather than a run: a ``results.json`` whose ``meta`` has
    ``summary_of`` (the runs it pools), as the IC-SSL sweep's report writes into ``<grid>/sweep``. Its rows are
    means over the grid's runs, which a table of the runs would otherwise list again as one more run."""
    try:
        meta = json.loads((folder / "results.json").read_text()).get("meta")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(meta, dict) and "summary_of" in meta


def read_folders(root: Path, scalars: Scalars | None = None) -> dict[str, RunRecord]:
    """Every finished run under ``root`` (a folder with one of :data:`FINISHED`, and no summary of other runs:
    :func:`is_summary`), by its path relative to ``root``."""
    folders = sorted({path.parent for name in FINISHED for path in root.rglob(name) if path.is_file()})
    return {folder.relative_to(root).as_posix(): read_run(folder, scalars) for folder in folders
            if not is_summary(folder)}


def _encode(value: Any) -> str:
    """A cell: JSON for everything but strings; a string as itself unless it would read back as something else."""
    if value is None:
        return ""
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return value
        return json.dumps(value)
    return json.dumps(value)


def _decode(cell: str) -> Any:
    try:
        return json.loads(cell)
    except ValueError:
        return cell


def varying_config(records: dict[str, RunRecord]) -> list[str]:
    """The config keys whose values differ between the runs that have them, paths left out.

    A key that only some runs have, always with one value (an argument of one net class), is left out: the
    ``class_path`` beside it, which does vary, says which runs have it."""
    seen: dict[str, set[str]] = {}
    for record in records.values():
        for key, value in record.config.items():
            if key != "seed_everything" and _kept(key, value):
                seen.setdefault(key, set()).add(json.dumps(value, sort_keys=True))
    return sorted(k for k, values in seen.items() if len(values) > 1)


def rows(records: dict[str, RunRecord]) -> list[dict[str, Any]]:
    """The tidy rows of a grid: per run, its ``results.json`` rows, ``wall_s``, and its stopping records."""
    config_keys = varying_config(records)
    out = []
    for run, record in records.items():
        steps = None
        if record.results is not None:
            steps = record.results["meta"].get("trained_steps")
        elif record.stopping is not None:
            steps = record.stopping.get("stopped_step")
        base = {"run": run, "seed": record.seed, "steps": steps, "cpu_s": record.cpu, "commit": record.commit,
                **{f"config.{k}": record.config[k] for k in config_keys if k in record.config}}
        if record.wall is not None:
            out.append({**base, "metric": "wall_s", "value": record.wall})
        for prefix, stopping in (("stopping", record.stopping),
                                 ("meta.stopping", (record.results or {}).get("meta", {}).get("stopping"))):
            out.extend({**base, "metric": f"{prefix}.{k}", "value": v} for k, v in (stopping or {}).items())
        for tag, points in record.scalars.items():
            out.extend({**base, "metric": f"logged.{tag}", "steps": step, "value": v} for step, v in points.items())
        for row in (record.results or {}).get("rows", []):
            # A key that repeats the run's own column (I2CL's rows carry their seed) is that column.
            clash = {k for k in set(row) & (set(RUN_COLUMNS) - {"metric", "value"}) if row[k] != base[k]}
            if clash:
                raise ValueError(f"{run}: a results row has the key {min(clash)!r}, which names a column of "
                                 "every row, with another value; rename it in the module's results")
            out.append({**base, **row})
    return out


def write(records: dict[str, RunRecord], path: Path) -> int:
    """Write a grid's tidy CSV; returns the number of rows."""
    table = rows(records)
    keys: dict[str, None] = dict.fromkeys(RUN_COLUMNS)
    config: dict[str, None] = {}
    for row in table:
        for key in row:
            (config if key.startswith("config.") else keys).setdefault(key, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*keys, *sorted(config)], lineterminator="\n")
        writer.writeheader()
        for row in table:
            writer.writerow({k: _encode(v) for k, v in row.items()})
    return len(table)


def read_csv(path: Path) -> dict[str, RunRecord]:
    """A grid's records back from its tidy CSV (the inverse of :func:`write` for what the reports read)."""
    records: dict[str, RunRecord] = {}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in RUN_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise SystemExit(f"{path} is not a grid's tidy CSV: it has no column {', '.join(missing)} (write one with "
                             "a driver's `report --csv`)")
        for cells in reader:
            row = {k: _decode(v) for k, v in cells.items() if v != ""}
            run, metric, value = row.pop("run"), row.pop("metric"), row.pop("value", None)
            steps, cpu, commit, seed = (row.pop(k, None) for k in ("steps", "cpu_s", "commit", "seed"))
            record = records.get(run)
            if record is None:
                config = {k.removeprefix("config."): v for k, v in row.items() if k.startswith("config.")}
                if seed is not None:
                    config["seed_everything"] = seed
                record = records[run] = RunRecord(None, cpu, None if commit is None else str(commit), config=config)
            keys = {k: v for k, v in row.items() if not k.startswith("config.")}
            if metric == "wall_s":
                record.wall = value
            elif metric.startswith("stopping."):
                record.stopping = {**(record.stopping or {}), metric.removeprefix("stopping."): value}
            elif metric.startswith("logged."):
                record.scalars.setdefault(metric.removeprefix("logged."), {})[int(steps)] = float(value)
            elif metric.startswith("meta.stopping."):
                meta = _results(record, steps)["meta"]
                meta["stopping"] = {**(meta["stopping"] or {}), metric.removeprefix("meta.stopping."): value}
            else:
                _results(record, steps)["rows"].append({"metric": metric, "value": value, **keys})
    return records


def _results(record: RunRecord, steps: Any) -> dict[str, Any]:
    if record.results is None:
        record.results = {"rows": [], "meta": {"trained_steps": steps, "stopping": None}}
    return record.results


def load(source: Path, scalars: Scalars | None = None) -> dict[str, RunRecord]:
    """A grid's finished runs from its run folder or from its tidy CSV (a path ending in ``.csv``), with the logged
    ``scalars`` the report reads."""
    if source.suffix == ".csv":
        if not source.is_file():
            raise SystemExit(f"no such results CSV: {source}")
        return read_csv(source)
    return read_folders(source, scalars) if source.is_dir() else {}


def add_report_args(parser: Any) -> None:
    """``--csv FILE``: ``report`` also writes the grid's tidy CSV (see the module docstring)."""
    parser.add_argument("--csv", type=Path, default=None,
                        help="report: also write the grid's runs as a tidy CSV here (one row per run and metric); "
                             "`report --out FILE.csv` reads such a file back instead of the run folders")


def check_out(parser: Any, args: Any) -> None:
    """``fit`` and ``test`` train into ``--out``: refuse a CSV there, and a ``--csv`` that is ``report``'s input."""
    if args.stage != "report" and args.out.suffix == ".csv":
        parser.error(f"--out {args.out} is a results CSV; `{args.stage}` needs a run folder (e.g. runs/<grid>)")
    if args.csv is not None and args.csv.resolve() == args.out.resolve():
        parser.error(f"--csv {args.csv} is the file --out reads; name another file")
    if args.stage == "report" and args.out.is_file() and args.out.suffix != ".csv":
        parser.error(f"--out {args.out} is a file but not a grid's tidy CSV; name the grid's folder (or its "
                     "report --csv file)")
    if args.csv is not None and args.csv.suffix != ".csv":  # what `runner.py tidy` refuses too
        parser.error(f"--csv {args.csv}: a tidy CSV's name ends in .csv; name the file so")


def grid_records(args: Any, scalars: Scalars | None = None) -> dict[str, RunRecord]:
    """The records ``report`` reads (``args.out``: a run folder or a tidy CSV), with the logged ``scalars`` it reads,
    writing ``args.csv`` when given."""
    records = load(args.out, scalars)
    if args.csv is not None:
        n = write(records, args.csv)
        print(f"{n} rows of {len(records)} runs written to {args.csv}", file=sys.stderr)
    return records


if __name__ == "__main__":
    from runner import not_a_command

    not_a_command(__file__, "write a grid's tidy CSV with `python experiments/runner.py tidy RUNS_FOLDER OUT.csv` or "
                  "a driver's `report --out RUNS_FOLDER --csv OUT.csv`")
