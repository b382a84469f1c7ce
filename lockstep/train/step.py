"""One training step, as pieces shared by the trainer (MPI) and the audit (TreeFold).

Step t (1-based) of a run with world size R:

1. ``plan_step``: the global batch is windows ``first .. first+n-1`` of the stream
   (``schedule.step_windows``, batch ramp included); ``tokens_before`` drives the
   learning rate. Rank r takes the windows m with ``m % R == r``, ascending.
2. ``rank_contribution``: rank r cuts its windows into micro-batches of
   ``micro_batch`` sequences (ascending; the last may be short), computes each one's
   loss and gradients as contributions to the global mean (``n_global = n * seq_len``
   target tokens), and sums them in ascending micro-batch order: ``acc = mb_0``, then
   ``acc = acc + mb_i``. A rank without windows contributes +0.0 everywhere. The
   loss rides along as the tensor ``LOSS_KEY`` of shape (1,).
3. The R contributions are combined with the fixed tree of ``collectives``
   (``butterfly_allreduce`` across ranks, ``tree_fold`` on one process).
4. ``apply_update``: clipping and AdamW (``optim.optimizer_step``), then the state
   root of parameters, moments and step, and the chain hash.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lockstep.spec import hashing

from .config import ModelConfig, TrainConfig
from .model import loss_and_grads, param_specs
from .optim import AdamWState, NonFiniteError, optimizer_step
from .schedule import learning_rate, step_windows

LOSS_KEY = "__loss__"


@dataclass(frozen=True)
class StepPlan:
    step: int
    first_window: int
    n_windows: int
    tokens_before: int
    seq_len: int

    @property
    def tokens_after(self) -> int:
        return self.tokens_before + self.n_windows * self.seq_len

    @property
    def n_global(self) -> int:
        return self.n_windows * self.seq_len

    def rank_windows(self, rank: int, world_size: int) -> np.ndarray:
        """Indices of the windows of ``rank`` (ascending)."""
        first, n = self.first_window, self.n_windows
        r0 = first + ((rank - first) % world_size)
        return np.arange(r0, first + n, world_size, dtype=np.int64)


def plan_step(tcfg: TrainConfig, seq_len: int, step: int) -> StepPlan:
    first, n, tokens = step_windows(tcfg, seq_len, step)
    return StepPlan(step, first, n, tokens, seq_len)


def rank_contribution(params: dict, windows: np.ndarray, cfg: ModelConfig, tcfg: TrainConfig,
                      n_global: int, backend, step: int | None = None) -> dict[str, np.ndarray]:
    """Sum of this rank's micro-batch gradients (and loss) in ascending micro-batch order."""
    be = backend
    acc = None
    mb = int(tcfg.micro_batch)
    for i in range(0, len(windows), mb):
        loss, grads = loss_and_grads(params, windows[i : i + mb], cfg, be, n_global=n_global)
        if not np.isfinite(float(np.asarray(be.to_numpy(loss)).reshape(-1)[0])):
            where = f" at step {step}" if step is not None else ""
            raise NonFiniteError(f"non-finite loss{where} (micro-batch starting at local window {i})")
        grads = {k: be.to_numpy(v) for k, v in grads.items()}
        grads[LOSS_KEY] = np.asarray(be.to_numpy(loss), dtype=np.float32).reshape(1)
        acc = grads if acc is None else {k: be.to_numpy(be.add(acc[k], grads[k])) for k in acc}
    if acc is None:
        acc = {s.name: np.zeros(s.shape, dtype=np.float32) for s in param_specs(cfg)}
        acc[LOSS_KEY] = np.zeros(1, dtype=np.float32)
    return acc


def state_tensors(params: dict, opt: AdamWState) -> dict[str, np.ndarray]:
    """The published state: parameters, AdamW moments and the step counter."""
    out = {f"param/{k}": np.asarray(v) for k, v in params.items()}
    out.update({f"adam_m/{k}": np.asarray(v) for k, v in opt.m.items()})
    out.update({f"adam_v/{k}": np.asarray(v) for k, v in opt.v.items()})
    out["step"] = np.array([opt.step], dtype=np.int64)
    return out


def split_state(tensors: dict[str, np.ndarray]) -> tuple[dict, AdamWState]:
    """Inverse of ``state_tensors`` (used when loading checkpoints)."""
    params = {k[len("param/"):]: v for k, v in tensors.items() if k.startswith("param/")}
    m = {k[len("adam_m/"):]: v for k, v in tensors.items() if k.startswith("adam_m/")}
    v = {k[len("adam_v/"):]: v for k, v in tensors.items() if k.startswith("adam_v/")}
    if "step" not in tensors or set(params) != set(m) or set(params) != set(v):
        raise ValueError("checkpoint tensors are not a lockstep training state (param/, adam_m/, adam_v/, step)")
    return params, AdamWState(int(np.asarray(tensors["step"]).reshape(-1)[0]), m, v)


@dataclass
class StepResult:
    params: dict
    opt: AdamWState
    loss: np.float32
    grad_norm: np.float32
    lr: np.float32
    state_root: str


def apply_update(params: dict, opt: AdamWState, summed: dict, plan: StepPlan, cfg: ModelConfig,
                 tcfg: TrainConfig, backend) -> StepResult:
    """Clip, AdamW, and the state root of the new state."""
    be = backend
    loss = np.float32(np.asarray(summed[LOSS_KEY]).reshape(-1)[0])
    if not np.isfinite(loss):
        raise NonFiniteError(f"non-finite loss at step {plan.step}: {loss}")
    grads = {k: v for k, v in summed.items() if k != LOSS_KEY}
    lr = learning_rate(tcfg, plan.tokens_after)  # tokens consumed once this step is done
    new_params, new_opt, norm = optimizer_step(params, grads, opt, cfg, tcfg, lr, be)
    new_params = {k: be.to_numpy(v) for k, v in new_params.items()}
    new_opt = AdamWState(new_opt.step, {k: be.to_numpy(v) for k, v in new_opt.m.items()},
                         {k: be.to_numpy(v) for k, v in new_opt.v.items()})
    root = hashing.state_root(state_tensors(new_params, new_opt))
    return StepResult(new_params, new_opt, loss, np.float32(np.asarray(be.to_numpy(norm)).reshape(-1)[0]), lr, root)


def float_record(x) -> dict:
    """A float32 for JSON: its value and its exact bits."""
    x = np.float32(x)
    return {"value": float(x), "bits": f"0x{int(np.asarray(x).view(np.uint32)):08X}"}


def emulate_step(params: dict, opt: AdamWState, windows: np.ndarray, plan: StepPlan, cfg: ModelConfig,
                 tcfg: TrainConfig, backend, world_size: int) -> StepResult:
    """Step ``plan.step`` of a ``world_size``-rank run, on one process (TreeFold).

    ``windows`` is the global batch (``plan.n_windows`` rows). Each virtual rank's
    contribution is computed in turn and pushed into the fixed tree
    (``collectives.TreeFolder``), so at most log2(R) + 1 contributions are alive.
    """
    from .collectives import TreeFolder, fold_order

    folder = TreeFolder(world_size, backend.add)
    for r in fold_order(world_size):
        mine = windows[plan.rank_windows(r, world_size) - plan.first_window]
        folder.push(rank_contribution(params, mine, cfg, tcfg, plan.n_global, backend, step=plan.step), rank=r)
    return apply_update(params, opt, folder.result(), plan, cfg, tcfg, backend)
