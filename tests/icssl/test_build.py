"""IC-SSL's data builders (lit_icl/icssl/build.py): the image-manifold stand-in, the ImageFolder reader and
feature pooling, what the feature stand-in needs, and the command line (``python -m lit_icl.icssl.build``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch
from PIL import Image

from lit_icl.icssl.build import (
    build_image_standin,
    embed_images,
    main,
    read_image_folder,
    slerp,
    standin_missing,
)
from lit_icl.icssl.image_manifolds import read_sequences


def test_standin_builder_writes_smooth_sequences_in_the_layout(tmp_path) -> None:
    out = build_image_standin(tmp_path / "standin", sequences=2, frames=12, size=8, latent_dim=4, seed=0)
    assert sorted(p.name for p in out.iterdir()) == ["seq_0001", "seq_0002"]
    frames, _ = read_sequences(out, image_size=8)
    assert frames.shape == (2, 12, 64)
    steps = (frames[:, 1:] - frames[:, :-1]).norm(dim=-1)
    ends = (frames[:, -1] - frames[:, 0]).norm(dim=-1)
    assert (steps.max(-1).values < ends).all(), "consecutive frames are closer than the endpoints"
    again = build_image_standin(tmp_path / "again", sequences=2, frames=12, size=8, latent_dim=4, seed=0)
    torch.testing.assert_close(read_sequences(again, image_size=8)[0], frames)


def test_slerp_keeps_the_norm_between_equal_norm_endpoints() -> None:
    z0, z1 = torch.tensor([3.0, 0.0]), torch.tensor([0.0, 3.0])
    path = slerp(z0, z1, torch.linspace(0, 1, 5))
    torch.testing.assert_close(path[0], z0)
    torch.testing.assert_close(path[-1], z1)
    torch.testing.assert_close(path.norm(dim=-1), torch.full((5,), 3.0))


def test_image_folder_reader_and_pooling(tmp_path) -> None:
    for c, colour in enumerate([(255, 0, 0), (0, 0, 255)]):
        (tmp_path / f"class{c}").mkdir()
        for i in range(3):
            Image.new("RGB", (20, 12), colour).save(tmp_path / f"class{c}" / f"{i}.png")
    images, labels, classes = read_image_folder(tmp_path, size=8, per_class=2)
    assert images.shape == (4, 3, 8, 8) and labels.tolist() == [0, 0, 1, 1] and classes == ["class0", "class1"]
    red = (1.0 - 0.485) / 0.229
    assert images[0, 0].allclose(torch.full((8, 8), red), atol=1e-5)
    feats = embed_images(torch.nn.Conv2d(3, 5, 3), images, batch_size=3)
    assert feats.shape == (4, 5) and torch.equal(feats[0], feats[1])


def test_the_builders_defaults_are_what_the_data_modules_expect() -> None:
    from lit_icl.icssl import build, features, image_manifolds

    assert (build.IMAGE_STANDIN_ROOT, build.IMAGE_STANDIN_SEQUENCES, build.IMAGE_STANDIN_FRAMES,
            build.IMAGE_STANDIN_COMMAND) == (image_manifolds.STANDIN_ROOT, image_manifolds.STANDIN_SEQUENCES,
                                             image_manifolds.STANDIN_FRAMES, image_manifolds.STANDIN_COMMAND)
    assert (build.FEATURE_STANDIN_FILE, build.FEATURE_STANDIN_PER_CLASS) == (features.STANDIN_FILE,
                                                                             features.STANDIN_PER_CLASS)
    assert features.STANDIN_COMMAND == "python -m lit_icl.icssl.build features-standin --out {path}"


def test_what_the_build_lacks_is_named(tmp_path) -> None:
    assert standin_missing(tmp_path).startswith(f"Fashion-MNIST at {tmp_path}")


# ----------------------------------------------------------------------------------------------------------
# The command line: one subcommand per builder
# ----------------------------------------------------------------------------------------------------------
def test_image_standin_command_writes_what_the_function_writes(tmp_path, capsys) -> None:
    small = ["--sequences", "2", "--frames", "4", "--size", "8", "--latent-dim", "3", "--seed", "1"]
    assert main(["image-standin", "--out", str(tmp_path / "cli"), *small]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'cli'}"
    build_image_standin(tmp_path / "fn", sequences=2, frames=4, size=8, latent_dim=3, seed=1)
    assert torch.equal(read_sequences(tmp_path / "cli", 8)[0], read_sequences(tmp_path / "fn", 8)[0])


def test_build_commands_refuse_with_one_line(tmp_path, capsys) -> None:
    assert main(["features", "--images", str(tmp_path / "none"), "--out", str(tmp_path / "f.pt")]) == 2
    assert capsys.readouterr().err.strip() == f"lit_icl: error: no class folders under {tmp_path / 'none'}: " \
                                              "expected an ImageFolder (ROOT/<class>/<image>.jpg)"
    assert main(["image-standin", "--out", str(tmp_path / "s"), "--frames", "1"]) == 2
    assert "frames" in capsys.readouterr().err and not (tmp_path / "s").exists()
    if importlib.util.find_spec("diffusers") is None:  # without diffusers: how to build the stand-in instead
        assert main(["stable-diffusion", "--model", "none", "--out", str(tmp_path / "sd")]) == 2
        assert f"python -m lit_icl.icssl.build image-standin --out {tmp_path / 'sd'}" in capsys.readouterr().err


@pytest.mark.slow  # 7 s of imports in a fresh interpreter; tests/test_repository.py checks the imports from source
def test_build_runs_as_a_module_and_lists_its_commands() -> None:
    done = subprocess.run([sys.executable, "-m", "lit_icl.icssl.build", "--help"], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0 and done.stderr == ""  # no runpy warning: the package does not import build
    for command in ("image-standin", "stable-diffusion", "features", "features-standin"):
        assert command in done.stdout


def test_build_lists_its_commands(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert all(command in text for command in ("image-standin", "stable-diffusion", "features", "features-standin"))


@pytest.mark.parametrize("command", ["image-standin", "stable-diffusion", "features", "features-standin"])
def test_every_command_has_its_options(command, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    options = {"image-standin": ["--out", "--sequences", "--frames", "--size", "--latent-dim", "--seed"],
               "stable-diffusion": ["--model", "--out", "--sequences", "--frames", "--seed", "--steps", "--device"],
               "features": ["--images", "--out", "--backbone", "--layer", "--size", "--per-class"],
               "features-standin": ["--out", "--per-class", "--size"]}[command]
    text = capsys.readouterr().out
    assert all(option in text for option in options)
