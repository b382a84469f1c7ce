/* prelude_opencl.h -- OpenCL C 1.2 dialect of the lockstep kernels (PyOpenCL; PoCL in CI).
 * Build options (lockstep/backends/opencl): -cl-fp32-correctly-rounded-divide-sqrt, and never
 * -cl-fast-relaxed-math, -cl-mad-enable or -cl-denorms-are-zero. */
#pragma OPENCL FP_CONTRACT OFF
#define LS_DIALECT_OPENCL 1

typedef uint ls_u32;
typedef int ls_i32;
typedef ulong ls_u64;
typedef long ls_i64;
typedef char ls_i8;

#define LS_FN static inline
#define LS_GLOBAL __global
#define LS_LOCAL __local
#define LS_UNROLL _Pragma("unroll") /* fixed-count loops over a register block */
#define LS_PRIVATE
#define LS_BARRIER() barrier(CLK_LOCAL_MEM_FENCE)

/* Kernel signatures: LS_KERNEL(name)(LS_BUF(float, out, 0), LS_CBUF(float, a, 1),
 * LS_SCALAR(int, n, 2) LS_IDS). The index is the argument's position (Metal's [[buffer(i)]]). */
#define LS_KERNEL(name) __kernel void name
#define LS_BUF(T, name, i) __global T *name
#define LS_CBUF(T, name, i) __global const T *name
#define LS_SCALAR(T, name, i) const T name
#define LS_IDS
#define LS_LOCAL_ARRAY(T, name, n) __local T name[n]

#define LS_LOCAL_ID(d) ((int)get_local_id(d))
#define LS_GROUP_ID(d) ((int)get_group_id(d))
#define LS_LOCAL_SIZE(d) ((int)get_local_size(d))
#define LS_NUM_GROUPS(d) ((int)get_num_groups(d))
#define LS_GLOBAL_ID(d) ((int)get_global_id(d))
#define LS_GLOBAL_SIZE(d) ((int)get_global_size(d))

LS_FN ls_u32 ls_bits(float x) { return as_uint(x); }
LS_FN float ls_float(ls_u32 u) { return as_float(u); }
LS_FN ls_u32 ls_mulhi(ls_u32 a, ls_u32 b) { return mul_hi(a, b); }

/* One IEEE operation each: FP_CONTRACT OFF keeps a*b+c two roundings; the build option makes
 * / and sqrt correctly rounded; OpenCL C full-profile float keeps subnormal results. */
LS_FN float ls_add_raw(float a, float b) { return a + b; }
LS_FN float ls_sub_raw(float a, float b) { return a - b; }
LS_FN float ls_mul_raw(float a, float b) { return a * b; }
LS_FN float ls_div_raw(float a, float b) { return a / b; }
LS_FN float ls_sqrt_raw(float a) { return sqrt(a); }
/* The hardware's own product and quotient: the same operations (this hardware keeps subnormals). */
LS_FN float ls_mul_hw(float a, float b) { return ls_mul_raw(a, b); }
LS_FN float ls_div_hw(float a, float b) { return ls_div_raw(a, b); }
