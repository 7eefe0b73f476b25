// The cuda target's `gemv` schedule: products with M or N up to 4 (a token
// or a few through a Linear layer, a matrix times a vector), which read one
// big operand once and are bound by memory, not by tensor cores. A tiled
// CUTLASS kernel gives them a few CTAs of mostly empty 64-row tiles; here a
// block computes kRowsPerBlock rows of the big operand against every row of
// the small one, its kWarps warps splitting K between them (16-byte loads,
// the small operand's rows read through L1/L2) and summing their partials in
// shared memory, so that even a few thousand rows give every SM many warps
// of loads in flight. Kernels are instantiated for 1, 2 and 4 small rows
// (their accumulators in registers: a matrix times a vector keeps few).
// Past 4, CUTLASS's 64x128 ping-pong kernel streams as fast (on the H100,
// 8 x 4096 x 4096: 26 us against 40 for a 16-row instance of this one).
// Both operands are read along K (layout rcr); C is written by the fused
// epilogue D = act(alpha * acc + beta * C + bias), as the CUTLASS kernels'
// (cutlass_common.hpp `Epilogue`), accumulating in fp32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace dcuda {
namespace gemv {

constexpr int kMaxSmall = 4;      // rows of the small operand (M or N) a call may have
constexpr int kRowsPerBlock = 4;  // rows of the big operand a block computes
constexpr int kWarps = 8;         // warps per block, each a share of K

// Where a call's operands and result are, as small x big: C's element for
// small row i and big row j is c[i * c_small + j * c_big] (the bias's likewise).
struct Params {
    const void* small;
    const void* big;
    void* c;
    const void* bias;
    int64_t ld_small, ld_big, c_small, c_big, bias_small, bias_big;
    int small_rows, big_rows, k;
    float alpha, beta;
};

// 8 consecutive elements at p (16 bytes, aligned) as floats.
template <class E>
__device__ inline void load8(const E* p, float out[8]) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        float2 pair;
        if constexpr (std::is_same_v<E, cutlass::bfloat16_t>) {
            pair = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[w]));
        } else {
            pair = __half22float2(*reinterpret_cast<const __half2*>(&words[w]));
        }
        out[2 * w] = pair.x;
        out[2 * w + 1] = pair.y;
    }
}

// One block: rows [first, first + kRowsPerBlock) of the big operand against
// the small operand's rows (at most S). Each warp sums its share of K (Vec:
// 16-byte loads, rows aligned and K a multiple of 8; else one element a
// lane), reduces over its lanes, and leaves its partials in shared memory;
// a thread per output element adds the warps' partials and applies the epilogue.
template <class EIn, class EOut, Bias B, Activation A, bool Vec, int S>
__global__ void __launch_bounds__(kWarps * 32) kernel(Params p) {
    __shared__ float partial[kWarps][kRowsPerBlock][S];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int first = blockIdx.x * kRowsPerBlock;
    const int rows = min(kRowsPerBlock, p.big_rows - first);
    const EIn* small = static_cast<const EIn*>(p.small);
    const EIn* big = static_cast<const EIn*>(p.big) + first * p.ld_big;
    float acc[kRowsPerBlock][S] = {};
    if constexpr (Vec) {
        for (int64_t k0 = (warp * 32 + lane) * 8; k0 < p.k; k0 += kWarps * 32 * 8) {
            float b[kRowsPerBlock][8];
#pragma unroll
            for (int r = 0; r < kRowsPerBlock; ++r) {
                if (r < rows) {
                    load8(big + r * p.ld_big + k0, b[r]);
                } else {
#pragma unroll
                    for (int e = 0; e < 8; ++e) b[r][e] = 0.0f;
                }
            }
#pragma unroll
            for (int i = 0; i < S; ++i) {
                if (i >= p.small_rows) break;
                float a[8];
                load8(small + i * p.ld_small + k0, a);
#pragma unroll
                for (int r = 0; r < kRowsPerBlock; ++r)
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[r][i] = fmaf(a[e], b[r][e], acc[r][i]);
            }
        }
    } else {
        for (int64_t k0 = warp * 32 + lane; k0 < p.k; k0 += kWarps * 32) {
            float b[kRowsPerBlock];
#pragma unroll
            for (int r = 0; r < kRowsPerBlock; ++r) b[r] = r < rows ? float(big[r * p.ld_big + k0]) : 0.0f;
#pragma unroll
            for (int i = 0; i < S; ++i) {
                if (i >= p.small_rows) break;
                const float a = float(small[i * p.ld_small + k0]);
#pragma unroll
                for (int r = 0; r < kRowsPerBlock; ++r) acc[r][i] = fmaf(a, b[r], acc[r][i]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < kRowsPerBlock; ++r) {
#pragma unroll
        for (int i = 0; i < S; ++i) {
            float v = acc[r][i];
#pragma unroll
            for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
            if (lane == 0) partial[warp][r][i] = v;
        }
    }
    __syncthreads();
    const int r = threadIdx.x / S, i = threadIdx.x % S;
    if (r >= rows || r >= kRowsPerBlock || i >= p.small_rows) return;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += partial[w][r][i];
    const int64_t j = first + r;
    EOut* out = static_cast<EOut*>(p.c) + i * p.c_small + j * p.c_big;
    float d = p.alpha * v;
    if (p.beta != 0.0f) d += p.beta * float(*out);
    if constexpr (B != Bias::none) d += float(static_cast<const EOut*>(p.bias)[i * p.bias_small + j * p.bias_big]);
    *out = EOut(activate<A>(d));
}

// One launch of the kernel for `small_rows` small rows: its smallest instance that holds them.
template <class EIn, class EOut, Bias B, Activation A, bool Vec>
void launch(const Params& p, dim3 grid, cudaStream_t stream) {
    if (p.small_rows <= 1)
        kernel<EIn, EOut, B, A, Vec, 1><<<grid, kWarps * 32, 0, stream>>>(p);
    else if (p.small_rows <= 2)
        kernel<EIn, EOut, B, A, Vec, 2><<<grid, kWarps * 32, 0, stream>>>(p);
    else
        kernel<EIn, EOut, B, A, Vec, kMaxSmall><<<grid, kWarps * 32, 0, stream>>>(p);
}

// The call: which operand is small, the 16-byte path where every row
// allows it, one launch on the call's stream; -2 for a problem it does
// not take (both M and N above kMaxSmall, a batch).
template <class T, Bias B, Activation A>
int run(const dispatcher_gemm_args* a) {
    static_assert(T::kARow && !T::kBRow && T::kCRow, "the gemv schedule reads A and B along K (layout rcr)");
    using EIn = typename T::ElementA;
    using EOut = typename T::ElementC;
    check_args<T>(a);
    if (a->batch > 1) throw Failure(DISPATCHER_UNSUPPORTED, "the gemv schedule runs one GEMM per launch");
    const bool small_a = a->m <= kMaxSmall;
    if (!small_a && a->n > kMaxSmall)
        throw Failure(DISPATCHER_UNSUPPORTED, "the gemv schedule takes M or N up to 4");
    Params p{};
    const dispatcher_operand bias = fused_bias<B>(a);
    p.c = a->c;
    p.bias = bias.data;
    p.k = int(a->k);
    p.alpha = scaled_alpha(a);
    p.beta = float(a->beta);
    if (small_a) {  // C[m][n]: small row m of A, big row n of B (column-major: B's column n)
        p.small = a->a, p.ld_small = a->lda, p.big = a->b, p.ld_big = a->ldb;
        p.small_rows = int(a->m), p.big_rows = int(a->n);
        p.c_small = a->ldc, p.c_big = 1, p.bias_small = bias.row_stride, p.bias_big = bias.col_stride;
    } else {  // C[m][n]: small row n of B^T, big row m of A
        p.small = a->b, p.ld_small = a->ldb, p.big = a->a, p.ld_big = a->lda;
        p.small_rows = int(a->n), p.big_rows = int(a->m);
        p.c_small = 1, p.c_big = a->ldc, p.bias_small = bias.col_stride, p.bias_big = bias.row_stride;
    }
    const auto aligned = [](const void* x, int64_t ld) {
        return reinterpret_cast<uintptr_t>(x) % 16 == 0 && (ld * int64_t(sizeof(EIn))) % 16 == 0;
    };
    const bool vec = a->k % 8 == 0 && aligned(p.small, p.ld_small) && aligned(p.big, p.ld_big);
    const dim3 grid(unsigned((int64_t(p.big_rows) + kRowsPerBlock - 1) / kRowsPerBlock));
    const auto stream = static_cast<cudaStream_t>(a->stream);
    if (vec)
        launch<EIn, EOut, B, A, true>(p, grid, stream);
    else
        launch<EIn, EOut, B, A, false>(p, grid, stream);
    check_cuda(cudaGetLastError(), "gemv kernel launch");
    return DISPATCHER_OK;
}

}  // namespace gemv
}  // namespace dcuda
