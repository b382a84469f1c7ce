/* prelude_metal.h -- Metal Shading Language dialect of the lockstep kernels (lockstep/backends/metal).
 * Compile with fast math off (MTLCompileOptions.mathMode = safe, or fastMathEnabled = NO;
 * mathFloatingPointFunctions = precise). The pragma below is needed as well: Metal is reported
 * to contract a*b+c into an FMA even in safe mode (docs/gpu-kernels.md, "Toolchain traps").
 *
 * Apple GPUs flush float32 subnormals in hardware (inputs and results) and reportedly decide
 * "too small" before rounding, while the spec rounds first: a product or quotient whose exact
 * value lies in [2**-126 - 2**-150, 2**-126) is 2**-126 in the spec and 0 on the hardware.
 * ls_mul_raw and ls_div_raw therefore pass the hardware's result through ls_fp.h's
 * ls_mul_tiny_fixup / ls_div_tiny_fixup, which recompute a zero from nonzero finite operands
 * exactly with integers (right under either tininess rule). The host build runs the same two
 * lines over models of both rules (prelude_host.h, LS_MODEL_FTZ_BEFORE / LS_MODEL_FTZ_AFTER
 * with LS_FLUSH_FIXUP), which is how CI tests this path without a Mac.
 *
 * Sums and differences need nothing: with normal operands an exact result below 2**-126 is
 * representable, so flushing it before or after rounding is the same. sqrt of a normal number
 * is normal. Integer -> float conversions in ls_fp.h are of exactly representable values only. */
#include <metal_stdlib>
using namespace metal;
#pragma STDC FP_CONTRACT OFF
#define LS_DIALECT_METAL 1

typedef uint ls_u32;
typedef int ls_i32;
typedef ulong ls_u64;
typedef long ls_i64;
typedef char ls_i8;

#define LS_FN static inline
#define LS_GLOBAL device
#define LS_LOCAL threadgroup
#define LS_UNROLL _Pragma("unroll") /* fixed-count loops over a register block */
#define LS_PRIVATE thread
#define LS_BARRIER() threadgroup_barrier(mem_flags::mem_threadgroup)

/* Buffers and scalars both take a [[buffer(i)]] slot; i is the argument's position. The ids
 * arrive as attributed parameters, appended by LS_IDS. */
#define LS_KERNEL(name) kernel void name
#define LS_BUF(T, name, i) device T *name [[buffer(i)]]
#define LS_CBUF(T, name, i) const device T *name [[buffer(i)]]
#define LS_SCALAR(T, name, i) constant T &name [[buffer(i)]]
#define LS_IDS , uint3 ls_tid_ [[thread_position_in_threadgroup]], uint3 ls_gid_ [[threadgroup_position_in_grid]], \
    uint3 ls_tpg_ [[threads_per_threadgroup]], uint3 ls_ngr_ [[threadgroups_per_grid]]
#define LS_LOCAL_ARRAY(T, name, n) threadgroup T name[n]

#define LS_LOCAL_ID(d) ((int)ls_tid_[d])
#define LS_GROUP_ID(d) ((int)ls_gid_[d])
#define LS_LOCAL_SIZE(d) ((int)ls_tpg_[d])
#define LS_NUM_GROUPS(d) ((int)ls_ngr_[d])
#define LS_GLOBAL_ID(d) (LS_GROUP_ID(d) * LS_LOCAL_SIZE(d) + LS_LOCAL_ID(d))
#define LS_GLOBAL_SIZE(d) (LS_NUM_GROUPS(d) * LS_LOCAL_SIZE(d))

LS_FN ls_u32 ls_bits(float x) { return as_type<uint>(x); }
LS_FN float ls_float(ls_u32 u) { return as_type<float>(u); }
LS_FN ls_u32 ls_mulhi(ls_u32 a, ls_u32 b) { return mulhi(a, b); }

LS_FN float ls_add_raw(float a, float b) { return a + b; } /* exact below 2**-126 on normal inputs: FTZ-safe */
LS_FN float ls_sub_raw(float a, float b) { return a - b; }
LS_FN float ls_sqrt_raw(float a) { return sqrt(a); }
/* The hardware's own product and quotient (what the flush probe measures), then the fix-up. */
LS_FN float ls_mul_hw(float a, float b) { return a * b; }
LS_FN float ls_div_hw(float a, float b) { return a / b; }
LS_FN float ls_mul_tiny_fixup(float a, float b, float r); /* ls_fp.h */
LS_FN float ls_div_tiny_fixup(float a, float b, float r);
LS_FN float ls_mul_raw(float a, float b) { return ls_mul_tiny_fixup(a, b, ls_mul_hw(a, b)); }
LS_FN float ls_div_raw(float a, float b) { return ls_div_tiny_fixup(a, b, ls_div_hw(a, b)); }
