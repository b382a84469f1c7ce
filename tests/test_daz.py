"""The subnormal-input rule (SPEC_VERSION 2): every op reads a subnormal input as a zero of
its sign and any NaN input as 0x7FC00000, on the spec and on the Numba backend, and
``asarray`` is where backends apply it.
"""

import numpy as np
import pytest

from lockstep import spec
from lockstep.backends import get_backend
from lockstep.contract import CONTRACT, Kind
from lockstep.contract.vectors import FLUSH_VECTORS, SMALLEST_NORMAL
from lockstep.conformance import inputs as gen
from lockstep.conformance.registry import all_records
from lockstep.spec import fp

F = np.float32


def bits_of(x) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, dtype=F)).view(np.uint32)


def f(pattern: int) -> np.ndarray:
    return fp.from_bits(np.array([pattern], dtype=np.uint32)).copy()


def canonical_copy(x: np.ndarray) -> np.ndarray:
    """The boundary values with every subnormal replaced by a zero of its sign and every NaN canonical."""
    u = bits_of(x).copy()
    sub = ((u & 0x7F800000) == 0) & ((u & 0x7FFFFFFF) != 0)
    nan = ((u & 0x7F800000) == 0x7F800000) & ((u & 0x007FFFFF) != 0)
    u[sub] &= 0x80000000
    u[nan] = 0x7FC00000
    return u.view(F)


def test_the_examples_in_the_fp_docstring():
    assert bits_of(spec.add(f(0x00400000), f(0x00400000)))[0] == 0  # 2**-127 + 2**-127 = +0, not 2**-126
    assert bits_of(spec.sqrt(f(0x80000400)))[0] == 0x80000000  # sqrt(-subnormal) = -0.0, not NaN
    assert bits_of(spec.mul(f(0x00000001), F(2.0**100)))[0] == 0  # the subnormal is zero before the product
    assert bits_of(spec.div(f(0x00000001), f(0x80000001)))[0] == 0x7FC00000  # 0 / -0 = NaN, not -1.0
    assert bits_of(spec.div(F(1.0), f(0x80000001)))[0] == 0xFF800000  # 1 / -0 = -inf
    assert bits_of(spec.maximum(f(0x00000001), f(0x80000000)))[0] == 0  # +0 vs -0: +0
    assert bits_of(spec.neg(f(0x7FC12345)))[0] == 0x7FC00000


def test_flush_rule_vectors_give_the_smallest_normal():
    """Round-then-flush (the spec) against flush-before-rounding hardware: these four are 0x00800000."""
    for v in FLUSH_VECTORS:
        assert bits_of(getattr(spec, v.op)(f(v.a), f(v.b)))[0] == SMALLEST_NORMAL, v.label


def _elementwise_ops():
    return [op for op in CONTRACT if all(p.kind is Kind.F32_OPERAND for p in CONTRACT[op].params)]


@pytest.mark.parametrize("op", _elementwise_ops())
def test_spec_reads_boundary_inputs_canonically(op):
    """op(raw) == op(canonical(raw)) on every boundary value (pair), bit for bit."""
    fn = getattr(spec, op)
    if len(CONTRACT[op].params) == 2:
        a, b = gen.boundary_pairs()
        raw, canon = fn(a, b), fn(canonical_copy(a), canonical_copy(b))
    else:
        v = gen.boundary_values()
        raw, canon = fn(v), fn(canonical_copy(v))
    assert raw.tobytes() == canon.tobytes()


@pytest.mark.parametrize("rec", [r for r in all_records()], ids=lambda r: r.name)
def test_every_spec_op_reads_subnormal_inputs_as_zeros(rec):
    """Every op, on its conformance cases with subnormals and odd NaNs planted in the float inputs,
    gives the same bits as on the canonical inputs."""
    kinds = {p.name: p.kind for p in CONTRACT[rec.name].params}
    fn = getattr(spec, rec.name)
    for case in rec.cases(0, 1)[:2]:
        bound = CONTRACT[rec.name].signature().bind(*case.args, **case.kwargs)
        planted, canon = dict(bound.arguments), dict(bound.arguments)
        changed = False
        for name, value in bound.arguments.items():
            if kinds[name] in (Kind.F32, Kind.F32_OPERAND, Kind.F32_OR_NONE) and isinstance(value, np.ndarray) \
                    and value.dtype == F and value.size:
                p = _plant(value)
                planted[name], canon[name] = p, canonical_copy(p).reshape(p.shape)
                changed = True
        if not changed:
            continue
        want = fn(**canon)
        got = fn(**planted)
        wants = want if isinstance(want, tuple) else (want,)
        gots = got if isinstance(got, tuple) else (got,)
        for w, g in zip(wants, gots):
            if w is None:
                assert g is None
                continue
            assert np.asarray(w).tobytes() == np.asarray(g).tobytes(), (rec.name, case.label)


def _plant(x: np.ndarray) -> np.ndarray:
    """A copy of x with subnormals planted: every zero becomes a subnormal of its sign (read as that
    zero); without zeros, the smallest-magnitude element becomes the smallest subnormal of its sign
    (then the canonical copy has a zero there, and both must agree)."""
    u = bits_of(x).copy().reshape(x.shape)
    flat = u.reshape(-1)
    zeros = (flat & 0x7FFFFFFF) == 0
    flat[zeros] |= np.uint32(0x00000123)
    if not zeros.any():
        i = int(np.argmin(flat & 0x7FFFFFFF))
        flat[i] = (flat[i] & 0x80000000) | 0x00000001
    return u.view(F)


# ---------------------------------------------------------------- the Numba backend

@pytest.fixture(scope="module")
def nb():
    pytest.importorskip("numba")
    return get_backend("numba")


@pytest.mark.parametrize("op", _elementwise_ops())
def test_numba_reads_raw_host_arrays_canonically(nb, op):
    """Host arrays that never went through asarray (subnormals, NaN payloads) give the spec's bits."""
    if len(CONTRACT[op].params) == 2:
        args = gen.boundary_pairs()
        scalar_args = [(args[0], F(2.0**-140)), (F(-(2.0**-149)), args[1])]
    else:
        args = (gen.boundary_values(),)
        scalar_args = []
    assert getattr(nb, op)(*args).tobytes() == getattr(spec, op)(*args).tobytes()
    for sa in scalar_args:
        assert getattr(nb, op)(*sa).tobytes() == getattr(spec, op)(*sa).tobytes(), op


def test_numba_asarray_canonicalizes_without_copying_canonical_arrays(nb):
    v = gen.boundary_values()
    c = nb.asarray(v)
    assert c is not v and c.tobytes() == canonical_copy(v).tobytes()
    assert bits_of(v)[2] == 1  # the input is untouched
    already = canonical_copy(v)
    assert nb.asarray(already) is already
    ids = np.arange(5, dtype=np.int64)
    assert nb.asarray(ids) is ids
    assert get_backend("spec").asarray(already) is already
    assert get_backend("spec").asarray(v).tobytes() == c.tobytes()


def test_numba_scalars_and_tables_are_read_canonically(nb):
    """The scalar and table arguments (AdamW's, scale's, RoPE's tables, norm eps) follow the rule too."""
    sub = F(2.0**-140)
    x = gen.random_uniform(0, ("daz", "x"), (2, 3, 4, 8))
    cos = gen.random_uniform(0, ("daz", "cos"), (4, 4))
    sin = cos.copy()
    cos[0, 0] = sub
    sin[1, 1] = -sub
    assert nb.rope_forward(x, cos, sin).tobytes() == spec.rope_forward(x, cos, sin).tobytes()
    assert nb.rope_backward(x, cos, sin).tobytes() == spec.rope_backward(x, cos, sin).tobytes()
    g = gen.random_uniform(0, ("daz", "g"), (5, 7))
    assert nb.scale(g, sub).tobytes() == spec.scale(g, sub).tobytes()
    p, m, v = g, g * F(0.5), np.abs(g)
    args = (p, g, m, v, F(1e-3), F(0.9), F(0.95), F(0.1), F(0.05), sub, sub, F(0.1), F(0.05))
    for w, h in zip(spec.adamw_update(*args), nb.adamw_update(*args)):
        assert w.tobytes() == h.tobytes()
    assert nb.global_norm([sub, F(1.0)]).tobytes() == spec.global_norm([sub, F(1.0)]).tobytes()
    assert nb.clip_coefficient(sub).tobytes() == spec.clip_coefficient(sub).tobytes()


# ---------------------------------------------------------------- files from outside: read under the rule

@pytest.mark.parametrize("backend_name", ["spec", "numba"])
def test_a_checkpoint_with_subnormals_trains_like_its_canonical_copy(backend_name):
    """A state from outside holding subnormals (parameters and AdamW moments) is read under the rule:
    one training step from it gives the same loss, grad norm and state root as from the copy with
    those subnormals replaced by zeros of their sign."""
    if backend_name == "numba":
        pytest.importorskip("numba")
    from lockstep.spec.hashing import state_root
    from lockstep.formats.config import preset, train_preset
    from lockstep.train.model import init_params, loss_and_grads
    from lockstep.train.optim import optimizer_step
    from lockstep.formats.state import AdamWState
    from lockstep.formats.state import state_tensors

    be = get_backend(backend_name)
    cfg, tcfg = preset("tiny"), train_preset("tiny")
    params = init_params(cfg, seed=0)
    planted_p, planted_m, planted_v = {}, {}, {}
    for i, (name, p) in enumerate(params.items()):
        u = bits_of(p).copy().reshape(-1)
        u[i % u.size] = np.uint32(0x00000001 + 977 * i) | np.uint32(0x80000000 * (i % 2))  # a subnormal of either sign
        planted_p[name] = u.view(F).reshape(p.shape)
        mu = np.zeros(p.size, np.uint32)
        mu[::7] = 0x80000005  # -subnormal moments
        planted_m[name] = mu.view(F).reshape(p.shape)
        vu = np.zeros(p.size, np.uint32)
        vu[::5] = 0x00400000
        planted_v[name] = vu.view(F).reshape(p.shape)
    assert not fp.is_canonical(next(iter(planted_p.values())))
    windows = ((np.arange(tcfg.micro_batch)[:, None] * 7919 + np.arange(cfg.seq_len + 1)[None, :] * 31)
               % cfg.vocab_size).astype(np.int64)

    def one_step(p, m, v):
        state = AdamWState(0, m, v)
        loss, grads = loss_and_grads(p, windows, cfg, be)
        new_p, new_state, norm = optimizer_step(p, grads, state, cfg, tcfg, np.float32(1e-3), be)
        new_p = {k: be.to_numpy(x) for k, x in new_p.items()}
        new_state = AdamWState(new_state.step, {k: be.to_numpy(x) for k, x in new_state.m.items()},
                               {k: be.to_numpy(x) for k, x in new_state.v.items()})
        return bits_of(be.to_numpy(loss)).tobytes(), bits_of(be.to_numpy(norm)).tobytes(), \
            state_root(state_tensors(new_p, new_state))

    def canonical_dict(d):
        return {k: canonical_copy(x).reshape(x.shape) for k, x in d.items()}

    planted = one_step(planted_p, planted_m, planted_v)
    canonical = one_step(canonical_dict(planted_p), canonical_dict(planted_m), canonical_dict(planted_v))
    assert planted == canonical
