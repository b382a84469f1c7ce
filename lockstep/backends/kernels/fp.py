"""Host side of ``fp.kc`` (``lockstep/spec/fp.py``): the elementwise ``+ - * /``, max/min, sqrt, neg, abs.

Each op is one grid-stride kernel: ``out[i] = ls_cn(op(a[i], b[i]))``, one IEEE operation then the
spec's flush and canonical NaN, per element; a scalar operand is read with step 0, other
operands are broadcast to the result's shape first (a copy). Also the flush probe's kernel
(``arith_probe``, not a spec op).
"""

from __future__ import annotations

import numpy as np

from .layout import F32, DeviceArray, LayoutOps

# op name -> its kernel; each op is ``_binary``/``_unary`` of its kernel (methods made below)
BINARY_KERNELS = {"add": "ls_add_kernel", "sub": "ls_sub_kernel", "mul": "ls_mul_kernel", "div": "ls_div_kernel",
                  "maximum": "ls_maximum_kernel", "minimum": "ls_minimum_kernel"}
UNARY_KERNELS = {"sqrt": "ls_sqrt_kernel", "neg": "ls_neg_kernel", "abs": "ls_abs_kernel"}


def binary_op(module: str, op: str, kernel: str):
    """The method ``op(self, a, b)``: spec ``module.op`` by the grid-stride kernel ``kernel``."""
    def method(self, a, b):
        return self._binary(kernel, a, b)
    method.__name__ = method.__qualname__ = op
    method.__doc__ = f"spec {module}.{op}: ``{kernel}``."
    return method


def unary_op(module: str, op: str, kernel: str):
    """The method ``op(self, a)`` (``op(self, x)`` for ``transcendental``, as the spec names it): spec
    ``module.op`` by the grid-stride kernel ``kernel``."""
    if module == "transcendental":
        def method(self, x):
            return self._unary(kernel, x)
    else:
        def method(self, a):
            return self._unary(kernel, a)
    method.__name__ = method.__qualname__ = op
    method.__doc__ = f"spec {module}.{op}: ``{kernel}``."
    return method


class FpOps(LayoutOps):
    """The elementwise ops of ``spec.fp`` (``add`` ... ``abs`` are set from the tables above)."""

    def _binary(self, kernel: str, a, b) -> DeviceArray:
        a, b = self._f32(a), self._f32(b)
        shape = np.broadcast_shapes(a.shape, b.shape)
        out = self.empty(shape, F32)
        n = out.size

        def operand(x):
            if x.size == 1:  # a scalar operand is read with step 0
                return self.contiguous(x).reshape(1), 0
            if x.shape == shape:
                return self.contiguous(x), 1
            return self.contiguous(x.broadcast_to(shape)), 1

        (da, sa), (db, sb) = operand(a), operand(b)
        self._ew(kernel, n, out, da, db, np.int32(n), np.int32(sa), np.int32(sb))
        return out

    def _unary(self, kernel: str, a) -> DeviceArray:
        a = self.contiguous(self._f32(a))
        out = self.empty(a.shape, F32)
        self._ew(kernel, a.size, out, a, np.int32(a.size))
        return out

    def arith_probe(self, a, b) -> dict[str, np.ndarray]:
        """Not a spec op: the flush probe's kernel (``ls_arith_probe_kernel``) on same-shaped float32 a, b.

        Host arrays ``{"mul_hw", "mul", "div_hw", "div"}``: the device's own ``a*b`` and ``a/b``
        as it computes them (no fix-up, no flush, not canonicalized), and the ops' ``mul``/``div``."""
        a, b = self.contiguous(self._f32(a)), self.contiguous(self._f32(b))
        if a.shape != b.shape:
            raise ValueError(f"arith_probe takes operands of one shape, got {a.shape} and {b.shape}")
        outs = {name: self.empty(a.shape, F32) for name in ("mul_hw", "mul", "div_hw", "div")}
        self._ew("ls_arith_probe_kernel", a.size, outs["mul_hw"], outs["mul"], outs["div_hw"], outs["div"], a, b,
                 np.int32(a.size))
        return {name: self.to_numpy(x) for name, x in outs.items()}


for _op, _kernel in BINARY_KERNELS.items():
    setattr(FpOps, _op, binary_op("fp", _op, _kernel))
for _op, _kernel in UNARY_KERNELS.items():
    setattr(FpOps, _op, unary_op("fp", _op, _kernel))
