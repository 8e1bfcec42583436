"""Reading a YAML config file's syntax, without Lightning: shared by the CLI (``--config``) and the grid drivers
(``--overlay``), which check their files before anything is written."""

from __future__ import annotations

from pathlib import Path

from lit_icl.core.errors import ConfigError

#: The top-level keys of a config that always hold keys of their own (``optimizer: null`` and
#: ``lr_scheduler: null`` are meaningful: a fit's saved config.yaml writes them so).
SECTIONS = frozenset({"model", "data", "trainer", "compile", "early_stopping", "checkpoint"})


def check_config_file(raw: str) -> None:
    """Refuse a config file that cannot be read, is not valid YAML (naming the line and problem), is empty or does
    not hold a mapping. Only the syntax is read (``yaml.compose``); what the values mean is the parser's business."""
    import yaml

    try:
        text = Path(raw).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"--config {raw} cannot be read ({type(err).__name__}: {err}); pass a UTF-8 YAML file")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = " ".join(str(err.problem or err.context or "invalid syntax").split())
        raise ConfigError(f"--config {raw} is not valid YAML{where}: {problem}; fix that line") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"--config {raw} is not valid YAML: {' '.join(str(err).split())}") from None
    if node is None:
        raise ConfigError(
            f"--config {raw} is empty; give it the keys of a config (e.g. copy configs/coqe/regression.yaml) "
            "or drop it"
        )
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(
            f"--config {raw} holds a YAML {node.id} at its top level, not a mapping of keys "
            "(model:, data:, trainer: ...); see configs/ for examples"
        )
    for key, value in node.value:
        # A section left with nothing under it (its keys commented out) is null, which would not leave the base
        # config's section alone but unset it: the parser then fails far from this file, or with a traceback.
        if key.value in SECTIONS and value.tag == "tag:yaml.org,2002:null":
            raise ConfigError(
                f"--config {raw}: `{key.value}:` at line {key.start_mark.line + 1} is empty, which would unset the "
                f"{key.value} of the configs before it; give it keys or delete the line"
            )
