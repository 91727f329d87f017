// Element types of kiln's formats in device code, without any toolkit
// header: NVRTC compiles kiln kernels with nothing but the embedded
// templates, which keeps compiles fast and the cache key self-contained.
//
// Conversions follow graph/elem.c bit for bit (the CPU reference):
// decoding is exact and done with integer operations on every
// architecture; encoding rounds to nearest even, and the narrow float
// types saturate to their largest finite value. Where the architecture
// has the conversion as one PTX instruction it is used, with an integer
// fallback elsewhere; the two agree on every non-NaN input.
#pragma once

namespace kiln {

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

// Multi-byte fields inside GGML blocks sit at any byte offset (blocks are
// 17, 18, 34 or 210 bytes), so they are assembled from bytes.
__device__ __forceinline__ u32 load_u16_bytes(const u8 *p)
{
    return (u32)p[0] | ((u32)p[1] << 8);
}

// ----------------------------------------------------------------- BF16

__device__ __forceinline__ float bf16_to_f32(u16 v)
{
    return __uint_as_float((u32)v << 16);
}

// Round to nearest even; NaN stays NaN (quiet).
__device__ __forceinline__ u16 f32_to_bf16(float f)
{
#if __CUDA_ARCH__ >= 800
    u16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
#else
    u32 u = __float_as_uint(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (u16)((u >> 16) | 0x40);
    return (u16)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
#endif
}

// ------------------------------------------------------------------ F16

// Exact, subnormals and NaN payloads included; cvt.f32.f16 exists on
// every architecture kiln targets.
__device__ __forceinline__ float f16_to_f32(u16 v)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
}

// ----------------------------------------------------------------- E4M3

// s.eeee.mmm, bias 7, no infinity, s.1111.111 is NaN. A normal code's
// exponent and mantissa move into f32's fields as one 7-bit group:
// f32 exponent = e + 120, so the group gains 120 << 3.
__device__ __forceinline__ float e4m3_to_f32(u32 v)
{
    u32 sign = (v & 0x80u) << 24;
    u32 em = v & 0x7Fu;
    if (em == 0x7Fu)
        return __uint_as_float(sign | 0x7FC00000u);
    if (em < 8u) // subnormal: m · 2^-9, exact in f32
        return __uint_as_float(sign | __float_as_uint((float)em * 0x1p-9f));
    return __uint_as_float(sign | ((em + (120u << 3)) << 20));
}

// The NVFP4 block scale. Decoded as E4M3 with its sign, as the CPU
// reference does, so a checkpoint with a stray sign bit gives the same
// numbers on both.
__device__ __forceinline__ float ue4m3_to_f32(u32 v)
{
    return e4m3_to_f32(v);
}

// Round to nearest even, satfinite (±inf → ±448); NaN → a NaN code.
__device__ __forceinline__ u8 f32_to_e4m3(float f)
{
#if __CUDA_ARCH__ >= 890
    u16 pair;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(f));
    return (u8)(pair & 0xFFu);
#else
    u32 u = __float_as_uint(f);
    u32 sign = (u >> 24) & 0x80u;
    u32 a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u)
        return (u8)(sign | 0x7Fu);
    float af = __uint_as_float(a);
    if (af < 0x1p-6f) // below the smallest normal: count units of 2^-9
        return (u8)(sign | (u32)__float2int_rn(af * 0x1p9f));
    // Round the mantissa to 3 bits in place; a carry moves into the
    // exponent as it should. a + bias stays below 2^32 for a <= inf.
    u32 r = (a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
    u32 code = r - (120u << 3);
    return (u8)(sign | (code > 0x7Eu ? 0x7Eu : code));
#endif
}

// ----------------------------------------------------------------- E2M1

// s.ee.m, bias 1: 0, 0.5, 1, 1.5, 2, 3, 4, 6. Codes 2..7 are normal: their
// exponent field plus 126 is f32's, their mantissa bit f32's top bit.
__device__ __forceinline__ float e2m1_to_f32(u32 v)
{
    u32 c = v & 7u;
    u32 mag = c < 2u ? __float_as_uint((float)c * 0.5f)
                     : (((c >> 1) + 126u) << 23) | ((c & 1u) << 22);
    return __uint_as_float(((v & 8u) << 28) | mag);
}

// ----------------------------------------------------------------- E8M0

// 2^(e - 127); 0xFF is NaN; e = 0 is the f32 subnormal 2^-127.
__device__ __forceinline__ float e8m0_to_f32(u32 e)
{
    if (e == 0xFFu)
        return __uint_as_float(0x7FC00000u);
    return __uint_as_float(e == 0u ? 0x00400000u : e << 23);
}

// ggml's half scale 2^(e - 128) of GGML MXFP4: exact for every e (f32
// subnormals for e = 0, 1), and e = 0xFF is 2^127, not NaN.
__device__ __forceinline__ float e8m0_half_to_f32(u32 e)
{
    return __uint_as_float(e < 2u ? 0x00200000u << e : (e - 1u) << 23);
}

// OCP MX scale code of a block maximum: 2^(floor(log2(amax)) - emax_elem),
// clamped to [0, 254]; 0 for a zero or NaN maximum. floor(log2) of a
// normal f32 is its exponent field; a subnormal amax is far below where
// the clamp takes every code to 0 for kiln's element types.
__device__ __forceinline__ u8 mx_scale_code(float amax, int emax_elem)
{
    if (!(amax > 0.0f))
        return 0;
    int e = (int)((__float_as_uint(amax) >> 23) & 0xFFu); // inf: 255
    if (e == 0)
        return 0;
    int code = e == 255 ? 254 : e - emax_elem;
    return (u8)(code < 0 ? 0 : code > 254 ? 254 : code);
}

// On sm_90+ a kernel the runtime launches with programmatic stream
// serialization (kiln_launch.overlap) may start while the kernel before it
// drains: it copies what no kernel writes (weights) first, then waits for
// the one before to finish and its writes to be visible before it touches
// activations or outputs. The kernel before lets it start once every one
// of its blocks has called grid_launch_dependents (or exited). A kernel
// launched without the attribute, or before sm_90, passes both at once.

// Let the next kernel's blocks start as this kernel's retire.
__device__ __forceinline__ void grid_launch_dependents()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Wait until the kernel before has finished and its writes are visible.
__device__ __forceinline__ void grid_wait_dependency()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

} // namespace kiln
