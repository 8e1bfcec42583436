"""Corrupted avMNIST (mmca Sec. 7, Table 1; App. I): nets against a hand-written reference and Table 1's
parameter counts, the MultiBench-layout reader and the seeded corruption on tiny fixtures, the avmnist_lite
builder on a two-digit, two-voice miniature (tone synthesizer; the espeak-ng path when installed), and the
CLI end to end with its bad-input table."""

from __future__ import annotations

import glob
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from badinput import assert_rejected

from lit_icl.cli import main
from lit_icl.core.errors import ConfigError
from lit_icl.core.nets import count_parameters
from lit_icl.mmca.avmnist_build import (
    MAX_FREQ,
    SPEC_SIZE,
    WORDS,
    EngineSynthesizer,
    Voice,
    build_avmnist_lite,
    read_wav,
    spectrogram,
)
from lit_icl.mmca.avmnist_data import AVMNISTDataModule, load_split, missing_data_message
from lit_icl.mmca.avmnist_module import AVMNISTModule
from lit_icl.mmca.avmnist_nets import BidirectionalCrossAttention, MultimodalCrossAttention

# ---------------------------------------------------------------------------------------------- nets


@pytest.mark.parametrize(
    ("net", "ours", "table1"),
    [
        (lambda: MultimodalCrossAttention(True, True), 43_754, 4.36e4),
        (lambda: MultimodalCrossAttention(True, False), 38_314, 3.82e4),
        (lambda: MultimodalCrossAttention(False, True), 43_722, 4.36e4),
        (lambda: MultimodalCrossAttention(False, False), 38_282, 3.82e4),
        (lambda: BidirectionalCrossAttention(), 60_746, 6.07e4),
    ],
)
def test_parameter_counts_match_table_1(net, ours: int, table1: float) -> None:
    n = count_parameters(net())
    assert n == ours
    assert abs(n - table1) / table1 < 0.01


def _mha(q: torch.Tensor, kv: torch.Tensor, attn: torch.nn.MultiheadAttention) -> torch.Tensor:
    """Softmax multi-head attention written out from the module's weights (no dropout)."""
    d, h = q.shape[-1], attn.num_heads
    wq, wk, wv = attn.in_proj_weight.split(d)
    bq, bk, bv = attn.in_proj_bias.split(d)

    def heads(x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], h, d // h).transpose(1, 2)

    qh, kh, vh = heads(q @ wq.T + bq), heads(kv @ wk.T + bk), heads(kv @ wv.T + bv)
    scores = qh @ kh.transpose(-1, -2) / math.sqrt(d // h)
    out = (scores.softmax(-1) @ vh).transpose(1, 2).reshape(q.shape)
    return out @ attn.out_proj.weight.T + attn.out_proj.bias


def _ln(x: torch.Tensor, ln: torch.nn.LayerNorm) -> torch.Tensor:
    mu = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    return (x - mu) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias


def _ffn(x: torch.Tensor, ffn: torch.nn.Module) -> torch.Tensor:
    l1, l2 = ffn.net[0], ffn.net[3]
    return F.gelu(x @ l1.weight.T + l1.bias) @ l2.weight.T + l2.bias


def _head(h: torch.Tensor, head: torch.nn.Sequential) -> torch.Tensor:
    return _ffn(_ln(h, head[0]), type("H", (), {"net": [head[1], None, None, head[4]]})())


def _tokens(
    net: torch.nn.Module, image: torch.Tensor, audio: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """App. I.2 tokenizers written with functional ops: tokens are the 4x4 grid cells in row-major order."""

    def phi(x: torch.Tensor, tok: torch.nn.Module) -> torch.Tensor:
        c = [m for m in tok.body if isinstance(m, torch.nn.Conv2d)]
        x = F.relu(
            F.conv2d(
                F.relu(F.conv2d(x, c[0].weight, c[0].bias, padding=1)), c[1].weight, c[1].bias, padding=1
            )
        )
        x = F.max_pool2d(x, 2)
        x = F.relu(
            F.conv2d(
                F.relu(F.conv2d(x, c[2].weight, c[2].bias, padding=1)), c[3].weight, c[3].bias, padding=1
            )
        )
        x = F.adaptive_avg_pool2d(F.max_pool2d(x, 2), 4)
        return _ln(x.permute(0, 2, 3, 1).reshape(x.shape[0], 16, -1), tok.norm)

    t = net.tokens
    xi, xa = phi(image, t.image) + t.pos_image, phi(audio, t.audio) + t.pos_audio
    if t.mod_image is not None:
        xi, xa = xi + t.mod_image, xa + t.mod_audio
    return xi, xa


def _reference_paper_model(
    net: MultimodalCrossAttention, image: torch.Tensor, audio: torch.Tensor
) -> torch.Tensor:
    """App. I.3 equation by equation: F_0 = X W0^T + b0; A = MHA(LN F, LN X, LN X) (or self-attention);
    F~ = F + A; S = sigmoid(F~ WG^T + bG) * (X WS^T + bS); F- = F~ + S; F = F- + FFN(LN F-); head(F_T[CLS])."""
    xi, xa = _tokens(net, image, audio)
    x = torch.cat([net.cls.expand(len(image), 1, -1), xi, xa], 1)
    f = x @ net.init_state.weight.T + net.init_state.bias
    for layer in net.layers:
        q = _ln(f, layer.norm_state)
        kv = _ln(x, net.norm_x) if net.cross_attention else q
        f = f + _mha(q, kv, layer.attn)
        if net.injection:
            gate = torch.sigmoid(f @ layer.gate.weight.T + layer.gate.bias)
            f = f + gate * (x @ layer.inject.weight.T + layer.inject.bias)
        f = f + _ffn(_ln(f, layer.norm_ffn), layer.ffn)
    return _head(f[:, 0], net.head)


@pytest.mark.parametrize(("ca", "inj"), [(True, True), (True, False), (False, True), (False, False)])
def test_paper_models_match_the_appendix_equations(ca: bool, inj: bool) -> None:
    torch.manual_seed(0)
    net = MultimodalCrossAttention(ca, inj, depth=3).eval()
    image, audio = torch.rand(5, 1, 28, 28), torch.rand(5, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(
            net(image, audio), _reference_paper_model(net, image, audio), rtol=1e-4, atol=1e-5
        )
    assert (
        net.method
        == {
            (True, True): "full",
            (True, False): "no_injection",
            (False, True): "no_cross_attention",
            (False, False): "no_injection_no_cross_attention",
        }[(ca, inj)]
    )


def test_bidirectional_baseline_matches_the_appendix_equations() -> None:
    torch.manual_seed(1)
    net = BidirectionalCrossAttention(depth=2).eval()
    image, audio = torch.rand(4, 1, 28, 28), torch.rand(4, 1, 112, 112)  # audio at avMNIST's stored size
    u, v = _tokens(net, image, audio)
    for layer in net.layers:
        nu, nv = _ln(u, layer.norm_u), _ln(v, layer.norm_v)
        u, v = u + _mha(nu, nv, layer.attn_u), v + _mha(nv, nu, layer.attn_v)
        u = u + _ffn(_ln(u, layer.norm_ffn_u), layer.ffn_u)
        v = v + _ffn(_ln(v, layer.norm_ffn_v), layer.ffn_v)
    expect = _head(torch.cat([u.mean(1), v.mean(1)], -1), net.head)
    with torch.no_grad():
        torch.testing.assert_close(net(image, audio), expect, rtol=1e-4, atol=1e-5)


def test_zero_injection_weights_reduce_the_full_model_to_the_no_injection_ablation() -> None:
    """S_t = G * (X W_S^T + b_S) vanishes when W_S = b_S = 0: then the two models compute the same logits."""
    torch.manual_seed(2)
    full = MultimodalCrossAttention(True, True, depth=2).eval()
    for layer in full.layers:
        torch.nn.init.zeros_(layer.inject.weight)
        torch.nn.init.zeros_(layer.inject.bias)
    ablation = MultimodalCrossAttention(True, False, depth=2).eval()
    missing = ablation.load_state_dict(full.state_dict(), strict=False)
    assert not missing.missing_keys and all(".inject." in k or ".gate." in k for k in missing.unexpected_keys)
    x = torch.rand(3, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(full(x, x.flip(-1)), ablation(x, x.flip(-1)))


# ---------------------------------------------------------------------------------------------- reader, corruption


def write_layout(
    root: Path, n_train: int = 40, n_test: int = 20, audio_side: int = 112, seed: int = 0
) -> dict:
    """A tiny MultiBench-layout folder with random content; returns the arrays written."""
    rng = np.random.default_rng(seed)
    arrays = {
        "image/train_data.npy": rng.uniform(-60, 255, (n_train, 784)),
        "image/test_data.npy": rng.uniform(-60, 255, (n_test, 784)),
        "audio/train_data.npy": rng.integers(0, 256, (n_train, audio_side, audio_side)).astype(np.float64),
        "audio/test_data.npy": rng.integers(0, 256, (n_test, audio_side, audio_side)).astype(np.float64),
        "train_labels.npy": rng.integers(0, 10, n_train),
        "test_labels.npy": rng.integers(0, 10, n_test),
    }
    for name, arr in arrays.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        np.save(root / name, arr)
    return arrays


def test_reader_scales_reshapes_and_pools_audio_as_the_layout_says(tmp_path: Path) -> None:
    arrays = write_layout(tmp_path)
    full = load_split(tmp_path, "train", audio_size=None)
    small = load_split(tmp_path, "train", audio_size=28)
    assert full["image"].shape == (40, 1, 28, 28) and full["audio"].shape == (40, 1, 112, 112)
    assert small["audio"].shape == (40, 1, 28, 28) and small["label"].dtype == torch.int64
    img = arrays["image/train_data.npy"]
    np.testing.assert_allclose(full["image"][7, 0].numpy(), img[7].reshape(28, 28) / 255, rtol=1e-6)
    # 112 -> 28 is 4x4 block averaging of the /255 spectrogram.
    blocks = arrays["audio/train_data.npy"][3].reshape(28, 4, 28, 4).mean((1, 3)) / 255
    np.testing.assert_allclose(small["audio"][3, 0].numpy(), blocks, rtol=1e-5, atol=1e-6)
    assert torch.equal(small["label"], torch.from_numpy(arrays["train_labels.npy"]))


def test_missing_data_names_the_layout_and_the_build_command(tmp_path: Path) -> None:
    root = tmp_path / "nowhere"
    with pytest.raises(ConfigError) as info:
        AVMNISTDataModule(root=str(root))
    msg = str(info.value)
    assert "\n" not in msg and str(root) in msg and "image/{train,test}_data.npy" in msg
    assert f"python -m lit_icl.mmca.avmnist_build --out {root}" in msg and msg == missing_data_message(root)


def _dm(root: Path, **kw) -> AVMNISTDataModule:
    args = {
        "root": str(root),
        "noise_std": 0.7,
        "val_size": 8,
        "batch_size": 8,
        "eval_batch_size": 6,
        "data_seed": 3,
    }
    return AVMNISTDataModule(**{**args, **kw})


def test_splits_are_multibench_s_and_maps_lie_in_unit_interval(tmp_path: Path) -> None:
    write_layout(tmp_path)
    dm = _dm(tmp_path)
    rows = dm.split_rows()
    assert rows["train"].tolist() == list(range(32)) and rows["val"].tolist() == list(range(32, 40))
    assert rows["test"].tolist() == list(range(20)) and dm.eval_splits == ["val", "test"]
    batch = dm.dataset("test")[0]
    for key in ("image", "audio"):
        flat = batch[key].flatten(1)
        assert torch.allclose(flat.min(1).values, torch.zeros(6)) and torch.allclose(
            flat.max(1).values, torch.ones(6)
        )


def test_test_corruption_is_seeded_identical_across_epochs_and_batch_sizes(tmp_path: Path) -> None:
    write_layout(tmp_path)
    dm = _dm(tmp_path)
    test = dm.dataset("test")
    first = torch.cat([test[k]["image"] for k in range(len(test))])
    assert len(test) == 4  # 20 rows in batches of 6: the last one is ragged, nothing dropped
    # Sampler indices of a later epoch, another batch size, another data module object: the same noise.
    again = torch.cat([test[k + 3 * len(test)]["image"] for k in range(len(test))])
    other = _dm(tmp_path, eval_batch_size=20).dataset("test")[0]["image"]
    assert torch.equal(first, again) and torch.equal(first, other)
    reseeded = torch.cat(
        [b["image"] for b in (_dm(tmp_path, data_seed=4).dataset("test")[k] for k in range(4))]
    )
    assert not torch.allclose(first, reseeded)
    # Without noise the maps are the min-max normalised clean data.
    clean = _dm(tmp_path, noise_std=0.0).dataset("test")[0]["image"]
    raw = load_split(tmp_path, "test")["image"][:6].flatten(1)
    expect = (raw - raw.min(1, keepdim=True).values) / (
        raw.max(1, keepdim=True).values - raw.min(1, keepdim=True).values
    )
    torch.testing.assert_close(clean.flatten(1), expect)


def test_training_batches_are_a_fresh_permutation_and_noise_per_epoch(tmp_path: Path) -> None:
    write_layout(tmp_path)
    train = _dm(tmp_path).dataset("train")
    assert len(train) == 4  # 32 rows in batches of 8
    epoch0 = [train[k] for k in range(4)]
    epoch1 = [train[4 + k] for k in range(4)]
    for ep in (epoch0, epoch1):  # every training row once per epoch
        assert sorted(torch.cat([b["row"] for b in ep]).tolist()) == list(range(32))
    assert not torch.equal(torch.cat([b["row"] for b in epoch0]), torch.cat([b["row"] for b in epoch1]))
    # A resumed run asks for the same indices and gets bit-identical batches.
    fresh = _dm(tmp_path).dataset("train")
    assert all(torch.equal(fresh[4 + k]["audio"], epoch1[k]["audio"]) for k in range(4))
    # The same row in two epochs gets different noise.
    r = int(epoch0[0]["row"][0])
    pos = {int(x): (k, i) for k, b in enumerate(epoch1) for i, x in enumerate(b["row"])}
    k, i = pos[r]
    assert not torch.equal(epoch0[0]["image"][0], epoch1[k]["image"][i])


# ---------------------------------------------------------------------------------------------- builder


class ToneSynthesizer:
    """Deterministic 'speech' for tests: digit c in voice v is a tone of 400 * (c + 1) + 100 * v Hz, 0.3 s at 8 kHz."""

    rate = 8000

    def __init__(self, n_voices: int = 2):
        self._voices = [Voice("tone", f"v{i}") for i in range(n_voices)]

    def voices(self) -> list[Voice]:
        return list(self._voices)

    def frequency(self, voice: Voice, word: str) -> float:
        return 400.0 * (WORDS.index(word) + 1) + 100.0 * int(voice.name[1:])

    def speak(self, voice: Voice, word: str, rendition: int) -> tuple[torch.Tensor, int]:
        t = torch.arange(int(0.3 * self.rate * (1 + 0.2 * rendition))) / self.rate
        return 0.5 * torch.sin(2 * math.pi * self.frequency(voice, word) * t), self.rate


def test_spectrogram_of_a_tone_peaks_at_its_frequency() -> None:
    for f in (500.0, 1500.0, 3000.0):
        t = torch.arange(4000) / 8000
        spec = spectrogram(torch.sin(2 * math.pi * f * t), 8000)
        assert spec.shape == (SPEC_SIZE, SPEC_SIZE) and 0 <= spec.min() and spec.max() <= 255
        row = int(spec.mean(1).argmax())  # row 0 = MAX_FREQ, the last row = 0 Hz
        expected = (1 - f / MAX_FREQ) * (SPEC_SIZE - 1)
        assert abs(row - expected) <= 3, (f, row, expected)


def test_builder_miniature_layout_pairing_and_voice_split(tmp_path: Path) -> None:
    labels = torch.tensor([0, 1] * 10)
    images = torch.rand(20, 784) * 255
    synth = ToneSynthesizer()
    manifest = build_avmnist_lite(
        tmp_path,
        images,
        labels,
        synth,
        test_voices=1,
        renditions=2,
        image_energy=1.0,
        test_fraction=0.3,
        seed=5,
    )
    assert manifest["name"] == "avmnist_lite" and manifest["counts"] == {"train": 14, "test": 6}
    assert set(manifest["train_voices"]).isdisjoint(manifest["test_voices"])
    assert len(manifest["train_voices"]) == len(manifest["test_voices"]) == 1
    voices = synth.voices()
    seen_images = []
    for split in ("train", "test"):
        data = load_split(tmp_path, split, audio_size=None)  # the reader of the real layout reads it
        img = np.load(tmp_path / "image" / f"{split}_data.npy")
        audio = np.load(tmp_path / "audio" / f"{split}_data.npy")
        voice_of = np.load(tmp_path / "audio" / f"{split}_voice.npy")
        assert img.shape == (manifest["counts"][split], 784) and audio.shape[1:] == (112, 112)
        assert audio.dtype == np.uint8 and data["label"].tolist().count(0) == data["label"].tolist().count(1)
        allowed = {voices.index(Voice("tone", s.split(":")[1])) for s in manifest[f"{split}_voices"]}
        assert set(voice_of.tolist()) <= allowed  # no voice of the other split
        for i, c in enumerate(data["label"].tolist()):
            # The row's spectrogram is one of the renditions of its own digit by its voice, and its peak
            # frequency is that digit's tone (so pairing is by digit, not by position).
            v = voices[int(voice_of[i])]
            candidates = [spectrogram(*synth.speak(v, WORDS[c], r)).round() for r in range(2)]
            assert any(torch.equal(torch.from_numpy(audio[i]).float(), s) for s in candidates)
            row = int(torch.from_numpy(audio[i]).float().mean(1).argmax())
            assert abs(row - (1 - synth.frequency(v, WORDS[c]) / MAX_FREQ) * 111) <= 3
            # image_energy = 1 keeps the digits as given: the row is one of the inputs with that label.
            match = [j for j in range(20) if np.allclose(img[i], images[j].numpy(), atol=1e-3)]
            assert len(match) == 1 and int(labels[match[0]]) == c
            seen_images.append(match[0])
    assert sorted(seen_images) == list(range(20))  # every image used once, in one split


def test_builder_removes_image_energy_like_avmnist() -> None:
    from lit_icl.mmca.avmnist_build import remove_energy

    torch.manual_seed(0)
    x = torch.randn(200, 784) @ torch.diag(torch.linspace(3, 0.1, 784)) + 5
    kept = remove_energy(x, 0.25)
    centred = x - x.mean(0)
    # Projection on the leading components: mean-free, and at least 25 % (but far from all) of the variance.
    assert kept.mean(0).abs().max() < 1e-3
    ratio = float(kept.pow(2).sum() / centred.pow(2).sum())
    assert 0.25 < ratio < 0.35


@pytest.mark.skipif(
    shutil.which("espeak-ng") is None, reason="espeak-ng not installed (apt-get install espeak-ng)"
)
def test_espeak_ng_speaks_a_digit_into_a_wav_read_by_the_wave_module(tmp_path: Path) -> None:
    synth = EngineSynthesizer(("espeak-ng",))
    try:
        samples, rate = synth.speak(Voice("espeak-ng", "en-us+m3"), "seven", 1)
        fast, _ = synth.speak(Voice("espeak-ng", "en-us+m3"), "seven", 2)  # rendition 2: 1.25x the rate
    finally:
        synth.close()
    assert rate == 22050 and 0.2 < len(samples) / rate < 2.0 and samples.abs().max() > 0.05
    assert len(fast) < len(samples)
    spec = spectrogram(samples, rate)
    assert spec.shape == (112, 112) and 0 <= spec.min() and 200 < spec.max() <= 255
    # Voiced speech carries most of its energy below 2 kHz: the lower half of the image (rows 56..111).
    assert spec[56:].mean() > spec[:56].mean()


def test_read_wav_reads_16_bit_pcm_written_by_the_wave_module(tmp_path: Path) -> None:
    import wave

    pcm = (np.sin(np.arange(800) / 5) * 20000).astype("<i2")
    with wave.open(str(tmp_path / "x.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(pcm.tobytes())
    samples, rate = read_wav(tmp_path / "x.wav")
    assert rate == 8000 and torch.equal(samples, torch.from_numpy(pcm.astype(np.float32) / 32768))


# ---------------------------------------------------------------------------------------------- CLI


def avmnist_args(
    tmp_path: Path, root: Path, *extra: str, config: str = "configs/mmca_avmnist.yaml"
) -> list[str]:
    return [
        "--config", config,
        "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
        "--trainer.logger.init_args.name", "tiny",
        "--trainer.max_epochs", "2",
        "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
        "--trainer.num_sanity_val_steps", "0",
        "--model.init_args.net.init_args.depth", "1",
        "--data.init_args.root", str(root),
        "--data.init_args.val_size", "8",
        "--data.init_args.batch_size", "16",
        "--data.init_args.eval_batch_size", "10",
        *extra,
    ]  # fmt: skip


def test_tiny_fit_then_test_reports_table_1_rows(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_layout(root, n_train=40, n_test=20, audio_side=28)
    main(["fit", *avmnist_args(tmp_path, root)])
    ckpt = tmp_path / "runs" / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    main(["test", *avmnist_args(tmp_path, root), "--ckpt_path", str(ckpt)])
    results = sorted(glob.glob(str(tmp_path / "runs" / "tiny" / "version_*" / "results.json")))
    rows = json.loads(Path(results[-1]).read_text())["rows"]
    by = {(r["metric"], r.get("epoch")): r for r in rows}
    assert by[("params", None)]["value"] == count_parameters(MultimodalCrossAttention(depth=1))
    history = [by[("test_accuracy", e)]["value"] for e in (1, 2)]
    assert by[("best_test_accuracy", None)]["value"] == max(history)
    assert by[("best_epoch", None)]["value"] == history.index(max(history)) + 1
    assert by[("epochs", None)]["value"] == 2
    assert all(r["method"] == "full" and r["noise_std"] == 0.2 and r["dataset"] == "data" for r in rows)
    # The last checkpoint's own accuracy is the last epoch's test accuracy (same fixed test corruption).
    assert by[("accuracy", None)]["value"] == pytest.approx(history[-1])
    model = AVMNISTModule.load_from_checkpoint(ckpt)
    assert model.test_history == history and isinstance(model.net, MultimodalCrossAttention)


BAD_ROWS = [
    (["--data.init_args.noise_std", "-1"], "noise_std=-1"),
    (["--data.init_args.val_size", "40"], "val_size=40 leaves no training rows"),
    (["--data.init_args.batch_size", "64"], "fewer than batch_size=64"),
    (["--model.init_args.net.init_args.heads", "3"], "d=16 must be divisible by heads=3"),
    (["--model.init_args.net.init_args.dropout", "1.5"], "dropout=1.5"),
    (["--model.init_args.lr", "0"], "lr=0"),
]


@pytest.mark.parametrize(("extra", "needle"), BAD_ROWS)
def test_bad_input_is_one_line_before_anything_is_written(tmp_path: Path, capsys, extra, needle) -> None:
    root = tmp_path / "data"
    write_layout(root, n_train=40, n_test=20, audio_side=28)
    assert_rejected(tmp_path, capsys, ["fit", *avmnist_args(tmp_path, root, *extra)], needle)


def test_missing_data_is_one_cli_line(tmp_path: Path, capsys) -> None:
    line = assert_rejected(
        tmp_path, capsys, ["fit", *avmnist_args(tmp_path, tmp_path / "absent")], "avmnist_build --out"
    )
    assert "avMNIST not found" in line


def test_resume_from_last_checkpoint_is_bit_identical(tmp_path: Path) -> None:
    """Fit 2 epochs straight vs 1 epoch, then `--ckpt_path last` to 2: same weights, optimizer state and history
    (training order and noise come from the EpochSampler index, not from a consumed RNG)."""
    root = tmp_path / "data"
    write_layout(root, n_train=40, n_test=20, audio_side=28)

    def run(name: str, epochs: int, *extra: str) -> None:
        main(
            [
                "fit",
                *avmnist_args(
                    tmp_path,
                    root,
                    "--trainer.logger.init_args.name",
                    name,
                    "--trainer.max_epochs",
                    str(epochs),
                    "--seed_everything",
                    "5",
                    *extra,
                ),
            ]
        )

    run("straight", 2)
    run("resumed", 1)
    run("resumed", 2, "--ckpt_path", str(tmp_path / "runs/resumed/version_0/checkpoints/last.ckpt"))
    ckpts = sorted(glob.glob(str(tmp_path / "runs/resumed/version_*/checkpoints/last.ckpt")))
    a = torch.load(tmp_path / "runs/straight/version_0/checkpoints/last.ckpt", weights_only=False)
    b = torch.load(ckpts[-1], weights_only=False)
    assert a["global_step"] == b["global_step"] == 4
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    for sa, sb in zip(a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert a["avmnist_test_history"] == b["avmnist_test_history"] and len(a["avmnist_test_history"]) == 2


@pytest.mark.parametrize(
    "config", sorted(glob.glob("configs/mmca_avmnist*.yaml")), ids=lambda c: Path(c).stem
)
def test_every_shipped_config_fits_and_tests_at_tiny_size(tmp_path: Path, config: str) -> None:
    root = tmp_path / "data"
    write_layout(
        root, n_train=40, n_test=20, audio_side=112
    )  # avMNIST's stored audio size, resized by the reader
    args = avmnist_args(tmp_path, root, "--trainer.max_epochs", "1", config=config)
    main(["fit", *args])
    main(["test", *args, "--ckpt_path", str(tmp_path / "runs/tiny/version_0/checkpoints/last.ckpt")])
    rows = json.loads((tmp_path / "runs/tiny/version_1/results.json").read_text())["rows"]
    stem = Path(config).stem
    assert {r["method"] for r in rows} == {
        "full" if stem == "mmca_avmnist" else stem.removeprefix("mmca_avmnist_")
    }
    assert {"params", "best_test_accuracy", "best_epoch", "accuracy", "test_accuracy"} <= {
        r["metric"] for r in rows
    }
