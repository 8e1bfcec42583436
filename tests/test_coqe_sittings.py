"""experiments/coqe_sittings.py: CoQE and its baseline trained in sittings, packed for the next machine."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import load_script, quiet_run_args
from coqe.omniglot.helpers import coqe_args

sittings = load_script(Path(__file__).resolve().parents[1] / "experiments/coqe_sittings.py")


def fake_run(state: Path, arm: str, step: int, seconds: float, version: int = 0) -> Path:
    """A run folder as a sitting leaves it: ``last.ckpt`` with its step and Lightning's timer, a config, a log."""
    folder = state / arm / f"version_{version}"
    (folder / "checkpoints").mkdir(parents=True)
    torch.save({"global_step": step, "callbacks": {"Timer": {"time_elapsed": {"train": seconds}}}},
               folder / "checkpoints/last.ckpt")
    (folder / "config.yaml").write_text(f"# {arm}\n")
    (folder / "events.out.tfevents.1.host").write_bytes(b"\x00events")
    return folder


def test_max_time_is_lightnings_dd_hh_mm_ss() -> None:
    assert sittings.max_time(59.6) == "00:00:01:00"
    assert sittings.max_time(90061) == "01:01:01:01"


def test_a_sitting_resumes_each_run_until_its_time_so_far_plus_the_sitting(tmp_path: Path) -> None:
    assert sittings.trained_so_far(tmp_path, "coqe") == (0, 0.0)
    first = sittings.fit_command(tmp_path, "coqe", 240, "reduce-overhead", ["--seed_everything", "1"])
    assert "--ckpt_path" not in first and first[first.index("--trainer.max_time") + 1] == "00:00:04:00"
    assert first[-2:] == ["--seed_everything", "1"] and first[first.index("--compile.mode") + 1] == "reduce-overhead"
    fake_run(tmp_path, "transformer", 1234, 250.0)
    assert sittings.trained_so_far(tmp_path, "transformer") == (1234, 250.0)
    again = sittings.fit_command(tmp_path, "transformer", 250.0 + 240, "off", [])
    # off is named: the CLI's default, auto, would compile on a GPU
    assert again[again.index("--ckpt_path") + 1] == "last" and again[again.index("--compile.mode") + 1] == "off"
    assert again[again.index("--trainer.max_time") + 1] == "00:00:08:10"
    assert again.count("--config") == 2
    # A sitting killed before its first checkpoint left a folder without last.ckpt: the next starts afresh.
    (tmp_path / "coqe" / "version_0").mkdir(parents=True)
    assert "--ckpt_path" not in sittings.fit_command(tmp_path, "coqe", 240, "off", [])


def test_pack_then_unpack_gives_back_each_runs_folder(tmp_path: Path) -> None:
    """Two files per run (at most 16 MiB each, as a device machine returns them) and the curves; unpacked into
    another state folder they are the runs' folders again, checkpoints in place, so a next sitting resumes."""
    for arm, step in (("coqe", 10), ("transformer", 20)):
        fake_run(tmp_path / "state", arm, step, 60.0, version=1)
    sittings.pack(tmp_path / "state", tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "coqe_last.ckpt", "coqe_run.tar.gz", "curves.csv", "transformer_last.ckpt", "transformer_run.tar.gz"]
    sittings.main(["--state", str(tmp_path / "next"), "unpack", "--from", str(tmp_path / "out")])
    for arm, step in (("coqe", 10), ("transformer", 20)):
        old, new = tmp_path / "state" / arm / "version_1", tmp_path / "next" / arm / "version_1"
        assert sorted(p.relative_to(new) for p in new.rglob("*")) == sorted(p.relative_to(old) for p in old.rglob("*"))
        assert (new / "config.yaml").read_text() == f"# {arm}\n"
        assert sittings.trained_so_far(tmp_path / "next", arm) == (step, 60.0)


def test_pack_keeps_the_run_that_trained_when_the_other_has_no_checkpoint_yet(tmp_path: Path, capsys) -> None:
    """A sitting whose Transformer failed before its first checkpoint (out of memory, say) ended in a
    FileNotFoundError traceback while packing, after the CoQE run had trained its sitting, which was then not packed
    for the next machine either."""
    fake_run(tmp_path / "state", "coqe", 10, 60.0)
    (tmp_path / "state" / "transformer" / "version_0").mkdir(parents=True)
    sittings.pack(tmp_path / "state", tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["coqe_last.ckpt", "coqe_run.tar.gz", "curves.csv"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "transformer/version_0 has no checkpoints/last.ckpt yet" in err[0], err
    sittings.main(["--state", str(tmp_path / "next"), "unpack", "--from", str(tmp_path / "out")])
    assert sittings.trained_so_far(tmp_path / "next", "coqe") == (10, 60.0)


_STAND_IN_RUN = """import pathlib, signal, sys, time
marker = pathlib.Path(sys.argv[1])
def saved(signum, frame):  # a fit's SIGTERM: it saves its last.ckpt and exits 143
    marker.write_text("saved")
    sys.exit(143)
signal.signal(signal.SIGTERM, saved)
marker.with_suffix(".started").write_text("")
time.sleep(60)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_stopped_sitting_stops_both_runs_and_still_packs_them(tmp_path: Path, monkeypatch, capsys, signum) -> None:
    """SIGTERM (``timeout``, the end of a lease) killed the driver alone: both runs trained on as orphans and nothing
    was packed for the next machine; Ctrl-C ended it in a KeyboardInterrupt traceback, unpacked too."""
    state, script = tmp_path / "state", tmp_path / "run.py"
    script.write_text(_STAND_IN_RUN)
    for arm in sittings.ARMS:
        fake_run(state, arm, 10, 60.0)
    monkeypatch.setattr(sittings, "fit_command", lambda state, arm, *rest: [sys.executable, str(script),
                                                                            str(tmp_path / f"{arm}.marker")])

    def stop_when_both_run() -> None:
        while not all((tmp_path / f"{arm}.started").is_file() for arm in sittings.ARMS):
            time.sleep(0.02)
        os.kill(os.getpid(), signum)

    threading.Thread(target=stop_when_both_run, daemon=True).start()
    previous = signal.getsignal(signum)
    with pytest.raises(SystemExit) as stop:
        sittings.main(["--state", str(state), "sit", "--seconds", "60", "--out", str(tmp_path / "out")])
    assert stop.value.code == 128 + signum
    assert all((tmp_path / f"{arm}.marker").read_text() == "saved" for arm in sittings.ARMS)
    assert {"coqe_last.ckpt", "transformer_last.ckpt"} <= {p.name for p in (tmp_path / "out").iterdir()}
    name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
    assert f"coqe_sittings: stopped by {name}; each run saved its last.ckpt" in capsys.readouterr().err
    assert signal.getsignal(signum) is previous  # the driver's own handlers are gone with the sitting


def test_a_sitting_of_no_time_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        sittings.main(["--state", str(tmp_path), "sit", "--seconds", "0"])
    assert exit_info.value.code == 2 and "--seconds 0.0 must be positive" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_unpacking_a_folder_without_packed_runs_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    fake_run(tmp_path / "state", "coqe", 10, 60.0)
    sittings.pack(tmp_path / "state", tmp_path / "out")
    (tmp_path / "out/coqe_last.ckpt").unlink()
    for source, needle in ((tmp_path / "nowhere", "no packed runs"), (tmp_path / "out", "coqe_last.ckpt missing")):
        with pytest.raises(SystemExit) as exit_info:
            sittings.main(["--state", str(tmp_path / "next"), "unpack", "--from", str(source)])
        assert exit_info.value.code == 2 and needle in capsys.readouterr().err
    assert not (tmp_path / "next").exists()


@pytest.mark.slow  # four CLI runs in subprocesses, two at a time: about a minute on 2 cores
def test_two_sittings_on_two_machines_continue_both_runs(tmp_path: Path) -> None:
    """Tiny CoQE and Transformer runs: a sitting, packed; unpacked elsewhere; a second sitting goes on from the
    first one's steps in the same run folders and validation curves."""
    base = quiet_run_args(tmp_path, "configs/coqe/omniglot.yaml")
    tiny = [*coqe_args(tmp_path)[len(base):], "--trainer.max_steps", "100000"]
    # 8 s a sitting: with both arms on this machine's 2 cores, a sitting's first steps have taken up to 5 s of its
    # training time, and the test needs each sitting to reach a validation round (2 steps).
    sittings.main(["--state", str(tmp_path / "a"), "sit", "--seconds", "8", "--compile", "off",
                   "--out", str(tmp_path / "out"), "--set", *tiny])
    steps = {arm: sittings.trained_so_far(tmp_path / "a", arm)[0] for arm in sittings.ARMS}
    assert all(s > 0 for s in steps.values()), steps
    sittings.main(["--state", str(tmp_path / "b"), "unpack", "--from", str(tmp_path / "out")])
    sittings.main(["--state", str(tmp_path / "b"), "sit", "--seconds", "8", "--compile", "off", "--set", *tiny])
    for arm in sittings.ARMS:
        assert sittings.trained_so_far(tmp_path / "b", arm)[0] > steps[arm]
        assert [p.name for p in (tmp_path / "b" / arm).iterdir() if p.is_dir()] == ["version_0"]
    icl = sittings.curves(tmp_path / "b")["coqe"]["val/acc/icl"]
    assert min(icl) < steps["coqe"] < max(icl)  # validation rounds of both sittings
