"""I2CL's LightningModule: context vectorisation, injection, noisy self-calibration (``fit``), evaluation (``test``).

``fit`` (Sec. 2.2-2.4): at the start, each demonstration runs on its own through the frozen LM and the attention and
MLP outputs at its last token are kept (Eq. 2) and averaged (Eq. 3); then only the ``4L`` coefficients ``(lambda^a,
beta^a, lambda^m, beta^m)_l`` train, initialised to ``lambda = 0.1``, ``beta = 1``, by AdamW on the cross-entropy of
the label word's first token at the query's last position over the full vocabulary (Eq. 5), with Eq. 6's relative
noise ``gamma = 0.001``, for 100 epochs (``trainer.max_epochs``) at batch 2, the learning rate annealed by a cosine
from 1e-2 to 1e-5 (Sec. 3) over one shuffle of the demonstrations per epoch. The noise is relative to each injected
sub-layer output, as the authors' public code scales it (``noise_norm: sublayer``); Eq. 6 as written scales it by
the residual stream (``noise_norm: stream``, ``configs/i2cl/offline/paper_text.yaml``), which collapsed Gemma 3 270M
to one label on three seeds of five. The code's other choices (hooks before post-norms, a 5 % warm-up and a cosine
to 0, a fresh batch every step) are ``configs/i2cl/offline/public_code.yaml``
(``experiments/results/i2cl_recipes_cpu.md``). Several calibrated methods train side by side, each with its own
optimiser and schedule (manual optimisation), on the same batches. Each method's Eq. 6 noise at a step is drawn from
a seed of its own, a function of ``(data_seed, epoch, batch, rank, method)``, so a run resumed from a checkpoint
written anywhere, inside an epoch too, draws the noise an uninterrupted run draws next, and ``[noise_vector, i2cl]``
and ``[i2cl]`` calibrate I2CL under the same noise.

Methods (``methods``):

- ``zero_shot``: the query alone; ``few_shot``: the demonstrations, then the query (ICL, no cache);
- ``i2cl``: the query alone, Eq. 4 at every layer and token;
- ``noise_vector`` (Table 1): I2CL with standard-normal vectors in place of the context vectors;
- ``task_vector`` (App. B.1, Hendel et al.): the block output at the last token of demonstrations + one extra query
  replaces the query's last-token block output at one layer, chosen by accuracy on the 32 holdout queries;
- ``icl_i2cl`` (App. C.3): I2CL with the demonstrations kept in the prompt, in calibration and at test;
- ``i2cl_transfer`` (App. B.2, Algorithm 1, h = 0.8, tau = 0.5): calibrate on the target (a first, plain-loop
  calibration at the start of ``fit``), compare its coefficients with the task-ids of ``transfer_from`` checkpoints,
  and recalibrate from the similarity-weighted average of their coefficients and context vectors.

Checkpoints hold the coefficients and context vectors (the task-id of Sec. 3.3), not the LM's weights; loading one
rebuilds the LM from ``model_name_or_path``. The calibration itself is :mod:`lit_icl.i2cl.calibration`.
``test`` rows: ``accuracy``, ``macro_f1`` (the public code's second metric), ``latency_ms_per_query``,
``cached_params`` (Table 1's last column, counted for this model and prompt), ``trainable_params`` per method,
``calibration_seconds`` per calibrated method, ``task_vector_layer``; coordinates ``task`` and ``seed``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torchmetrics.classification import MulticlassF1Score

from lit_icl.core.errors import ConfigError
from lit_icl.core.module import ICLModule
from lit_icl.core.protocols import data_refusal, implements, unmet
from lit_icl.core.results import result_row
from lit_icl.core.seeding import derive_seed, make_generator
from lit_icl.core.transfer import to_device
from lit_icl.core.validation import (
    check_literal,
    check_nonempty,
    check_nonnegative,
    check_positive,
    check_range,
    check_unique,
)
from lit_icl.i2cl.calibration import (
    InjectMethod,
    LRSchedule,
    calibrate,
    calibration_loss,
    injection_coefficients,
    lr_lambda,
    read_task_id,
    task_similarity,
    transfer_init,
)
from lit_icl.i2cl.contracts import I2CLData, I2CLNet
from lit_icl.i2cl.data import TaskData
from lit_icl.i2cl.nets import NoiseNorm
from lit_icl.metrics.mean import SyncFreeMean

CALIBRATED = ("i2cl", "noise_vector", "icl_i2cl", "i2cl_transfer")
BASELINES = ("zero_shot", "few_shot", "task_vector")
METHODS = (*BASELINES, *CALIBRATED)
#: A ``methods`` entry, as a type (``--help`` lists the choices), built from :data:`METHODS`.
Method = Literal[METHODS]  # type: ignore[valid-type]
WITH_DEMOS = ("few_shot", "icl_i2cl")  # methods whose prompts carry the demonstration tokens


class I2CLModule(ICLModule):
    """Frozen causal LM + I2CL and its baselines (see the module docstring).

    Args:
        net: the frozen LM, e.g. ``CausalLM(model_name_or_path="meta-llama/Llama-2-7b-hf")``.
        methods: which of :data:`METHODS` to calibrate (``fit``) and evaluate (``test``).
        gamma: relative noise of Eq. 6 during calibration.
        noise_norm: what that noise is relative to: ``sublayer`` (default), the injected sub-layer output (the
            public code), or ``stream``, the residual stream (Eq. 6 as written); see ``CausalLM.inject``.
        lr / lr_min: AdamW learning rate, annealed by a cosine to ``lr_min``; weight_decay: AdamW's.
        warmup_fraction: linear warm-up share of the calibration steps (0 as the paper; the public code 0.05).
        inject_method: ``linear`` (Eq. 4: ``beta a + lambda v``), ``add`` (the public code's other method,
            ``a + relu(lambda) v``) or ``fixed_beta`` (``a + lambda v``): see :func:`injection_coefficients`.
        lr_schedule: ``cosine`` (default: warm-up, then a cosine from ``lr`` to ``lr_min``) or ``public_code``
            (the authors' exact schedule, which anneals to 0, so it needs ``lr_min: 0``).
        init_lambda / init_beta: initial coefficients.
        transfer_from: I2CL checkpoints (other tasks' task-ids) for ``i2cl_transfer``.
        transfer_threshold / transfer_temperature: Algorithm 1's ``h`` and ``tau``.
        task_vector_layer: fix the task vector's layer (default: best on the holdout queries).

    At ``test`` the context vectors of ``i2cl`` / ``icl_i2cl`` are rebuilt from the data module's demonstrations,
    like the few-shot prompt and the task vector: with the calibration's ``data_seed`` that reproduces the
    checkpoint's vectors; with another one it is Sec. 3.3's "unseen demonstrations" test of the calibrated
    coefficients (the rows' ``calibration_seed`` says which seed calibrated them).
    """

    precisions = ("32-true", "bf16-mixed", "16-mixed")
    precisions_why = ("its coefficients and context vectors stay float32: in bf16 a coefficient near 1 moves in steps "
                      "of 0.008, coarser than its learning rate; the LM's own dtype is "
                      "--model.init_args.net.init_args.dtype")

    def __init__(
        self,
        net: nn.Module | None = None,
        methods: list[Method] | None = None,
        gamma: float = 0.001,
        noise_norm: NoiseNorm = "sublayer",
        lr: float = 0.01,
        lr_min: float = 1e-5,
        weight_decay: float = 1e-3,
        warmup_fraction: float = 0.0,
        lr_schedule: LRSchedule = "cosine",
        inject_method: InjectMethod = "linear",
        init_lambda: float = 0.1,
        init_beta: float = 1.0,
        transfer_from: list[str] | None = None,
        transfer_threshold: float = 0.8,
        transfer_temperature: float = 0.5,
        task_vector_layer: int | None = None,
    ):
        super().__init__()
        self.save_reloadable_hparams()
        methods = list(METHODS[:-1] if methods is None else methods)
        self._validate(**{**self.hparams, "net": net, "methods": methods})
        self.net = net
        self.methods = methods
        self.calibrated = [m for m in methods if m in CALIBRATED]
        L, D = net.n_layers, net.hidden_size
        init = torch.tensor([float(init_lambda), float(init_beta)]).expand(L, 2, 2).clone()
        self.coefs = nn.ParameterDict({m: nn.Parameter(init.clone()) for m in self.calibrated})
        for m in self.calibrated:
            self.register_buffer(f"ctx_{m}", torch.zeros(L, 2, D))
        self.register_buffer("is_calibrated", torch.zeros(len(self.calibrated), dtype=torch.bool))
        self.register_buffer("calib_seconds", torch.zeros(len(self.calibrated), dtype=torch.float64))
        self.register_buffer("calib_seed", torch.zeros((), dtype=torch.long))
        if transfer_from:
            coefs, ctxs = zip(*(read_task_id(p) for p in transfer_from))
            if any(c.shape != (L, 2, 2) for c in coefs) or any(v.shape != (L, 2, D) for v in ctxs):
                raise ConfigError(f"transfer_from checkpoints must come from the same LM (L={L}, D={D})")
            self.register_buffer("src_coef", torch.stack(coefs), persistent=False)
            self.register_buffer("src_ctx", torch.stack(ctxs), persistent=False)
        self.automatic_optimization = False  # one AdamW + schedule per calibrated method
        self.data: TaskData | None = None
        self.data_seed = 0
        self.calibration_batches = "epoch"
        self.label_ids: Tensor | None = None
        self.task_vector: Tensor | None = None
        self.tv_layer: int | None = task_vector_layer
        self.accuracy = nn.ModuleDict({m: SyncFreeMean() for m in methods})
        # macro-F1 (the public code's second metric) needs the number of classes: built in bind_datamodule
        self.macro_f1 = nn.ModuleDict()
        self.seconds: dict[str, float] = {}
        self.queries: dict[str, int] = {}
        self.transfer_weights: Tensor | None = None

    @staticmethod
    def _validate(
        *,
        net: nn.Module | None,
        methods: list[str],
        gamma: float,
        noise_norm: str,
        lr: float,
        lr_min: float,
        weight_decay: float,
        warmup_fraction: float,
        init_lambda: float,
        lr_schedule: str = "cosine",
        inject_method: str = "linear",
        init_beta: float,
        transfer_from: list[str] | None,
        transfer_threshold: float,
        transfer_temperature: float,
        task_vector_layer: int | None,
        **_: object,
    ) -> None:
        """The constructor's argument checks (``**_``: what the CLI adds to the hyper-parameters)."""
        if not implements(net, I2CLNet):
            raise ConfigError(
                "model.init_args.net must be a lit_icl.i2cl.CausalLM (the frozen LM to wrap), or a net that "
                f"satisfies lit_icl.i2cl.contracts.I2CLNet; {type(net).__name__}: {'; '.join(unmet(net, I2CLNet))}"
            )
        check_unique("methods", check_nonempty("methods", methods, "[zero_shot, few_shot, i2cl]"))
        for m in methods:
            check_literal("methods entry", m, Method)
        check_nonnegative("gamma", gamma)
        check_literal("noise_norm", noise_norm, NoiseNorm)
        check_positive("lr", lr)
        check_range("lr_min", lr_min, 0.0, lr, hint="it is where the cosine ends, at most lr")
        check_nonnegative("weight_decay", weight_decay)
        check_range("warmup_fraction", warmup_fraction, 0.0, 1.0, high_inclusive=False)
        check_literal("lr_schedule", lr_schedule, LRSchedule)
        check_literal("inject_method", inject_method, InjectMethod)
        if lr_schedule == "public_code" and lr_min != 0:
            raise ConfigError(f"lr_schedule=public_code anneals to 0 and ignores lr_min={lr_min}: set lr_min: 0")
        if (noise_norm == "stream" and gamma > 0 and getattr(net, "hook_point", "write") == "module"
                and getattr(net, "post_norm", False)):
            raise ConfigError("noise_norm=stream needs the net's hook_point: write on this post-norm model (the "
                              "stream after a raw sub-layer output is only known after its norm): use noise_norm: "
                              "sublayer, as the public code")
        check_range("init_lambda", init_lambda)
        check_range("init_beta", init_beta)
        check_range("transfer_threshold", transfer_threshold, -1.0, 1.0, hint="it is a cosine similarity")
        check_positive("transfer_temperature", transfer_temperature)
        if task_vector_layer is not None:
            check_range("task_vector_layer", task_vector_layer, 0, net.n_layers - 1, integer=True)
        if "i2cl_transfer" in methods and not transfer_from:
            raise ConfigError("method 'i2cl_transfer' needs transfer_from: a list of I2CL checkpoints (task-ids)")

    def context(self, method: str) -> Tensor:
        return getattr(self, f"ctx_{method}")

    #: Prompts differ in length from batch to batch: one graph with dynamic lengths, not one per length.
    compile_dynamic = None
    #: ``--compile.mode auto`` leaves I2CL eager: compiling the offline LM's calibration forward took about 240 s
    #: on our 2-core CPU (15 s from a warm cache) for a step 1.1-1.25x faster, so a first run pays it back only
    #: after 5,700-12,000 steps, against 500 per calibrated method (``experiments/results/compile_cpu.md``). A
    #: named mode compiles it.
    compile_auto = False

    def compile_targets(self) -> list[nn.Module]:
        """The LM's calibration forward (:class:`lit_icl.i2cl.nets.CalibrationForward`): training is the only
        step with a backward, and the rest (context vectors, task vector, evaluation) stays eager, so the test
        latencies of Table 1 are always the eager ones."""
        target = getattr(self.net, "calibration_forward", None)
        if not isinstance(target, nn.Module):
            raise ConfigError(f"{type(self.net).__name__} has no calibration_forward module to compile; run without "
                              "--compile.mode")
        return [target]

    # ---------------------------------------------------------------- data
    def validation_keys(self) -> set[str]:
        return set()  # no validation loop: calibration has its own data, and test scores the methods

    def bind_datamodule(self, datamodule: LightningDataModule) -> None:
        """Tokenise the label words (collisions refused) and check that every prompt fits the context."""
        if not implements(datamodule, I2CLData):
            raise data_refusal(datamodule, I2CLData, "I2CLModule", "lit_icl.i2cl.I2CLDataModule")
        data = datamodule.task_data()
        net = self.net
        self.label_ids = torch.tensor(net.label_token_ids(data.query(data.demos[0][0]), data.label_words))
        longest_queries = sorted((ex[0] for ex in data.eval + data.demos), key=len)[-3:]
        prefix = data.prefix if any(m in WITH_DEMOS or m == "task_vector" for m in self.methods) else ""
        for text in longest_queries:
            n = net.n_tokens(prefix + data.query(text))
            if n > net.max_positions:
                raise ConfigError(
                    f"a {'few-shot ' if prefix else ''}prompt of {n} tokens exceeds the model's context of "
                    f"{net.max_positions} tokens; use fewer shots_per_class or set data max_chars"
                )
        self.data = data
        self.data_seed = int(datamodule.data_seed)
        # how the data module draws calibration batches; the plain loop of i2cl_transfer draws its own the same way
        self.calibration_batches = str(getattr(datamodule, "calibration_batches", "epoch"))
        n_classes = len(data.label_words)
        self.macro_f1 = nn.ModuleDict(
            {m: MulticlassF1Score(num_classes=n_classes, average="macro").to(self.device) for m in self.methods}
        )

    def _prompts(self, method: str, texts: Sequence[str]) -> list[str]:
        assert self.data is not None
        prefix = self.data.prefix if method in WITH_DEMOS else ""
        return [prefix + self.data.query(t) for t in texts]

    # ---------------------------------------------------------------- calibration (fit)
    def on_fit_start(self) -> None:
        assert self.data is not None
        self._check_ddp()
        if self.trainer.ckpt_path:  # resumed: the restored buffers already hold the vectors (and transfer init)
            return
        self.calib_seed.fill_(self.data_seed)
        t0 = time.perf_counter()
        demo_vectors = self.net.demonstration_vectors(self.data.demo_texts)  # Eq. 2, (N, L, 2, D)
        v = demo_vectors.mean(0)  # Eq. 3
        vec_seconds = time.perf_counter() - t0
        with torch.no_grad():
            for m in self.calibrated:
                if m == "noise_vector":  # same shape, standard normal (the public code's 'noise' vectors)
                    g = make_generator(self.data_seed, "i2cl_noise_vector")
                    self.context(m).copy_(torch.randn(v.shape, generator=g))
                else:
                    self.context(m).copy_(v)
                self.calib_seconds[self.calibrated.index(m)] += vec_seconds
        if "i2cl_transfer" in self.calibrated:
            with torch.enable_grad():
                self._transfer_start(v)

    def _check_ddp(self) -> None:
        """Several calibrated methods under DDP need ``find_unused_parameters``: each method's backward reaches only
        its own coefficients, and without the flag DDP's reducer waits for gradients of the others."""
        wrapped = getattr(self.trainer.strategy, "model", None)
        if isinstance(wrapped, DistributedDataParallel) and not wrapped.find_unused_parameters \
                and len(self.calibrated) > 1:
            raise ConfigError(
                f"methods {self.calibrated} calibrate side by side, one backward each, which plain DDP cannot "
                "reduce: use --trainer.strategy ddp_find_unused_parameters_true (or one calibrated method per run)"
            )

    def _transfer_start(self, v_new: Tensor) -> None:
        """Algorithm 1, lines 4-14: calibrate on the target, then ensemble the similar task-ids."""
        t0 = time.perf_counter()
        hp = self.hparams
        assert self.data is not None and self.label_ids is not None
        prompts = self._prompts("i2cl", [t for t, _ in self.data.demos])
        targets = self.label_ids[torch.tensor([y for _, y in self.data.demos])]
        trainer = self.trainer
        c_new, _ = calibrate(
            self.net, v_new.to(self.device), self.coefs["i2cl_transfer"].detach(), prompts, targets,
            epochs=int(trainer.max_epochs or 1), batch_size=2, lr=hp.lr, lr_min=hp.lr_min,
            weight_decay=hp.weight_decay, gamma=hp.gamma, warmup_fraction=hp.warmup_fraction, seed=self.data_seed,
            noise_norm=hp.noise_norm, lr_schedule=hp.lr_schedule, replacement=self.calibration_batches == "replacement",
            inject_method=hp.inject_method,
        )
        out = transfer_init(c_new.cpu(), self.src_coef.cpu(), self.src_ctx.cpu(), hp.transfer_threshold,
                            hp.transfer_temperature)
        sims = task_similarity(c_new.cpu(), self.src_coef.cpu())
        rank_zero_info(f"i2cl_transfer: cosine similarity to each source task-id {[round(float(x), 4) for x in sims]}")
        if out is None:
            rank_zero_warn(f"i2cl_transfer: no source task-id has cosine > {hp.transfer_threshold}; keeping the "
                           "target's own context vector and the default initialisation")
            self.transfer_weights = torch.zeros(self.src_coef.shape[0])
        else:
            v_avg, c_avg, p = out
            with torch.no_grad():
                self.context("i2cl_transfer").copy_(v_avg)
                self.coefs["i2cl_transfer"].copy_(c_avg)
            self.transfer_weights = p
            rank_zero_info(f"i2cl_transfer: source weights {[round(float(x), 3) for x in p]}")
        self.calib_seconds[self.calibrated.index("i2cl_transfer")] += time.perf_counter() - t0

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        assert self.label_ids is not None
        optimizers = self.optimizers()
        schedulers = self.lr_schedulers()
        optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
        schedulers = schedulers if isinstance(schedulers, list) else [schedulers]
        targets = to_device(self.label_ids, batch["label"].device)[batch["label"]]  # no device sync
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        for k, (m, opt, sched) in enumerate(zip(self.calibrated, optimizers, schedulers)):
            t0 = time.perf_counter()
            opt.zero_grad()
            # Eq. 6's draws from a seed of this step's own (the module doc): not from where the global RNG stream
            # stands, which a resumed run cannot know.
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(derive_seed(self.data_seed, "i2cl_calibration_noise", self.current_epoch,
                                              batch_idx, self.global_rank, m))
                loss = calibration_loss(
                    self.net, self.context(m), self.coefs[m], self._prompts(m, batch["text"]), targets,
                    self.hparams.gamma, self.hparams.noise_norm, self.hparams.inject_method,
                )
            self.manual_backward(loss)
            opt.step()
            sched.step()
            self.calib_seconds[k] += time.perf_counter() - t0
            self.log_loss(f"train/loss/{m}", loss.detach(), batch_size=len(batch["text"]))

    def on_train_end(self) -> None:
        self.is_calibrated.copy_(self._schedules_finished())

    def _schedules_finished(self) -> Tensor:
        """Per calibrated method, whether its AdamW schedule has taken all its steps (Sec. 3's calibration ran to
        its end). A checkpoint written on the way (SIGTERM, Ctrl-C, ``max_time``) holds coefficients part way."""
        total = int(self.trainer.estimated_stepping_batches)
        steps = [int(config.scheduler.last_epoch) for config in self.trainer.lr_scheduler_configs]
        return torch.tensor([n >= total for n in steps], dtype=torch.bool, device=self.is_calibrated.device)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The checkpoint is the task-id (coefficients + context vectors), not a copy of the frozen LM.
        sd = checkpoint["state_dict"]
        for key in [k for k in sd if k.startswith("net.")]:
            del sd[key]
        # Written before on_train_end at the last epoch's end, so the flag is read from the schedules, not the buffer.
        sd["is_calibrated"] = self._schedules_finished()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The reverse of on_save_checkpoint: the LM was just rebuilt from model_name_or_path, so its own weights
        # fill the keys the task-id leaves out, and loading (Trainer resume or load_from_checkpoint) stays strict
        # instead of warning about hundreds of missing LM keys.
        sd = checkpoint["state_dict"]
        for key, value in self.net.state_dict(prefix="net.").items():
            sd.setdefault(key, value)
        super().on_load_checkpoint(checkpoint)

    def check_checkpoint_to_evaluate(self, checkpoint: Mapping[str, Any] | None) -> None:
        if checkpoint is None:
            self._refuse_uncalibrated([False] * len(self.calibrated), 0)
            return
        flags = checkpoint.get("state_dict", {}).get("is_calibrated")
        if isinstance(flags, Tensor) and flags.numel() == len(self.calibrated):  # else loading names the mismatch
            self._refuse_uncalibrated(flags.tolist(), int(checkpoint.get("global_step", 0)))

    def _refuse_uncalibrated(self, flags: list[bool], step: int) -> None:
        """One line for calibrated methods without finished coefficients: never fitted, or fitted part way."""
        missing = [m for m, done in zip(self.calibrated, flags) if not done]
        if missing and step:
            raise ConfigError(
                f"methods {missing} stopped calibrating part way (the checkpoint was written at step {step}, before "
                "their schedules ended): finish the calibration with `fit` and the same config with --ckpt_path on "
                "this checkpoint, then test the checkpoint it writes"
            )
        if missing:
            raise ConfigError(
                f"methods {missing} need calibrated coefficients: run `fit` first and pass its checkpoint with "
                "--ckpt_path, or drop them from model.init_args.methods"
            )

    def configure_optimizers(self) -> Any:
        if not self.calibrated:
            return None
        hp = self.hparams
        total = int(self.trainer.estimated_stepping_batches)
        warmup = int(hp.warmup_fraction * total)
        opts, scheds = [], []
        for m in self.calibrated:
            opt = torch.optim.AdamW([self.coefs[m]], lr=hp.lr, weight_decay=hp.weight_decay)
            sched = torch.optim.lr_scheduler.LambdaLR(
                opt, lambda s: lr_lambda(hp.lr_schedule, s, total, hp.lr, hp.lr_min, warmup)
            )
            opts.append(opt)
            scheds.append({"scheduler": sched, "interval": "step"})
        return opts, scheds

    # ---------------------------------------------------------------- evaluation (test)
    @torch.no_grad()
    def predict_method(self, method: str, texts: Sequence[str]) -> Tensor:
        """Predicted class ids: argmax of the logits restricted to the label words' first tokens."""
        assert self.label_ids is not None
        ids, mask = self.net.encode(self._prompts(method, texts))
        if method in ("zero_shot", "few_shot"):
            logits = self.net.last_logits(ids, mask)
        elif method == "task_vector":
            assert self.task_vector is not None and self.tv_layer is not None
            with self.net.replace_hidden(self.tv_layer, self.task_vector[self.tv_layer], mask):
                logits = self.net.last_logits(ids, mask)
        else:
            coef = injection_coefficients(self.coefs[method].float(), self.hparams.inject_method)
            with self.net.inject(self.context(method), coef, gamma=0.0):
                logits = self.net.last_logits(ids, mask)
        return logits[:, to_device(self.label_ids, logits.device)].argmax(-1)

    def on_test_start(self) -> None:
        self._refuse_uncalibrated(self.is_calibrated.tolist(), int(self._trained_steps or 0))
        rebuilt = [m for m in ("i2cl", "icl_i2cl") if m in self.calibrated]
        if rebuilt:
            assert self.data is not None
            v = self.net.demonstration_vectors(self.data.demo_texts).mean(0)
            for m in rebuilt:
                self.context(m).copy_(v)
        if "task_vector" in self.methods:
            self._select_task_vector()

    def _select_task_vector(self) -> None:
        """App. B.1: vector from demonstrations + one extra query; layer by accuracy on the holdout queries."""
        data = self.data
        assert data is not None
        self.task_vector = self.net.last_hidden_per_layer(data.prefix + data.query(data.extra_query[0]))
        if self.hparams.task_vector_layer is not None or not data.holdout:
            chosen = self.hparams.task_vector_layer
            self.tv_layer = self.net.n_layers // 2 if chosen is None else chosen
            return
        texts = [t for t, _ in data.holdout]
        labels = torch.tensor([y for _, y in data.holdout])
        best, best_acc = 0, -1.0
        for layer in range(self.net.n_layers):
            self.tv_layer = layer
            preds = torch.cat([self.predict_method("task_vector", texts[i : i + 8]).cpu()
                               for i in range(0, len(texts), 8)])
            acc = float((preds == labels).float().mean())
            if acc > best_acc:
                best, best_acc = layer, acc
        self.tv_layer = best

    def on_test_epoch_start(self) -> None:
        self.test_rows = []
        self.seconds = {m: 0.0 for m in self.methods}
        self.queries = {m: 0 for m in self.methods}
        for metric in (*self.accuracy.values(), *self.macro_f1.values()):
            metric.reset()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        labels = batch["label"]
        for m in self.methods:
            self._sync()
            t0 = time.perf_counter()
            preds = self.predict_method(m, batch["text"])
            self._sync()
            self.seconds[m] += time.perf_counter() - t0
            self.queries[m] += len(batch["text"])
            self.accuracy[m].update((preds.cpu() == labels.cpu()).float())
            self.macro_f1[m].update(preds, labels.to(preds.device))

    def cached_params(self, method: str) -> int:
        """Table 1's cached parameters for this model: KV cache of the demonstrations (2 M L kv_width), context
        vectors (2 D L), the task vector (D)."""
        assert self.data is not None
        net = self.net
        M = net.n_tokens(self.data.prefix)
        kv = 2 * M * net.n_layers * net.kv_width
        vectors = 2 * net.hidden_size * net.n_layers
        return {"zero_shot": 0, "few_shot": kv, "task_vector": net.hidden_size, "icl_i2cl": kv + vectors}.get(
            method, vectors
        )

    def on_test_epoch_end(self) -> None:
        assert self.data is not None
        coords = {"task": self.data.name, "seed": self.data_seed}
        rows = []
        for m in self.methods:
            acc = float(self.accuracy[m].compute())
            # compute() already synced the ranks; sync_dist averages identical values and stops Lightning's
            # warning under DDP that these are not accumulated across devices (they are).
            self.log(f"test/accuracy/{m}", acc, sync_dist=True)
            rows.append(result_row("accuracy", acc, method=m, **coords))
            # macro-F1 next to accuracy shows whether a method's errors pile up on one label word
            f1 = float(self.macro_f1[m].compute())
            self.log(f"test/macro_f1/{m}", f1, sync_dist=True)
            rows.append(result_row("macro_f1", f1, method=m, **coords))
            if self.queries[m]:
                ms = 1000.0 * self.seconds[m] / self.queries[m]
                rows.append(result_row("latency_ms_per_query", ms, method=m, **coords))
            rows.append(result_row("cached_params", self.cached_params(m), method=m, **coords))
            # add and fixed_beta calibrate lambda only (beta stays 1): 2L scalars; linear both: 4L
            per_layer = 4 if self.hparams.inject_method == "linear" else 2
            trainable = per_layer * self.net.n_layers if m in CALIBRATED else 0
            rows.append(result_row("trainable_params", trainable, method=m, **coords))
        for k, m in enumerate(self.calibrated):
            rows.append(result_row("calibration_seconds", float(self.calib_seconds[k]), method=m, **coords))
            rows.append(result_row("calibration_seed", int(self.calib_seed), method=m, **coords))
        if "task_vector" in self.methods and self.tv_layer is not None:
            rows.append(result_row("task_vector_layer", self.tv_layer, method="task_vector", **coords))
        self.test_rows = rows
