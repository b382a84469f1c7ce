/* prelude_cuda.h -- CUDA C++ dialect of the lockstep kernels (NVRTC; lockstep/backends/cupy_cuda).
 * Compile with --fmad=false -ftz=false -prec-div=true -prec-sqrt=true (never through CuPy's
 * RawModule(code=...), which appends -ftz=true: not used anywhere). The five operations are inline PTX with an
 * explicit .rn and no .ftz, so no compiler flag can contract or flush them (docs/gpu-kernels.md, "Toolchain traps"). */
#define LS_DIALECT_CUDA 1

typedef unsigned int ls_u32;
typedef int ls_i32;
typedef unsigned long long ls_u64;
typedef long long ls_i64;
typedef signed char ls_i8;

#define LS_FN static __device__ __forceinline__
#define LS_GLOBAL
#define LS_LOCAL
#define LS_UNROLL _Pragma("unroll") /* fixed-count loops over a register block */
#define LS_PRIVATE
#define LS_BARRIER() __syncthreads()

#define LS_KERNEL(name) extern "C" __global__ void name
#define LS_BUF(T, name, i) T *name
#define LS_CBUF(T, name, i) const T *name
#define LS_SCALAR(T, name, i) const T name
#define LS_IDS
#define LS_LOCAL_ARRAY(T, name, n) __shared__ T name[n]

LS_FN int ls_dim3_at(dim3 v, int d) { return (int)(d == 0 ? v.x : (d == 1 ? v.y : v.z)); }
LS_FN int ls_uint3_at(uint3 v, int d) { return (int)(d == 0 ? v.x : (d == 1 ? v.y : v.z)); }
#define LS_LOCAL_ID(d) ls_uint3_at(threadIdx, d)
#define LS_GROUP_ID(d) ls_uint3_at(blockIdx, d)
#define LS_LOCAL_SIZE(d) ls_dim3_at(blockDim, d)
#define LS_NUM_GROUPS(d) ls_dim3_at(gridDim, d)
#define LS_GLOBAL_ID(d) (LS_GROUP_ID(d) * LS_LOCAL_SIZE(d) + LS_LOCAL_ID(d))
#define LS_GLOBAL_SIZE(d) (LS_NUM_GROUPS(d) * LS_LOCAL_SIZE(d))

LS_FN ls_u32 ls_bits(float x) { return __float_as_uint(x); }
LS_FN float ls_float(ls_u32 u) { return __uint_as_float(u); }
LS_FN ls_u32 ls_mulhi(ls_u32 a, ls_u32 b) { return __umulhi(a, b); }

LS_FN float ls_add_raw(float a, float b) { float r; asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
LS_FN float ls_sub_raw(float a, float b) { float r; asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
LS_FN float ls_mul_raw(float a, float b) { float r; asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
LS_FN float ls_div_raw(float a, float b) { float r; asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
LS_FN float ls_sqrt_raw(float a) { float r; asm("sqrt.rn.f32 %0, %1;" : "=f"(r) : "f"(a)); return r; }
/* The hardware's own product and quotient: the same operations (mul.rn / div.rn keep subnormals). */
LS_FN float ls_mul_hw(float a, float b) { return ls_mul_raw(a, b); }
LS_FN float ls_div_hw(float a, float b) { return ls_div_raw(a, b); }
