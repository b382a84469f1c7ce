/* ls_fp.h -- the spec's float32 arithmetic, written once for OpenCL C, CUDA C++, Metal and C11.
 *
 * Implements lockstep/spec/fp.py (round, then flush; canonical NaN; total-order max/min),
 * lockstep/spec/transcendental.py (exp, log, sigmoid, silu: the same sequence of operations,
 * line for line), the lane-tree(32) fold of lockstep/spec/reduce.py, one Philox4x32 block of
 * lockstep/spec/philox.py, and the int8 helpers of lockstep/spec/quant.py.
 *
 * A dialect prelude (prelude_opencl.h, prelude_cuda.h, prelude_metal.h, prelude_host.h) comes
 * first and defines: the integer types ls_u32 ls_i32 ls_u64 ls_i64 ls_i8; the function
 * qualifier LS_FN; the address-space words LS_GLOBAL LS_LOCAL LS_PRIVATE; LS_BARRIER();
 * ls_bits/ls_float (exact reinterpretation); ls_mulhi; and the five IEEE operations
 * ls_add_raw ls_sub_raw ls_mul_raw ls_div_raw ls_sqrt_raw, each ONE correctly rounded
 * operation (round to nearest even, never contracted into an FMA) whose result, after ls_fl,
 * is the spec's; and ls_mul_hw ls_div_hw, the hardware's own product and quotient (the same
 * as ls_mul_raw / ls_div_raw except on hardware that flushes subnormals itself, where the
 * raw operations add the tiny-result fix-up defined below: the Metal prelude, and the host
 * build's FTZ models with LS_FLUSH_FIXUP). Everything below is plain C that all four dialects
 * share.
 *
 * Inputs: every op argument is canonical (SPEC_VERSION 2: subnormal inputs are read as zeros
 * of their sign, NaNs as 0x7FC00000; backends canonicalize when data enters the device, and
 * every stored result is canonical). The helpers here rely on that only where it is said.
 * Results: ls_add .. ls_sqrt flush (a subnormal result becomes a zero of its sign) but keep a
 * NaN's payload; kernels apply ls_cn to every value they store (flush + canonical NaN).
 */

#define LS_SIGN_BIT 0x80000000u
#define LS_EXPONENT_MASK 0x7F800000u
#define LS_MANTISSA_MASK 0x007FFFFFu
#define LS_ABS_MASK 0x7FFFFFFFu
#define LS_CANONICAL_NAN_BITS 0x7FC00000u
#define LS_POS_INF_BITS 0x7F800000u
#define LS_NEG_INF_BITS 0xFF800000u
#define LS_LANES 32

/* ------------------------------------------------------------------ fp: exact * and / for flushing hardware
 *
 * Hardware that flushes float32 subnormals itself (Apple GPUs, always; see prelude_metal.h) and
 * the spec can differ only where the hardware gives a ZERO: a product or quotient of nonzero
 * finite operands whose exact value lies in [2**-126 - 2**-150, 2**-126) is 2**-126 in the spec
 * (IEEE rounds it on the subnormal grid up to the smallest normal, and the flush keeps that), and
 * 0 where the flush decides tininess before rounding (Apple, reportedly; ARM FZ); deciding after
 * rounding (x86 FTZ) keeps [2**-126 - 2**-151, 2**-126) and flushes the rest of the band. Every
 * value the hardware keeps is IEEE's (docs/gpu-kernels.md, "Subnormals on GPUs").
 *
 * So ls_mul_tiny_fixup / ls_div_tiny_fixup take the hardware's result r and, only when r is a
 * zero while both operands are nonzero and finite, recompute the spec's result exactly with
 * integer arithmetic. That is right under either tininess rule, and also when a zero is wrong
 * for another reason (a quotient formed through an underflowed reciprocal). The path is rare in
 * training: it runs only for results that underflow, and most of those leave at the exponent
 * test at its start. */

#define LS_IMPLICIT_BIT 0x00800000u
#define LS_SMALLEST_NORMAL_BITS 0x00800000u

/* Exponent field of x (0 for zeros, 255 for inf and NaN). */
LS_FN int ls_exponent_field(float x) { return (int)((ls_bits(x) >> 23) & 0xFFu); }

/* Is x nonzero and finite? (Exponent field 1..254: a subnormal counts as the zero the spec and
 * flushing hardware read it as.) */
LS_FN int ls_is_normal(float x) { int e = ls_exponent_field(x); return e != 0 && e != 0xFF; }

/* The 24-bit significand of a normal x, as an integer in [2**23, 2**24): x = +-m * 2**(field - 150). */
LS_FN ls_u32 ls_significand(float x) { return (ls_bits(x) & LS_MANTISSA_MASK) | LS_IMPLICIT_BIT; }

/* The spec's float32 (IEEE round to nearest even with gradual underflow, then flush) of
 * +-(m + s) * 2**e, as bits; sign is 0 or LS_SIGN_BIT, m > 0, and s in [0, 1) is nonzero iff
 * sticky. With sticky set, m must be at least 2**24, so that after m is shifted up to 63 bits
 * the sticky part still lies below the rounding position. */
LS_FN ls_u32 ls_round_flush_bits(ls_u32 sign, ls_u64 m, int e, int sticky) {
    for (int shift = 32; shift >= 1; shift >>= 1) { /* normalize: m in [2**62, 2**63) */
        if (m < ((ls_u64)1 << (63 - shift))) {
            m <<= shift;
            e -= shift;
        }
    }
    int top = e + 62; /* the value lies in [2**top, 2**(top + 1)) */
    if (top > 127) return sign | LS_POS_INF_BITS;
    if (top < -127) return sign; /* below 2**-127: rounds to a subnormal or zero, flushed */
    if (top == -127) /* [2**-127, 2**-126): IEEE gives 2**-126 iff the value is >= 2**-126 - 2**-150 */
        return (m >= ((ls_u64)0xFFFFFFu << 39)) ? (sign | LS_SMALLEST_NORMAL_BITS) : sign;
    ls_u32 q = (ls_u32)(m >> 39); /* the 24 bits kept */
    ls_u64 rest = m & (((ls_u64)1 << 39) - 1u), halfway = (ls_u64)1 << 38;
    if (rest > halfway || (rest == halfway && (sticky || (q & 1u)))) q++;
    if (q == 0x01000000u) { /* rounded up to the next power of two */
        q = LS_IMPLICIT_BIT;
        top++;
        if (top > 127) return sign | LS_POS_INF_BITS;
    }
    return sign | ((ls_u32)(top + 127) << 23) | (q & LS_MANTISSA_MASK);
}

/* spec fp.mul of two normal (nonzero finite) operands, by integers: the 48-bit significand product. */
LS_FN float ls_mul_exact(float a, float b) {
    ls_u64 m = (ls_u64)ls_significand(a) * (ls_u64)ls_significand(b);
    int e = ls_exponent_field(a) + ls_exponent_field(b) - 300;
    return ls_float(ls_round_flush_bits((ls_bits(a) ^ ls_bits(b)) & LS_SIGN_BIT, m, e, 0));
}

/* spec fp.div of two normal (nonzero finite) operands, by integers: restoring division of the
 * significands to 32 quotient bits (q = floor(ma / mb * 2**31) >= 2**30), the remainder as sticky. */
LS_FN float ls_div_exact(float a, float b) {
    ls_u32 mb = ls_significand(b), r = ls_significand(a), q = 0u;
    for (int i = 0; i < 32; i++) { /* r < 2 * mb < 2**25 throughout */
        q <<= 1;
        if (r >= mb) {
            r -= mb;
            q |= 1u;
        }
        r <<= 1;
    }
    int e = ls_exponent_field(a) - ls_exponent_field(b) - 31;
    return ls_float(ls_round_flush_bits((ls_bits(a) ^ ls_bits(b)) & LS_SIGN_BIT, (ls_u64)q, e, r != 0u));
}

/* r = the hardware's a * b. A zero from nonzero finite operands is recomputed exactly, unless the
 * exponents alone put |a * b| below 2**-127 (then it is a flushed zero of the product's sign). */
LS_FN float ls_mul_tiny_fixup(float a, float b, float r) {
    if ((ls_bits(r) & LS_ABS_MASK) != 0u || !ls_is_normal(a) || !ls_is_normal(b)) return r;
    if (ls_exponent_field(a) + ls_exponent_field(b) <= 125) /* |a * b| < 2**(ea + eb - 252) <= 2**-127 */
        return ls_float((ls_bits(a) ^ ls_bits(b)) & LS_SIGN_BIT);
    return ls_mul_exact(a, b);
}

/* r = the hardware's a / b; the same rule (|a / b| < 2**(ea - eb + 1)). */
LS_FN float ls_div_tiny_fixup(float a, float b, float r) {
    if ((ls_bits(r) & LS_ABS_MASK) != 0u || !ls_is_normal(a) || !ls_is_normal(b)) return r;
    if (ls_exponent_field(a) - ls_exponent_field(b) <= -128)
        return ls_float((ls_bits(a) ^ ls_bits(b)) & LS_SIGN_BIT);
    return ls_div_exact(a, b);
}

/* ------------------------------------------------------------------ fp: the five operations */

/* Round, then flush: r is already rounded; exponent field 0 (zero or subnormal) -> zero of r's sign. */
LS_FN float ls_fl(float r) {
    ls_u32 u = ls_bits(r);
    return (u & LS_EXPONENT_MASK) ? r : ls_float(u & LS_SIGN_BIT);
}

LS_FN int ls_isnan(float x) { return (ls_bits(x) & LS_ABS_MASK) > LS_POS_INF_BITS; }

/* What every kernel stores: flushed, and any NaN as the canonical 0x7FC00000. */
LS_FN float ls_cn(float r) {
    ls_u32 u = ls_bits(r);
    if ((u & LS_EXPONENT_MASK) == 0u) return ls_float(u & LS_SIGN_BIT);
    if ((u & LS_ABS_MASK) > LS_POS_INF_BITS) return ls_float(LS_CANONICAL_NAN_BITS);
    return r;
}

LS_FN float ls_add(float a, float b) { return ls_fl(ls_add_raw(a, b)); }
LS_FN float ls_sub(float a, float b) { return ls_fl(ls_sub_raw(a, b)); }
LS_FN float ls_mul(float a, float b) { return ls_fl(ls_mul_raw(a, b)); }
LS_FN float ls_div(float a, float b) { return ls_fl(ls_div_raw(a, b)); }
LS_FN float ls_sqrt(float a) { return ls_fl(ls_sqrt_raw(a)); }
/* The contraction step of every float sum of products: product rounded, then sum rounded. */
LS_FN float ls_mac(float acc, float a, float b) { return ls_add(acc, ls_mul(a, b)); }
/* Exact sign operations (spec fp.neg / fp.abs): bit flips, no rounding. */
LS_FN float ls_neg(float a) { return ls_float(ls_bits(a) ^ LS_SIGN_BIT); }
LS_FN float ls_abs(float a) { return ls_float(ls_bits(a) & LS_ABS_MASK); }

/* A signed key whose order is the float total order -0.0 < +0.0 (spec fp._total_key); every NaN
 * gets the key of the canonical NaN, above +inf, so "max" finds a NaN and "argmax" its first one. */
LS_FN ls_i32 ls_total_key(float x) {
    ls_u32 u = ls_bits(x);
    if ((u & LS_ABS_MASK) > LS_POS_INF_BITS) return (ls_i32)LS_CANONICAL_NAN_BITS;
    return (u & LS_SIGN_BIT) ? -(ls_i32)(u & LS_ABS_MASK) - 1 : (ls_i32)u;
}

/* Inverse of ls_total_key (exact). */
LS_FN float ls_from_total_key(ls_i32 k) {
    return (k < 0) ? ls_float(((ls_u32)(-(k + 1))) | LS_SIGN_BIT) : ls_float((ls_u32)k);
}

/* spec fp.maximum / fp.minimum: total order, a NaN operand gives the canonical NaN. */
LS_FN float ls_max_total(float a, float b) {
    if (ls_isnan(a) || ls_isnan(b)) return ls_float(LS_CANONICAL_NAN_BITS);
    return (ls_total_key(a) >= ls_total_key(b)) ? a : b;
}
LS_FN float ls_min_total(float a, float b) {
    if (ls_isnan(a) || ls_isnan(b)) return ls_float(LS_CANONICAL_NAN_BITS);
    return (ls_total_key(a) <= ls_total_key(b)) ? a : b;
}

/* spec fp.ldexp_exact: x * 2**k as up to three products by normal powers of two, each rounded
 * and flushed (k clipped to [-300, 300]; k1 = clip(k, -126, 127), k2 = clip(k - k1, -126, 127),
 * k3 = k - k1 - k2). */
LS_FN int ls_clip_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }
LS_FN float ls_pow2(int k) { return ls_float(((ls_u32)(k + 127)) << 23); } /* k in [-126, 127] */
LS_FN float ls_ldexp_exact(float x, int k) {
    k = ls_clip_int(k, -300, 300);
    int k1 = ls_clip_int(k, -126, 127);
    int k2 = ls_clip_int(k - k1, -126, 127);
    int k3 = k - k1 - k2;
    float r = ls_mul(x, ls_pow2(k1));
    r = ls_mul(r, ls_pow2(k2));
    return ls_mul(r, ls_pow2(k3));
}

/* ------------------------------------------------------------------ transcendental */

/* Constants of lockstep/spec/transcendental.py, as the same bit patterns. */
#define LS_ONE ls_float(0x3F800000u)
#define LS_TWO ls_float(0x40000000u)
#define LS_HALF ls_float(0x3F000000u)
#define LS_LN2_HI ls_float(0x3F317200u)
#define LS_LN2_LO ls_float(0x35BFBE8Eu)
#define LS_INV_LN2 ls_float(0x3FB8AA3Bu)
#define LS_ROUND_MAGIC ls_float(0x4B400000u)
#define LS_EXP_ARG_MAX ls_float(0x42B20000u)
#define LS_EXP_ARG_MIN ls_float(0xC2D00000u)
#define LS_EXP_C3 ls_float(0x3E2AAAABu)
#define LS_EXP_C4 ls_float(0x3D2AAAABu)
#define LS_EXP_C5 ls_float(0x3C088889u)
#define LS_EXP_C6 ls_float(0x3AB60B61u)
#define LS_EXP_C7 ls_float(0x39500D01u)
#define LS_EXP_C8 ls_float(0x37D00D01u)
#define LS_LOG_SQRT2_MANTISSA 0x3504F4u
#define LS_LOG_L3 ls_float(0x3F2AAAABu)
#define LS_LOG_L5 ls_float(0x3ECCCCCDu)
#define LS_LOG_L7 ls_float(0x3E924925u)
#define LS_LOG_L9 ls_float(0x3E638E39u)
#define LS_LOG_L11 ls_float(0x3E3A2E8Cu)
#define LS_HIGH_12_BITS_MASK 0xFFFFF000u

/* v with its 12 low mantissa bits cleared (exact); the rest is v - hi (exact). */
LS_FN float ls_split12_hi(float v) { return ls_float(ls_bits(v) & LS_HIGH_12_BITS_MASK); }

/* spec transcendental.exp, for a canonical x. The "Order of operations" block of its docstring,
 * line for line. */
LS_FN float ls_exp(float x) {
    if (ls_isnan(x)) return ls_float(LS_CANONICAL_NAN_BITS);
    float xc = ls_min_total(ls_max_total(x, LS_EXP_ARG_MIN), LS_EXP_ARG_MAX);
    /* Cody-Waite reduction: x = k*ln2 + r */
    float kf = ls_sub(ls_add(ls_mul(xc, LS_INV_LN2), LS_ROUND_MAGIC), LS_ROUND_MAGIC);
    float hi = ls_sub(xc, ls_mul(kf, LS_LN2_HI)); /* exact: |k| <= 150, LN2_HI has 16 bits */
    float lo = ls_mul(kf, LS_LN2_LO);
    float r = ls_sub(hi, lo);
    float r_err = ls_sub(ls_sub(hi, r), lo);
    /* r**3 * P(r), Horner from the highest coefficient */
    float p = LS_EXP_C8;
    p = ls_add(LS_EXP_C7, ls_mul(r, p));
    p = ls_add(LS_EXP_C6, ls_mul(r, p));
    p = ls_add(LS_EXP_C5, ls_mul(r, p));
    p = ls_add(LS_EXP_C4, ls_mul(r, p));
    p = ls_add(LS_EXP_C3, ls_mul(r, p));
    float c3 = ls_mul(ls_mul(ls_mul(r, r), r), p);
    /* r*r/2 as an exact head plus a tiny tail */
    float r_hi = ls_split12_hi(r);
    float r_lo = ls_sub(r, r_hi);
    float h2_hi = ls_mul(LS_HALF, ls_mul(r_hi, r_hi));
    float h2_lo = ls_add(ls_mul(r_hi, r_lo), ls_mul(LS_HALF, ls_mul(r_lo, r_lo)));
    /* 1 + r + h2_hi with both rounding errors kept, then everything small at once */
    float y1 = ls_add(LS_ONE, r);
    float e1 = ls_add(ls_sub(LS_ONE, y1), r);
    float y2 = ls_add(y1, h2_hi);
    float e2 = ls_add(ls_sub(y1, y2), h2_hi);
    float tail = ls_add(ls_add(e1, e2), ls_add(ls_add(h2_lo, c3), ls_mul(r_err, y1)));
    float y = ls_add(y2, tail);
    return ls_ldexp_exact(y, (int)kf); /* exact: kf is an integer in [-150, 128] */
}

/* spec transcendental.log, for a canonical x. */
LS_FN float ls_log(float x) {
    ls_u32 u = ls_bits(x);
    int positive_normal = (u >= 0x00800000u) && (u < LS_POS_INF_BITS);
    float xc = positive_normal ? x : LS_ONE;
    /* exponent and significand (exact integer and bit operations) */
    ls_u32 uc = ls_bits(xc);
    int e = (int)(uc >> 23) - 127;
    ls_u32 mb = uc & LS_MANTISSA_MASK;
    int upper = mb >= LS_LOG_SQRT2_MANTISSA;
    float m = ls_float(mb | (upper ? 0x3F000000u : 0x3F800000u));
    e = e + upper;
    float ef = (float)e; /* exact: |e| <= 128 */
    float f = ls_sub(m, LS_ONE);
    float s = ls_div(f, ls_add(LS_TWO, f));
    float z = ls_mul(s, s);
    float R = LS_LOG_L11;
    R = ls_add(LS_LOG_L9, ls_mul(z, R));
    R = ls_add(LS_LOG_L7, ls_mul(z, R));
    R = ls_add(LS_LOG_L5, ls_mul(z, R));
    R = ls_add(LS_LOG_L3, ls_mul(z, R));
    R = ls_mul(z, R);
    float f_hi = ls_split12_hi(f);
    float f_lo = ls_sub(f, f_hi);
    float hf_hi = ls_mul(LS_HALF, ls_mul(f_hi, f_hi));
    float hf_lo = ls_add(ls_mul(f_hi, f_lo), ls_mul(LS_HALF, ls_mul(f_lo, f_lo)));
    float t = ls_mul(s, ls_add(ls_add(hf_hi, hf_lo), R));
    float A = ls_mul(ef, LS_LN2_HI);
    float S1 = ls_add(A, f);
    float E1 = ls_add(ls_sub(A, S1), f);
    float S2 = ls_sub(S1, hf_hi);
    float E2 = ls_sub(ls_sub(S1, S2), hf_hi);
    float tail = ls_add(ls_add(ls_sub(t, hf_lo), ls_mul(ef, LS_LN2_LO)), ls_add(E1, E2));
    float y = ls_add(S2, tail);
    /* special values, selected (no arithmetic) */
    if (u == LS_POS_INF_BITS) y = ls_float(LS_POS_INF_BITS);
    if ((u & LS_ABS_MASK) == 0u) y = ls_float(LS_NEG_INF_BITS);
    if (ls_isnan(x) || ((u & LS_SIGN_BIT) && (u & LS_ABS_MASK) != 0u)) y = ls_float(LS_CANONICAL_NAN_BITS);
    return y;
}

/* spec transcendental.sigmoid: 1 / (1 + exp(-x)). */
LS_FN float ls_sigmoid(float x) { return ls_div(LS_ONE, ls_add(LS_ONE, ls_exp(ls_neg(x)))); }

/* spec transcendental.silu: x * sigmoid(x); silu(-inf) = -0.0. */
LS_FN float ls_silu(float x) {
    if (ls_bits(x) == LS_NEG_INF_BITS) return ls_float(LS_SIGN_BIT);
    return ls_mul(x, ls_sigmoid(x));
}

/* ------------------------------------------------------------------ reduce: the lane-tree(32) fold */

/* Step 2 of spec reduce.lane_tree_sum, on 32 lane sums held by one thread:
 * lane[j] = lane[j] + lane[j + w] for j < w, w = 16, 8, 4, 2, 1; returns lane 0. */
LS_FN float ls_fold32_private(LS_PRIVATE float *lanes) {
    for (int w = LS_LANES / 2; w >= 1; w >>= 1)
        for (int j = 0; j < w; j++) lanes[j] = ls_add(lanes[j], lanes[j + w]);
    return lanes[0];
}

/* The same fold done by the 32 work-items lid = 0..31 of a work-group on lanes[0..31] in local
 * memory. Every work-item of the group must call it (it holds barriers); lanes[] must have been
 * written and a barrier passed before the call. Returns lane 0's value to every caller. */
LS_FN float ls_fold32_local(LS_LOCAL float *lanes, int lid) {
    for (int w = LS_LANES / 2; w >= 1; w >>= 1) {
        float v = 0.0f;
        if (lid < w) v = ls_add(lanes[lid], lanes[lid + w]);
        LS_BARRIER();
        if (lid < w) lanes[lid] = v;
        LS_BARRIER();
    }
    return lanes[0];
}

/* ------------------------------------------------------------------ philox: one Philox4x32 block */

typedef struct { ls_u32 w0, w1, w2, w3; } ls_u32x4;

/* spec philox.philox4x32 for one counter block: `rounds` rounds of
 *   hi0, lo0 = mulhilo(M0, c0); hi1, lo1 = mulhilo(M1, c2);
 *   c = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)
 * with the key bumped by the Weyl constants between rounds. */
LS_FN ls_u32x4 ls_philox4x32(ls_u32x4 c, ls_u32 k0, ls_u32 k1, int rounds) {
    for (int r = 0; r < rounds; r++) {
        if (r > 0) {
            k0 = k0 + 0x9E3779B9u; /* golden ratio */
            k1 = k1 + 0xBB67AE85u; /* sqrt(3) - 1 */
        }
        ls_u32 hi0 = ls_mulhi(0xD2511F53u, c.w0), lo0 = 0xD2511F53u * c.w0;
        ls_u32 hi1 = ls_mulhi(0xCD9E8D57u, c.w2), lo1 = 0xCD9E8D57u * c.w2;
        ls_u32x4 n;
        n.w0 = hi1 ^ c.w1 ^ k0;
        n.w1 = lo1;
        n.w2 = hi0 ^ c.w3 ^ k1;
        n.w3 = lo0;
        c = n;
    }
    return c;
}

/* ------------------------------------------------------------------ quant: int8 helpers */

/* int32 -> float32 rounded to nearest even, by integer arithmetic (no reliance on the dialect's
 * conversion rounding, which Metal does not pin down): exact while |a| <= 2**24 (int8 GEMM sums
 * with K <= 1040, row lengths), correctly rounded beyond. Kernels convert every int that could
 * exceed 2**24 through it (a cast is used only for small ones: exponents, int8 values). */
LS_FN float ls_i32_to_f32(ls_i32 a) {
    ls_u32 sign = (a < 0) ? LS_SIGN_BIT : 0u;
    ls_u32 m = (a < 0) ? (ls_u32)0u - (ls_u32)a : (ls_u32)a;
    if (m <= 0x01000000u) return ls_float(sign | ls_bits((float)(ls_i32)m)); /* exact below 2**24 */
    int shift = 0;
    while ((m >> shift) >= 0x01000000u) shift++; /* keep 24 significant bits */
    ls_u32 q = m >> shift, rem = m & ((1u << shift) - 1u), tie = 1u << (shift - 1);
    if (rem > tie || (rem == tie && (q & 1u))) q++;
    /* q in [2**23, 2**24]; value q * 2**shift, exact as a float */
    return ls_float(sign | ls_bits(ls_ldexp_exact((float)(ls_i32)q, shift)));
}

/* spec quant.quantize for one element: clip(round_half_even(x / s), -127, 127); NaN -> 0. */
LS_FN int ls_quantize(float x, float s) {
    float q = ls_div(x, s);
    if (ls_isnan(q)) return 0;
    if (ls_total_key(q) >= ls_total_key(127.0f)) return 127;
    if (ls_total_key(q) <= ls_total_key(-127.0f)) return -127;
    /* |q| < 127: adding and subtracting 1.5 * 2**23 rounds to an integer, ties to even */
    float r = ls_sub(ls_add(q, LS_ROUND_MAGIC), LS_ROUND_MAGIC);
    return (int)r;
}

/* ------------------------------------------------------------------ attention: 64-bit fixed point */

#define LS_DQ_BITS 62       /* spec attention.DQ_BITS: every fixed-point sum stays below 2**62 */
#define LS_DQ_MIN_GRID (-252) /* spec attention.DQ_MIN_GRID */

/* frexp's exponent of a canonical finite x: x = f * 2**e with f in [0.5, 1), so e = field - 126
 * for a normal x; 0 for a zero (as numpy.frexp). */
LS_FN int ls_frexp_exponent(float x) {
    int f = ls_exponent_field(x);
    return f ? f - 126 : 0;
}

/* spec attention.dq_grid_exponent: G = max(ea + eb - (62 - lbits), -252), with ea, eb the frexp
 * exponents of a_max and b_max (canonical, finite) and lbits = bit_length(n_terms). */
LS_FN int ls_dq_grid(float a_max, float b_max, int lbits) {
    int g = ls_frexp_exponent(a_max) + ls_frexp_exponent(b_max) - (LS_DQ_BITS - lbits);
    return g > LS_DQ_MIN_GRID ? g : LS_DQ_MIN_GRID;
}

/* One term of spec attention.fixed_point_contract: round_half_even(a * b * 2**-grid) as an int64,
 * from the exact 48-bit product of the significands (a * b = m * 2**(fa + fb - 300)), shifted by
 * integers: no float64 (Metal has none) and no rounding but the one. A zero operand gives 0, and
 * so does a non-finite one (the spec reads it as 0; its row is the canonical NaN anyway). With
 * grid = ls_dq_grid of the row, |a * b| < 2**(ea + eb) gives a term below 2**(62 - lbits). */
LS_FN ls_i64 ls_fixed_term(float a, float b, int grid) {
    if (!ls_is_normal(a) || !ls_is_normal(b)) return 0;
    ls_u64 m = (ls_u64)ls_significand(a) * (ls_u64)ls_significand(b); /* in [2**46, 2**48) */
    int n = ls_exponent_field(a) + ls_exponent_field(b) - 300 - grid; /* the term is m * 2**n */
    ls_u64 c = 0u;
    if (n >= 0) {
        c = m << n; /* n <= 15: the grid keeps c below 2**62 */
    } else if (n >= -62) { /* below that m * 2**n < 2**-14: rounds to 0 */
        int sh = -n;
        ls_u64 rest = m & ((((ls_u64)1u) << sh) - 1u), tie = ((ls_u64)1u) << (sh - 1);
        c = m >> sh;
        if (rest > tie || (rest == tie && (c & 1u))) c++;
    }
    return ((ls_bits(a) ^ ls_bits(b)) & LS_SIGN_BIT) ? -(ls_i64)c : (ls_i64)c;
}

/* spec attention.int64_to_float32: |x| < 2**63 rounded once to float32, to nearest even, by
 * integers (the top 24 significant bits kept; the bits shifted out decide), then q * 2**shift as
 * one exact product (q <= 2**24 converts exactly, 2**shift <= 2**39 is normal). */
LS_FN float ls_i64_to_f32(ls_i64 x) {
    ls_u32 sign = (x < 0) ? LS_SIGN_BIT : 0u;
    ls_u64 a = (x < 0) ? (ls_u64)0u - (ls_u64)x : (ls_u64)x;
    int shift = 0;
    while ((a >> shift) >= (ls_u64)0x01000000u) shift++;
    ls_u64 q = a >> shift;
    if (shift > 0) {
        ls_u64 rest = a & ((((ls_u64)1u) << shift) - 1u), tie = ((ls_u64)1u) << (shift - 1);
        if (rest > tie || (rest == tie && (q & 1u))) q++;
    }
    return ls_float(sign | ls_bits(ls_mul((float)(ls_i32)q, ls_pow2(shift))));
}

/* fixed_point_contract's output from a row's int64 sum s on grid G: (r * 2**G1) * 2**G2 with
 * r = int64_to_float32(s), G1 = clip(G, -126, 127), G2 = G - G1 (two spec products), stored ls_cn. */
LS_FN float ls_fixed_to_f32(ls_i64 s, int grid) {
    int g1 = ls_clip_int(grid, -126, 127);
    return ls_cn(ls_mul(ls_mul(ls_i64_to_f32(s), ls_pow2(g1)), ls_pow2(grid - g1)));
}
