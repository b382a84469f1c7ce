/* host_build.c -- the host build of ls_fp.h: array entry points for ctypes (lockstep/backends/kernels/host.py).
 * Compiled as C11 with -ffp-contract=off -fno-fast-math; -DLS_MODEL_FTZ_BEFORE=1 or
 * -DLS_MODEL_FTZ_AFTER=1 swap the IEEE operations for the hardware-flush models of
 * prelude_host.h, and -DLS_FLUSH_FIXUP=1 adds the Metal fix-up to * and /. Each function
 * applies one header primitive to n elements; outputs are stored as the kernels store them
 * (ls_cn), except the *_raw and *_hw entry points, which return the bare operation (with and
 * without the fix-up) so the models themselves can be checked, and *_exact, the integer
 * routines of the fix-up applied to every pair of normal operands (others give NaN). */
#include "prelude_host.h"
#include "ls_fp.h"

#define LS_EXPORT __attribute__((visibility("default")))

#define LS_HOST_BINARY(name, expr) \
    LS_EXPORT void name(long n, const float *a, const float *b, float *out) { \
        for (long i = 0; i < n; i++) out[i] = (expr); \
    }
#define LS_HOST_UNARY(name, expr) \
    LS_EXPORT void name(long n, const float *a, float *out) { \
        for (long i = 0; i < n; i++) out[i] = (expr); \
    }

LS_HOST_BINARY(ls_host_add, ls_cn(ls_add(a[i], b[i])))
LS_HOST_BINARY(ls_host_sub, ls_cn(ls_sub(a[i], b[i])))
LS_HOST_BINARY(ls_host_mul, ls_cn(ls_mul(a[i], b[i])))
LS_HOST_BINARY(ls_host_div, ls_cn(ls_div(a[i], b[i])))
LS_HOST_BINARY(ls_host_maximum, ls_cn(ls_max_total(a[i], b[i])))
LS_HOST_BINARY(ls_host_minimum, ls_cn(ls_min_total(a[i], b[i])))
LS_HOST_BINARY(ls_host_mul_raw, ls_mul_raw(a[i], b[i]))
LS_HOST_BINARY(ls_host_div_raw, ls_div_raw(a[i], b[i]))
LS_HOST_BINARY(ls_host_add_raw, ls_add_raw(a[i], b[i]))
LS_HOST_BINARY(ls_host_mul_hw, ls_mul_hw(a[i], b[i]))
LS_HOST_BINARY(ls_host_div_hw, ls_div_hw(a[i], b[i]))
LS_HOST_BINARY(ls_host_mul_exact, (ls_is_normal(a[i]) && ls_is_normal(b[i])) ? ls_mul_exact(a[i], b[i]) : ls_float(LS_CANONICAL_NAN_BITS))
LS_HOST_BINARY(ls_host_div_exact, (ls_is_normal(a[i]) && ls_is_normal(b[i])) ? ls_div_exact(a[i], b[i]) : ls_float(LS_CANONICAL_NAN_BITS))
LS_HOST_UNARY(ls_host_sqrt, ls_cn(ls_sqrt(a[i])))
LS_HOST_UNARY(ls_host_neg, ls_cn(ls_neg(a[i])))
LS_HOST_UNARY(ls_host_abs, ls_cn(ls_abs(a[i])))
LS_HOST_UNARY(ls_host_exp, ls_cn(ls_exp(a[i])))
LS_HOST_UNARY(ls_host_log, ls_cn(ls_log(a[i])))
LS_HOST_UNARY(ls_host_sigmoid, ls_cn(ls_sigmoid(a[i])))
LS_HOST_UNARY(ls_host_silu, ls_cn(ls_silu(a[i])))
LS_HOST_UNARY(ls_host_canon, ls_cn(a[i]))

/* exp/log over the bit patterns [first, first + n): for the 2**32 sweep (tools/sweep_header.py);
 * inputs are canonicalized first, as every op reads them. */
LS_EXPORT void ls_host_exp_range(ls_u64 first, long n, float *out) {
    for (long i = 0; i < n; i++) out[i] = ls_cn(ls_exp(ls_cn(ls_float((ls_u32)(first + (ls_u64)i)))));
}
LS_EXPORT void ls_host_log_range(ls_u64 first, long n, float *out) {
    for (long i = 0; i < n; i++) out[i] = ls_cn(ls_log(ls_cn(ls_float((ls_u32)(first + (ls_u64)i)))));
}

LS_EXPORT void ls_host_ldexp_exact(long n, const float *x, const ls_i32 *k, float *out) {
    for (long i = 0; i < n; i++) out[i] = ls_cn(ls_ldexp_exact(x[i], k[i]));
}

LS_EXPORT void ls_host_total_key(long n, const float *x, ls_i32 *out) {
    for (long i = 0; i < n; i++) out[i] = ls_total_key(x[i]);
}

LS_EXPORT void ls_host_quantize(long n, const float *x, const float *s, ls_i8 *out) {
    for (long i = 0; i < n; i++) out[i] = (ls_i8)ls_quantize(x[i], s[i]);
}

LS_EXPORT void ls_host_i32_to_f32(long n, const ls_i32 *a, float *out) {
    for (long i = 0; i < n; i++) out[i] = ls_i32_to_f32(a[i]);
}

LS_EXPORT void ls_host_i64_to_f32(long n, const ls_i64 *a, float *out) {
    for (long i = 0; i < n; i++) out[i] = ls_i64_to_f32(a[i]);
}

/* The fixed point of attention_backward_int8: a term on a grid, the grid of (a_max, b_max, lbits). */
LS_EXPORT void ls_host_fixed_term(long n, const float *a, const float *b, const ls_i32 *grid, ls_i64 *out) {
    for (long i = 0; i < n; i++) out[i] = ls_fixed_term(a[i], b[i], grid[i]);
}
LS_EXPORT void ls_host_dq_grid(long n, const float *a_max, const float *b_max, const ls_i32 *lbits, ls_i32 *out) {
    for (long i = 0; i < n; i++) out[i] = ls_dq_grid(a_max[i], b_max[i], lbits[i]);
}
LS_EXPORT void ls_host_fixed_to_f32(long n, const ls_i64 *s, const ls_i32 *grid, float *out) {
    for (long i = 0; i < n; i++) out[i] = ls_fixed_to_f32(s[i], grid[i]);
}

/* lane_tree_sum of `rows` rows of length len: lanes in registers (ls_fold32_private). */
LS_EXPORT void ls_host_lane_tree_sum(long rows, long len, const float *x, float *out) {
    for (long r = 0; r < rows; r++) {
        float lanes[LS_LANES];
        for (int j = 0; j < LS_LANES; j++) lanes[j] = 0.0f;
        for (long i = 0; i < len; i++) lanes[i % LS_LANES] = ls_add(lanes[i % LS_LANES], x[r * len + i]);
        out[r] = ls_cn(ls_fold32_private(lanes));
    }
}

/* Ascending contraction of rows: out[r] = sum_k a[r, k] * b[r, k] from +0.0 (ls_mac). */
LS_EXPORT void ls_host_dot_rows(long rows, long len, const float *a, const float *b, float *out) {
    for (long r = 0; r < rows; r++) {
        float acc = 0.0f;
        for (long k = 0; k < len; k++) acc = ls_mac(acc, a[r * len + k], b[r * len + k]);
        out[r] = ls_cn(acc);
    }
}

LS_EXPORT void ls_host_philox4x32(long n, const ls_u32 *counter, const ls_u32 *key, int rounds, ls_u32 *out) {
    for (long i = 0; i < n; i++) {
        ls_u32x4 c;
        c.w0 = counter[4 * i];
        c.w1 = counter[4 * i + 1];
        c.w2 = counter[4 * i + 2];
        c.w3 = counter[4 * i + 3];
        c = ls_philox4x32(c, key[2 * i], key[2 * i + 1], rounds);
        out[4 * i] = c.w0;
        out[4 * i + 1] = c.w1;
        out[4 * i + 2] = c.w2;
        out[4 * i + 3] = c.w3;
    }
}
