"""Shared by the synthetic-experiment tests: the arguments of a seconds-long CLI run."""

from __future__ import annotations

from pathlib import Path


def mmca_args(tmp_path: Path, *extra: str, config: str = "configs/mmca/synthetic.yaml") -> list[str]:
    """A seconds-long run: d = 4, L_tr = 12, N = 64 fixed prompts, full batch, 2 epochs x 3 steps."""
    return [
        "--config",
        config,
        "--trainer.logger.init_args.save_dir",
        str(tmp_path / "runs"),
        "--trainer.logger.init_args.name",
        "tiny",
        "--trainer.max_epochs",
        "2",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        "--trainer.log_every_n_steps",
        "1",
        "--trainer.num_sanity_val_steps",
        "0",
        "--model.init_args.net.init_args.d",
        "4",
        "--model.init_args.net.init_args.depth",
        "3",
        "--model.init_args.test_depths",
        "[1, 3]",
        "--data.init_args.d1",
        "2",
        "--data.init_args.d2",
        "2",
        "--data.init_args.train_context_length",
        "12",
        "--data.init_args.train_prompts",
        "64",
        "--data.init_args.batch_size",
        "64",
        "--data.init_args.chunk_size",
        "32",
        "--data.init_args.train_batches_per_epoch",
        "3",
        "--data.init_args.val_prompts",
        "32",
        "--data.init_args.test_prompts",
        "64",
        "--data.init_args.eval_batch_size",
        "32",
        "--data.init_args.test_context_lengths",
        "[5, 10, 20]",
        *extra,
    ]
