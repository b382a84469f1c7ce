"""Host side of ``quant.kc`` (``lockstep/spec/quant.py``): the int8 W8A8 linear layer, forward and backward.

Scales (weights per output channel, activations per tensor by absolute max: partial maxima in
groups of ``PARTIAL_LOCAL``, exact in any tree), quantization, the Walsh-Hadamard rotation
(work-groups of ``HADAMARD_LOCAL``) and the float rescale run in ``quant.kc``; the int8 GEMM is the
runtime's ``int8_gemm`` (exact in any order).
"""

from __future__ import annotations

import numpy as np

from .layout import F32, DeviceArray, LayoutOps, ParamBlock

PARTIAL_LOCAL = 64    # ls_abs_max_partial_kernel
HADAMARD_LOCAL = 128  # ls_hadamard_kernel


class QuantOps(LayoutOps):
    """The ops of ``spec.quant``."""

    def _activation_scale(self, x2: DeviceArray) -> DeviceArray:
        """spec quant.activation_scale as a 1-element device array."""
        n = x2.size
        if n == 0:
            raise ValueError("max of an empty axis")
        groups = self.rt.elementwise_groups(n, PARTIAL_LOCAL)
        partial = self.empty((groups,), np.uint32)
        self.rt.launch("ls_abs_max_partial_kernel", (groups,), (PARTIAL_LOCAL,), (partial, x2, np.int32(n)))
        sx = self.empty((1,), F32)
        self._single("ls_activation_scale_kernel", sx, partial, np.int32(groups))
        return sx

    def _weight_scale(self, w: DeviceArray) -> DeviceArray:
        """spec quant.weight_scale: (N,)."""
        k, n = w.shape
        sw = self.empty((n,), F32)
        self._ew("ls_weight_scale_kernel", n, sw, w, np.int32(k), np.int32(n))
        return sw

    def _quantize(self, kernel: str, x: DeviceArray, scale: DeviceArray, s_row: int, s_col: int, dtype) -> DeviceArray:
        rows, cols = x.shape
        out = self.empty((rows, cols), dtype)
        params = ParamBlock("ls_quantize_params", rows=rows, cols=cols, x_off=x.offset, x_rs=x.strides[0], x_cs=x.strides[1],
                            s_row=s_row, s_col=s_col)
        self._ew(kernel, rows * cols, out, x, scale, params)
        return out

    def _rescale(self, acc: DeviceArray, sa: DeviceArray, sa_step: int, sb: DeviceArray, sb_step: int, factor=None):
        m, n = acc.shape
        out = self.empty((m, n), F32)
        self._ew("ls_int8_rescale_kernel", m * n, out, acc, sa, sb, np.int32(m), np.int32(n), np.int32(sa_step),
                 np.int32(sb_step), np.int32(factor is not None), np.float32(0.0 if factor is None else factor))
        return out

    def _linear_operands(self, x, w):
        x = self._f32(x)
        w = self.contiguous(self._f32(w))
        if w.ndim != 2 or x.ndim < 1 or x.shape[-1] != w.shape[0]:
            raise ValueError(f"int8 linear: x {x.shape} and w {w.shape} do not contract")
        return x, self._rows2(x), w

    def int8_linear_forward(self, x, w):
        """spec quant.int8_linear_forward: scales, quantization and rescale in quant.kc, the GEMM by the
        runtime's ``int8_gemm``."""
        x, x2, w = self._linear_operands(x, w)
        sx = self._activation_scale(x2)
        sw = self._weight_scale(w)
        xq = self._quantize("ls_quantize_kernel", x2, sx, 0, 0, np.int8)
        wq = self._quantize("ls_quantize_kernel", w, sw, 0, 1, np.int8)
        y = self._rescale(self.rt.int8_gemm(xq, wq), sx, 0, sw, 1)
        return y.reshape(x.shape[:-1] + (w.shape[1],))

    def _hadamard(self, x: DeviceArray, axis: int) -> DeviceArray:
        """spec quant.hadamard_transform of a 2-d view along ``axis``; the result is contiguous."""
        from lockstep.spec.quant import hadamard_block

        n = x.shape[axis]
        other = x.shape[1 - axis]
        blk = hadamard_block(n)
        out = self.empty(x.shape, F32)
        x_ls, x_es = x.strides[1 - axis], x.strides[axis]
        o_ls, o_es = out.strides[1 - axis], out.strides[axis]
        if x.offset:
            x = self.contiguous(x)
            x_ls, x_es = x.strides[1 - axis], x.strides[axis]
        groups = min(other * (n // blk), self.rt.elementwise_groups(other * n, HADAMARD_LOCAL)) if n else 0
        if groups:
            self.rt.launch("ls_hadamard_kernel", (groups,), (HADAMARD_LOCAL,),
                           (out, x, np.int32(other), np.int32(n), np.int32(blk), np.int32(x_ls), np.int32(x_es),
                            np.int32(o_ls), np.int32(o_es)))
        return out

    def _line_scales(self, x: DeviceArray, axis: int) -> DeviceArray:
        """Per-line nonzero(max |x| / 127) of a 2-d view, lines across ``axis`` (the max runs along it)."""
        x = self.contiguous(x) if x.offset else x
        lines, length = x.shape[1 - axis], x.shape[axis]
        if length == 0:
            raise ValueError("max of an empty axis")
        out = self.empty((lines,), F32)
        self._rows("ls_abs_max_scale_lines_kernel", lines, out, x, np.int32(lines), np.int32(length),
                   np.int32(x.strides[1 - axis]), np.int32(x.strides[axis]))
        return out

    def _rotated_matmul(self, a: DeviceArray, b: DeviceArray, hadamard: bool) -> DeviceArray:
        """spec quant.int8_rotated_matmul: (M, C) x (C, N) -> (M, N) float32."""
        from lockstep.spec.quant import hadamard_block

        factor = None
        if hadamard:
            factor = np.float32(1.0 / hadamard_block(a.shape[1]))  # exact: a power of two
            a = self._hadamard(a, 1)
            b = self._hadamard(b, 0)
        sa = self._line_scales(a, 1)
        sb = self._line_scales(b, 0)
        aq = self._quantize("ls_quantize_kernel", a, sa, 1, 0, np.int8)
        bq = self._quantize("ls_quantize_kernel", b, sb, 0, 1, np.int8)
        return self._rescale(self.rt.int8_gemm(aq, bq), sa, 1, sb, 1, factor)

    def int8_linear_backward(self, dy, x, w, hadamard: bool = True):
        """spec quant.int8_linear_backward: returns (dx, dw)."""
        x, x2, w = self._linear_operands(x, w)
        dy2 = self._rows2(self._f32(dy))
        if dy2.shape != (x2.shape[0], w.shape[1]):
            raise ValueError(f"int8_linear_backward: dy {dy2.shape} for x {x2.shape} and w {w.shape}")
        sw = self._weight_scale(w)
        wdq = self._quantize("ls_dequantize_kernel", w, sw, 0, 1, F32)
        sx = self._activation_scale(x2)
        xdq = self._quantize("ls_dequantize_kernel", x2, sx, 0, 0, F32)
        dx = self._rotated_matmul(dy2, wdq.T, bool(hadamard))
        dw = self._rotated_matmul(xdq.T, dy2, bool(hadamard))
        return dx.reshape(x.shape), dw
