"""Lightning callbacks: metrics from :mod:`lit_icl.metrics` logged during a run, the guard every CLI run
gets against non-finite losses and weights (:class:`FiniteGuard`), and the CLI's checkpoint callback, which
survives a moved run folder (:class:`RunCheckpoint`), and the early-stopping rule shared by every paper
(:class:`StopWhenConverged`, ``--early_stopping.patience``), ``torch.compile`` of a module's nets
(:class:`CompileNets`, ``--compile.mode``), and exact resume of a run stopped inside an epoch
(:class:`ResumeInsideEpoch`, added to every CLI run), DDP ranks that agree to stop (SIGTERM, ``max_time``)
without a wait for the GPU at every step (:class:`StopTogether`, added to every CLI run), Ctrl-C that stops a fit
with a checkpoint as SIGTERM does (:class:`StopOnCtrlC`, added to every CLI run), SIGTERM in a validation round
that stops the fit after the round, with a checkpoint (:class:`FinishRoundOnSigterm`, added to every CLI run), each run's settings and metrics
in TensorBoard's HPARAMS tab (:class:`HParamsView`, added to every CLI run), a test or validate of a checkpoint
written at the fit's step for its weights (:class:`EvaluationAtTrainedStep`, added to every CLI run), and a census
of the reads that would make a GPU run wait for its device (:class:`HostReadCensus`)."""

from lit_icl.callbacks.checkpoint import RunCheckpoint
from lit_icl.callbacks.compile import CompileNets
from lit_icl.callbacks.ddp_stop import StopTogether
from lit_icl.callbacks.eval_step import EvaluationAtTrainedStep
from lit_icl.callbacks.finite import FiniteGuard
from lit_icl.callbacks.host_reads import HostReadCensus
from lit_icl.callbacks.hparams import HParamsView
from lit_icl.callbacks.interrupt import FinishRoundOnSigterm, StopOnCtrlC
from lit_icl.callbacks.representation import RepresentationMetrics
from lit_icl.callbacks.resume import ResumeInsideEpoch
from lit_icl.callbacks.stopping import StopWhenConverged

__all__ = [
    "CompileNets", "EvaluationAtTrainedStep", "FinishRoundOnSigterm", "FiniteGuard", "HParamsView", "HostReadCensus", "RepresentationMetrics", "ResumeInsideEpoch", "RunCheckpoint",
    "StopOnCtrlC", "StopTogether", "StopWhenConverged",
]
