/* prelude_host.h -- C11 dialect: the host build of ls_fp.h (lockstep/backends/kernels/host.py).
 * Compiled with -std=c11 -O2 -ffp-contract=off -fno-fast-math (GCC ignores the FP_CONTRACT
 * pragma and contracts by default in GNU C modes, so the flag is what counts).
 *
 * Two compile-time switches replace the IEEE operations by models of hardware that flushes
 * float32 subnormals itself, so the fix-ups that such hardware needs (Apple GPUs, see
 * prelude_metal.h) can be tested here. Both read subnormal inputs as zeros of their sign (DAZ):
 *   -DLS_MODEL_FTZ_BEFORE=1  a result is flushed when its EXACT value is below 2**-126 in
 *                            magnitude (tininess before rounding: ARM FZ, the applegpu model);
 *   -DLS_MODEL_FTZ_AFTER=1   a result is flushed when, rounded to 24 bits with an unbounded
 *                            exponent, it is below 2**-126 (tininess after rounding: x86 FTZ).
 * Without either, the operations are IEEE with gradual underflow, which is what the spec's
 * "round, then flush" builds on. ls_mul_hw / ls_div_hw are the modelled hardware's own product
 * and quotient; -DLS_FLUSH_FIXUP=1 makes ls_mul_raw / ls_div_raw apply ls_fp.h's tiny-result
 * fix-up to them, exactly as prelude_metal.h does on Apple GPUs (the same two lines below). */
#include <stdint.h>
#include <string.h>
#include <math.h>
#define LS_DIALECT_HOST 1

typedef uint32_t ls_u32;
typedef int32_t ls_i32;
typedef uint64_t ls_u64;
typedef int64_t ls_i64;
typedef int8_t ls_i8;

#define LS_FN static inline
#define LS_GLOBAL
#define LS_LOCAL
#define LS_UNROLL /* fixed-count loops over a register block */
#define LS_PRIVATE
#define LS_BARRIER() ((void)0) /* one thread: the local-memory fold is not used on the host */

static inline ls_u32 ls_bits(float x) { ls_u32 u; memcpy(&u, &x, sizeof u); return u; }
static inline float ls_float(ls_u32 u) { float x; memcpy(&x, &u, sizeof x); return x; }
static inline ls_u32 ls_mulhi(ls_u32 a, ls_u32 b) { return (ls_u32)(((ls_u64)a * (ls_u64)b) >> 32); }

#if defined(LS_MODEL_FTZ_BEFORE) || defined(LS_MODEL_FTZ_AFTER)
#define LS_TWO_M126 0x1p-126
#define LS_TWO_P126 0x1p126
/* DAZ: a subnormal operand is read as a zero of its sign. */
static inline float ls_model_daz(float x) {
    ls_u32 u = ls_bits(x);
    return (u & 0x7F800000u) ? x : ls_float(u & 0x80000000u);
}
static inline float ls_model_zero(int negative) { return negative ? -0.0f : 0.0f; }
/* Is the nonzero exact value v (|v| < 2**-126, given as v * 2**126 in double, correctly rounded to
 * 24 bits by the float conversion) flushed by this model? */
static inline int ls_model_flushes_scaled(double v_scaled_abs, int exact_below) {
#if defined(LS_MODEL_FTZ_BEFORE)
    (void)v_scaled_abs;
    return exact_below;
#else
    /* after rounding: kept iff the value rounded to 24 bits (unbounded exponent) reaches 2**-126 */
    return exact_below && (float)v_scaled_abs < 1.0f;
#endif
}
static inline float ls_add_raw(float a, float b) {
    /* With normal (or zero) operands an exact sum below 2**-126 is representable: IEEE's result is
     * exact and both tininess rules flush it the same way. */
    float r = ls_model_daz(a) + ls_model_daz(b);
    return ls_model_daz(r);
}
static inline float ls_sub_raw(float a, float b) { return ls_model_daz(ls_model_daz(a) - ls_model_daz(b)); }
static inline float ls_mul_hw(float a, float b) {
    a = ls_model_daz(a);
    b = ls_model_daz(b);
    double p = (double)a * (double)b; /* exact: 24 x 24 significant bits */
    double ap = fabs(p);
    if (ap != 0.0 && ap < LS_TWO_M126 && ap == ap) {
        if (ls_model_flushes_scaled(ap * LS_TWO_P126, 1)) return ls_model_zero(p < 0.0);
    }
    return (float)p;
}
static inline float ls_div_hw(float a, float b) {
    a = ls_model_daz(a);
    b = ls_model_daz(b);
    double aa = fabs((double)a), ab = fabs((double)b);
    /* |a / b| < 2**-126 exactly iff |a| < 2**-126 * |b| (both sides exact in double) */
    if (aa != 0.0 && aa < ab * LS_TWO_M126 && ab != INFINITY) {
        /* a / b in double is correctly rounded to 53 bits, and double rounding 53 -> 24 is
         * innocuous for division (53 >= 2*24 + 2), so the float conversion below rounds the
         * exact quotient correctly. */
        double q_scaled = (aa / ab) * LS_TWO_P126;
        if (ls_model_flushes_scaled(q_scaled, 1)) return ls_model_zero((a < 0.0f) != (b < 0.0f));
    }
    return ls_model_daz(a / b);
}
static inline float ls_sqrt_raw(float a) { return ls_model_daz(sqrtf(ls_model_daz(a))); }
#else
static inline float ls_add_raw(float a, float b) { return a + b; }
static inline float ls_sub_raw(float a, float b) { return a - b; }
static inline float ls_mul_hw(float a, float b) { return a * b; }
static inline float ls_div_hw(float a, float b) { return a / b; }
static inline float ls_sqrt_raw(float a) { return sqrtf(a); }
#endif

#if defined(LS_FLUSH_FIXUP)
static inline float ls_mul_tiny_fixup(float a, float b, float r); /* ls_fp.h */
static inline float ls_div_tiny_fixup(float a, float b, float r);
static inline float ls_mul_raw(float a, float b) { return ls_mul_tiny_fixup(a, b, ls_mul_hw(a, b)); }
static inline float ls_div_raw(float a, float b) { return ls_div_tiny_fixup(a, b, ls_div_hw(a, b)); }
#else
static inline float ls_mul_raw(float a, float b) { return ls_mul_hw(a, b); }
static inline float ls_div_raw(float a, float b) { return ls_div_hw(a, b); }
#endif
