"""``benchmarks/configs_smoke.py`` runs each config the way the README says: overlays stacked on their base,
parameter-free baselines with ``test``, I2CL's configs only when asked."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).parents[1]


def _smoke():
    spec = importlib.util.spec_from_file_location("configs_smoke", ROOT / "benchmarks/configs_smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_config_is_listed_once_with_its_base_and_subcommand() -> None:
    smoke = _smoke()
    configs = smoke.list_configs()
    assert len(configs) == len({str(c) for c in configs}) > 40
    assert not any(c.parts[1] == "i2cl" for c in configs)
    assert any(c.parts[1] == "i2cl" for c in smoke.list_configs(include_i2cl=True))
    assert smoke.command(Path("configs/mmca/avmnist/no_injection.yaml")) == [
        "python", "-m", "lit_icl", "fit", "--config", "configs/mmca/avmnist.yaml",
        "--config", "configs/mmca/avmnist/no_injection.yaml", "--trainer.fast_dev_run", "true"]
    assert smoke.command(Path("configs/icssl/manifolds/eig_lr.yaml"))[3] == "test"
    assert smoke.command(Path("configs/coqe/regression.yaml"))[3] == "fit"  # its `test` line needs a checkpoint
    # An overlay whose header stacks it after another overlay runs as its header says.
    assert smoke.stack(Path("configs/coqe/regression/curriculum.yaml")) == [
        Path(f"configs/coqe/regression{v}.yaml") for v in ("", "/cpu", "/transformer", "/curriculum")]
    assert smoke.stack(Path("configs/coqe_omniglot.yaml")) == [Path("configs/coqe_omniglot.yaml")]
    bases = [c for c in configs if len(c.parts) == 3]
    assert all(smoke.stack(c) == [c] for c in bases)


def test_a_rerun_keeps_the_notes_below_the_marker(tmp_path: Path) -> None:
    smoke = _smoke()
    out = tmp_path / "table.md"
    assert smoke.kept_notes(out) == ""
    out.write_text(f"old table\n\n{smoke.NOTES_MARKER}\n## Found\n- a fix\n")
    assert smoke.kept_notes(out) == f"\n{smoke.NOTES_MARKER}\n## Found\n- a fix\n"
    out.write_text("old table only\n")
    assert smoke.kept_notes(out) == ""
