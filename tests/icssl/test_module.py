"""ICSSLModule: a checkpoint written before the one-folder-per-experiment move (tests/data/legacy/README.md, made
at commit 93c16ee, its hyper-parameters naming ``lit_icl.icssl.nets.*``) loads with its weights, in Python and
through ``python -m lit_icl test`` with today's config, and scores the same rows either way; its validation
accuracy and EIG reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from icssl.helpers import tiny_args
from lightning.pytorch import Trainer

from lit_icl.cli import main
from lit_icl.icssl import GDICLHead, ICSSLModule, InContextEigenmap, ManifoldDataModule, SemiSupervisedICL

LEGACY = Path(__file__).parents[1] / "data/legacy/icssl_manifolds.ckpt"


def _stored() -> dict:
    return torch.load(LEGACY, map_location="cpu", weights_only=False)


def test_legacy_checkpoint_names_the_files_and_loads_with_its_weights() -> None:
    stored = _stored()
    assert stored["hyper_parameters"]["net"]["class_path"] == "lit_icl.icssl.nets.SemiSupervisedICL"
    module = ICSSLModule.load_from_checkpoint(LEGACY, map_location="cpu")
    assert isinstance(module.net, SemiSupervisedICL)
    assert isinstance(module.net.representation, InContextEigenmap) and isinstance(module.net.head, GDICLHead)
    state = module.state_dict()
    assert state.keys() == stored["state_dict"].keys()
    for key, value in stored["state_dict"].items():
        assert torch.equal(state[key], value), key


def test_legacy_checkpoint_is_tested_through_the_cli_with_todays_config(tmp_path: Path) -> None:
    main(["test", *tiny_args(tmp_path), "--ckpt_path", str(LEGACY)])
    (results,) = (tmp_path / "runs/tiny").glob("version_*/results.json")
    cli_rows = json.loads(results.read_text())["rows"]
    assert {r["method"] for r in cli_rows} == {"ORIG+E2E-ICL", "labeled_majority", "class_prior"}
    # The same weights on the same test episodes in Python give the same rows.
    module = ICSSLModule.load_from_checkpoint(LEGACY, map_location="cpu")
    dm = ManifoldDataModule(**{k: v for k, v in _stored()["datamodule_hyper_parameters"].items()
                               if not k.startswith("_")})
    Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False).test(module, datamodule=dm)
    assert module.test_rows == cli_rows


def test_the_validation_eig_reference_is_computed_once_per_batch_and_only_reused_for_equal_points(monkeypatch) -> None:
    """The EIG reference of a validation batch is the eigenmap of its points; a later round with equal points
    reuses it without solving again, a batch with other points (or another index) is solved anew."""
    import lit_icl.icssl.module as icssl_module
    from lit_icl.core.spectral import laplacian_eigenmap as exact

    solved = []
    monkeypatch.setattr(icssl_module, "laplacian_eigenmap", lambda x: solved.append(x) or exact(x))
    module = icssl_module.ICSSLModule()
    g = torch.Generator().manual_seed(0)
    x, other = torch.randn(4, 20, 2, generator=g), torch.randn(4, 20, 2, generator=g)
    first = module.val_eig_reference(x, 0)
    assert torch.equal(first, exact(x)) and len(solved) == 1
    assert module.val_eig_reference(x.clone(), 0) is first and len(solved) == 1  # the next round: reused
    assert torch.equal(module.val_eig_reference(other, 0), exact(other)) and len(solved) == 2
    assert torch.equal(module.val_eig_reference(x, 1), exact(x)) and len(solved) == 3  # another batch index
    assert torch.equal(module.val_eig_reference(x[:2], 1), exact(x[:2])) and len(solved) == 4  # another shape


@pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`")
def test_validation_accuracy_is_the_mean_over_episodes_of_the_unlabeled_points_accuracy() -> None:
    """``val/acc/label_ratio=r``: per episode, the share of unlabeled points the net classifies right with
    ``round(r * n)`` labels shown, averaged over episodes; computed here point by point from the net's logits."""
    from lit_icl.icssl.data import labeled_count, labeled_mask
    from lit_icl.icssl.module import _slot

    dm = ManifoldDataModule(n_points=20, batch_size=16, chunk_size=8, eval_batch_size=16, val_episodes=16,
                            train_batches_per_epoch=1, eval_label_ratios=[0.1, 0.5], train_label_ratio=[0.1, 0.5])
    module = ICSSLModule(net=SemiSupervisedICL(InContextEigenmap(n_points=20, stack_repeats=1)))
    module.attach_datamodule(dm)
    dm.setup("validate")
    batch = next(iter(dm.val_dataloader()))
    module.eval()
    with torch.no_grad():
        module.validation_step(batch, 0)
        x, y = batch["x"], batch["y"]
        for r in (0.1, 0.5):
            labeled = labeled_mask(y, labeled_count(r, 20), module.labeled_subset)
            pred = module(x, y, labeled).argmax(-1)
            per_episode = []
            for b in range(x.shape[0]):
                unlabeled = [i for i in range(20) if not labeled[b, i]]
                per_episode.append(sum(int(pred[b, i] == y[b, i]) for i in unlabeled) / len(unlabeled))
            expected = sum(per_episode) / len(per_episode)
            assert float(module.val_acc[_slot(r)].compute()) == pytest.approx(expected, abs=1e-6)


def test_the_training_objective_compiles_the_loss_with_the_net_and_computes_what_eager_does() -> None:
    """The training step's loss runs inside its compiled region (traced into one graph with the net), gives the
    eager loss and logits bit for bit, adds nothing to the module's state and follows a replaced net."""
    from lit_icl.icssl.data import labeled_mask

    torch.manual_seed(0)
    net = SemiSupervisedICL(InContextEigenmap(n_points=10, n_components=2, stack_repeats=1), GDICLHead())
    module = ICSSLModule(net=net)
    keys = set(module.state_dict())
    x, y = torch.randn(3, 10, 3), torch.randint(0, 2, (3, 10))
    labeled = labeled_mask(y, torch.tensor([2, 3, 5]))
    eager_logits = module.net(x, y, labeled).logits
    eager_loss = module.unlabeled_loss(eager_logits, y, labeled)

    graphs: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward  # runs the traced ops as they are: the same values as eager

    torch._dynamo.reset()
    objective = module.training_objective
    objective.compile(backend=record, fullgraph=True)
    loss, out = module.training_objective((x, y, labeled), (y, labeled))
    logits = out.logits
    assert len(graphs) == 1
    traced = {str(node.target) for node in graphs[0].graph.nodes if node.op == "call_function"}
    assert any("cross_entropy" in target for target in traced), sorted(traced)
    assert torch.equal(loss, eager_loss) and torch.equal(logits, eager_logits)
    assert set(module.state_dict()) == keys and all(m is not objective for m in module.modules())
    # The training step goes through it (so its compiled region holds the loss).
    calls = []
    objective.register_forward_hook(lambda *args: calls.append(args))
    step_loss = module.training_step({"x": x, "y": y, "n_labeled": torch.tensor([2, 3, 5])}, 0)
    assert len(calls) == 1 and torch.equal(step_loss, eager_loss)
    module.net = SemiSupervisedICL(InContextEigenmap(n_points=10, n_components=2, stack_repeats=1), GDICLHead())
    assert module.training_objective is not objective and module.training_objective.net is module.net
    torch._dynamo.reset()


def test_predicting_by_hand_before_the_module_is_bound_to_its_data_names_the_call_that_binds_it() -> None:
    """The label ratios come from the data module (``bind_datamodule``, which a Trainer calls in ``setup``): a
    ``predict_step`` called by hand before that failed inside ``torch.stack`` with an empty list."""
    from lit_icl.core.errors import ConfigError

    module, dm = ICSSLModule(), ManifoldDataModule(n_points=100, test_episodes=16, eval_batch_size=16)
    batch = next(iter(dm.test_dataloader()))
    with pytest.raises(ConfigError, match=r"bind it to its data module first, model.bind_datamodule\(dm\)"):
        module.predict_step(batch, 0)
    module.bind_datamodule(dm)
    assert module.predict_step(batch, 0)["probs"].shape == (len(dm.eval_label_ratios), 16, 100, 2)
