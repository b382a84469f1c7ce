"""The trainer's hooks that live above it: the validation loss and the loss curve.

``lockstep train`` passes ``run_hooks()`` to ``lockstep.train.trainer.train``; the
trainer itself imports nothing of ``lockstep.use`` (the layers point one way).
"""

from __future__ import annotations

from lockstep.train.trainer import RunHooks

from .evaluate import eval_interval, record_validation
from .plots import plot_run


def run_hooks() -> RunHooks:
    """Validation every ``--eval-every`` steps (``evaluate.record_validation``) and ``loss.png`` at the end."""
    return RunHooks(validate=record_validation, eval_interval=eval_interval, plot=plot_run)
