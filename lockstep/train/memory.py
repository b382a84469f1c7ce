"""How much memory one step of a recipe needs, the plan that fits a budget, and the refusal before anything is allocated.

``step_memory(cfg, tcfg, execution, memory)`` is a model of the peak resident memory of
one training (or replayed) step, in bytes, term by term (``Breakdown``): the weights,
the AdamW moments, the tree's gradient sums, one micro-batch's activations, the
attention buffers, the int8 weight forms and the process's own baseline. The step has
two phases, and its peak is the larger:

* a micro-batch: the weights, the moments (unless in a scratch folder), the sums
  waiting in the tree (``spec.tree.TreeFolder``: ``depth(M)`` of them at most, for the
  ramp's largest ``M``; none in RAM with a scratch folder), the vector being written
  and one gradient (each is copied into the vector as the backward finishes it; with a
  scratch folder only that gradient's slice of the vector is in RAM, and the tree's
  adds run in pieces), and its activations at their largest (the end of the forward:
  every block's saved tensors, ``model.BlockSaved``, plus the logits and their
  gradient, ``N x V`` float32 each);
* the update: the old and the new weights, the step's sum and the other vectors the run's
  pool made for the tree (they stay allocated, to be reused; one tensor's worth of the sum
  with a scratch folder), and the old and new moments (one tensor's worth with a scratch folder).

``Execution.recompute`` keeps only each block's input (one block's saved tensors exist
again while it is differentiated); ``Execution.head_rows`` holds the logits and their
gradient for that many rows instead of ``N``. ``choose_execution`` goes through the
plans cheapest first (in memory; recompute; recompute and head rows; and all of that
with the state in a scratch folder) and returns the first that fits the budget, or refuses in one line.
The constants were calibrated against measured peak RSS on numba (``tests/test_memory_model.py``
checks the agreement within 25% on three small sizes).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

from lockstep.errors import Setting
from lockstep.formats.config import ConfigError, ModelConfig, TrainConfig
from lockstep.formats.rundir import RunFileError

from lockstep.backends import KERNELS_MEMORY, NUMBA_MEMORY, MemoryProfile

from .execution import IN_MEMORY, Execution
from .storage import ADD_PIECE

GiB = 2**30

# What each backend holds is its own declaration (``Backend.memory``, a
# ``backends.MemoryProfile``: its baseline, whether its step's state is device resident, its
# attention's score budget); the model below asks that, never a backend's name.


@dataclass(frozen=True)
class Breakdown:
    """The modelled peak of one step, by term (bytes), and which phase it is in."""

    terms: dict
    phase: str

    @property
    def total(self) -> int:
        return int(sum(self.terms.values()))


def _counts(cfg: ModelConfig):
    from lockstep.formats.params import param_specs

    specs = param_specs(cfg)
    params = sum(math.prod(s.shape) for s in specs)
    linear = sum(math.prod(s.shape) for s in specs if s.name.split(".")[-1] in ("wqkv", "wo", "w_gate_up", "w_down"))
    largest = max(math.prod(s.shape) for s in specs)
    return params, linear, largest


def block_saved_floats(cfg: ModelConfig, tokens: int) -> int:
    """Float32 values one block's forward keeps for its backward (``model.BlockSaved``) for ``tokens`` tokens.

    x, a_in, x_mid, f_in (D each); r1, r2; q, k, v as views of the fused projection
    ((H + 2G) Dh); rq, rk; qr, kr; o and the merged o2 (H Dh each); m, l (H each); gu (2F), hh (F).
    """
    d, h, g, dh, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
    per_token = 4 * d + 2 + (h + 2 * g) * dh + (h + g) + (h + g) * dh + 2 * h * dh + 2 * h + 3 * f
    return tokens * per_token


def activation_bytes(cfg: ModelConfig, micro_batch: int, execution: Execution = IN_MEMORY,
                     memory: MemoryProfile = NUMBA_MEMORY) -> dict:
    """One micro-batch's activations at their peak, by term (bytes), on a backend holding ``memory``."""
    n, t = micro_batch * cfg.seq_len, cfg.seq_len
    d, h, g, dh, v = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.vocab_size
    block = block_saved_floats(cfg, n)
    if execution.recompute:
        saved = cfg.n_layers * n * d + block  # each block's input, and one block recomputed
    else:
        saved = cfg.n_layers * block
    rows = n if execution.head_rows is None else min(n, execution.head_rows)
    out = {
        "activations": 4 * (saved + 4 * n * d + 3 * n),  # + the embedding, the last block's output, the final norm
        "logits": 4 * 2 * rows * v + 4 * 2 * n,          # logits and their gradient, the row statistics
        "backward transients": 4 * block // 2,           # a block's gradients in flight
    }
    scores = 4 * 2 * micro_batch * h * t * t
    budget = memory.score_budget
    if budget is not None and scores <= budget:  # two (B*H, T, T) score buffers, and a third in the backward
        out["attention"] = 4 * 3 * micro_batch * h * t * t
    elif budget is not None:  # past the budget the row kernels hold no T x T buffer: outputs and row statistics
        out["attention"] = 4 * 3 * micro_batch * h * t * (dh + 2)
    else:  # numba works in query blocks: the padded keys and a few blocks' rows per thread
        out["attention"] = 4 * (micro_batch * g * dh * (t + 8) + 2 * 64 * 4 * (t + 64))
    if cfg.quantize:  # each linear's int8 activation and its scales, forward and backward
        out["int8 activations"] = 2 * n * (d + 2 * cfg.ffn_dim + (h + 2 * g) * dh)
    return out


def step_memory(cfg: ModelConfig, tcfg: TrainConfig, execution: Execution = IN_MEMORY,
                memory: MemoryProfile = NUMBA_MEMORY) -> Breakdown:
    """The modelled peak resident bytes of one step of this recipe, executed as ``execution`` on a backend
    that holds ``memory`` (its ``Backend.memory``).

    The number of ranks plays no part (a rank's share is never larger than one process's). A
    scratch folder plays none on a device-resident backend (``train.storage``: its state stays on
    the device).
    """
    from lockstep.spec.tree import depth

    if not isinstance(memory, MemoryProfile):
        raise TypeError(f"memory is a backend's MemoryProfile (Backend.memory), got {type(memory).__name__}")
    params, linear, largest = _counts(cfg)
    most = max(n for _, n in tcfg.batch_ramp)
    m = -(-most // tcfg.micro_batch)
    waiting = depth(m)
    resident = memory.device_resident
    scratch = execution.scratch is not None and not resident  # a device-resident step keeps its state there
    vec = 4 * (params + 1)
    device = 4 * params if resident else 0  # the device copy of the weights (host memory on a CPU device)
    int8_weights = 2 * linear if cfg.quantize else 0  # the int8 forms, forward and transposed, kept for a step
    base = {"baseline": memory.baseline, "weights": 4 * params + device}

    mb = dict(base)
    mb["moments"] = 0 if scratch else 8 * params
    mb["waiting sums"] = 0 if scratch else waiting * vec
    # the gradients go into the vector one by one as the backward finishes them (``GradLayout.writer``):
    # the vector and one gradient; a host scratch vector keeps only that gradient's slice in RAM
    mb["micro-batch vector and gradients"] = (2 * 4 * largest if scratch else vec + 4 * largest) + \
        (4 * largest if resident else 0)  # a device-resident backend: the gradient's device copy too
    if scratch and waiting:  # the tree's adds run in pieces (``storage.ADD_PIECE``) of both operands
        mb["tree add pieces"] = min(vec, 2 * 4 * ADD_PIECE)
    mb["int8 weights"] = int8_weights
    mb.update(activation_bytes(cfg, min(tcfg.micro_batch, most), execution, memory))

    up = dict(base)
    up["new weights"] = 4 * params
    # out of core on the host: read tensor by tensor, pages released (a device-resident backend uploads it whole)
    # in memory the pool's vectors (the sum and the depth(M) it was built with) stay allocated for the run
    up["step sum and the pool's vectors"] = 4 * largest if scratch and not resident else (waiting + 1) * vec
    up["moments"] = 8 * largest * 2 if scratch else 16 * params
    up["clipped gradient"] = 4 * largest
    if resident:
        up["device update"] = 4 * 5 * largest

    a, b = Breakdown(mb, "micro-batch"), Breakdown(up, "update")
    return a if a.total >= b.total else b


def forward_memory(cfg: ModelConfig, batch: int, memory: MemoryProfile = NUMBA_MEMORY) -> int:
    """Modelled peak bytes of a forward without backward over ``batch`` windows (``lockstep eval``):
    the baseline, the weights (and their int8 forms), the forward's saved tensors and the logits."""
    params, linear, _ = _counts(cfg)
    acts = activation_bytes(cfg, batch, IN_MEMORY, memory)
    acts.pop("backward transients")
    acts["logits"] //= 2  # no gradient
    device = 4 * params if memory.device_resident else 0
    return memory.baseline + 4 * params + device + (2 * linear if cfg.quantize else 0) + sum(acts.values())


def require_budget(need: int, what: str, cfg: ModelConfig, max_memory: float | None = None) -> None:
    """``RunFileError`` (one line) when ``need`` bytes are beyond ``max_memory`` GiB (default: this machine's memory)."""
    budget = memory_budget(max_memory)
    if budget is not None and need > budget:
        raise RunFileError.naming(f"the recipe's model ({cfg.name}: d_model {cfg.d_model}, {cfg.n_layers} layers, "
                                  f"seq_len {cfg.seq_len}, vocab {cfg.vocab_size}) needs about {need / GiB:,.1f} GiB "
                                  f"to {what}; ", *budget_words(budget, max_memory), ": use a machine with more memory")


def device_memory(cfg: ModelConfig, micro_batch: int, execution: Execution = IN_MEMORY, batch: int | None = None,
                  memory: MemoryProfile = KERNELS_MEMORY) -> int:
    """Modelled bytes a GPU (a device-resident backend, ``memory``: its step stays on the device)
    holds in one step of ``batch`` windows (default ``micro_batch``: one micro-batch) cut into micro-batches
    of ``micro_batch``; the larger of its two phases:

    * a micro-batch: the weights, their int8 forms, the AdamW moments, the tree's waiting sums
      (``depth(M)``), the micro-batch's vector and one gradient in flight, and its activations
      (T x T attention scores within its ``score_budget``, row kernels past it);
    * the update: the old and the new parameters and moments (the old state stays until the
      step's result replaces it), the step's sum and one clipped gradient.
    """
    from lockstep.spec.tree import depth

    params, linear, largest = _counts(cfg)
    vec = 4 * (params + 1)
    m = -(-(micro_batch if batch is None else batch) // micro_batch)
    acts = activation_bytes(cfg, micro_batch, execution, memory)
    mb = (4 * params + (2 * linear if cfg.quantize else 0) + 8 * params + depth(m) * vec + vec + 4 * largest
          + sum(acts.values()))
    up = 2 * 12 * params + vec + 4 * largest
    return max(mb, up)


def plans(scratch: str | None) -> list[tuple[str, Execution]]:
    """The plans in the order the planner tries them (cheapest first)."""
    head = 1024
    out = [("in memory", IN_MEMORY), ("recompute", Execution(recompute=True)),
           (f"recompute, head in rows of {head}", Execution(recompute=True, head_rows=head))]
    if scratch is not None:
        out += [((label + ", " if label != "in memory" else "") + f"moments and sums in {scratch}",
                 replace(ex, scratch=scratch)) for label, ex in list(out)]
    return out


@dataclass(frozen=True)
class Plan:
    execution: Execution
    label: str
    need: int          # bytes, modelled
    budget: int | None

    def line(self, what: str) -> str:
        have = "" if self.budget is None else f" of {self.budget / GiB:,.1f} GiB"
        return f"memory plan to {what}: {self.label} (about {self.need / GiB:,.2f} GiB{have})"


def choose_execution(cfg: ModelConfig, tcfg: TrainConfig, what: str, *, max_memory: float | None = None,
                     memory: MemoryProfile = NUMBA_MEMORY, scratch: str | None = None,
                     given: Execution | None = None) -> Plan:
    """The cheapest plan whose modelled peak fits ``max_memory`` GiB (default: ``available_memory()``).

    ``given``: the caller fixed the execution; it is only checked. Raises ``RunFileError``
    (one line, naming the model, the need and the budget) when no plan fits: called
    before the model is built or any file is written.
    """
    budget = memory_budget(max_memory)
    out_of_core = scratch if not memory.device_resident else None  # a device-resident step's state is not in RAM
    options = [("as given", given)] if given is not None else plans(out_of_core)
    best = None
    for label, ex in options:
        need = step_memory(cfg, tcfg, ex, memory).total
        if budget is None or need <= budget:
            return Plan(ex, label, need, budget)
        best = need if best is None else min(best, need)
    hint = () if scratch is not None or given is not None or memory.device_resident else \
        (" (a scratch folder for the state, ", Setting("scratch"), " DIR, may bring it lower)")
    raise RunFileError.naming(f"the recipe's model ({cfg.name}: d_model {cfg.d_model}, {cfg.n_layers} layers, seq_len "
                              f"{cfg.seq_len}, vocab {cfg.vocab_size}, micro-batch {tcfg.micro_batch}) needs about "
                              f"{best / GiB:,.1f} GiB to {what} even in its smallest plan; ",
                              *budget_words(budget, max_memory), *hint, ": use a machine with more memory")


def memory_estimate(cfg: ModelConfig, tcfg: TrainConfig) -> int:
    """Bytes of one step held in memory on numba (``step_memory`` of the in-memory plan)."""
    return step_memory(cfg, tcfg).total


def available_memory() -> int | None:
    """Physical memory of this machine (and the address-space limit, if lower), or None if unknown."""
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            phys = min(phys, soft)
    except (ImportError, ValueError, OSError):
        pass
    return phys


def budget_words(budget: int, max_memory: float | None) -> tuple:
    """``this machine has X GiB`` or ``the budget (max_memory) is X GiB``, for the one-line refusals: message
    parts (``LockstepError.naming``), the budget named as the setting ``max_memory``."""
    if max_memory is None:
        return (f"this machine has {budget / GiB:,.1f} GiB",)
    return ("the budget (", Setting("max_memory"), f") is {budget / GiB:,.1f} GiB")


def memory_budget(max_memory: float | None) -> int | None:
    """``max_memory`` GiB in bytes, or this machine's memory when None."""
    if max_memory is None:
        return available_memory()
    if not float(max_memory) > 0:
        raise ConfigError.naming(Setting("max_memory"), f" must be a positive number of GiB, got {max_memory!r}")
    return int(float(max_memory) * GiB)


def require_memory(cfg: ModelConfig, tcfg: TrainConfig, what: str, *, max_memory: float | None = None,
                   memory: MemoryProfile = NUMBA_MEMORY, scratch: str | None = None) -> Plan:
    """The plan ``choose_execution`` picks; ``RunFileError`` when none fits: refuse before allocating."""
    return choose_execution(cfg, tcfg, what, max_memory=max_memory, memory=memory, scratch=scratch)
