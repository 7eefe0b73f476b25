// Split-K with a reduction kernel of its own (the `tree` reduction): K is
// cut into at most MaxSlices slices of whole K tiles; a CUTLASS SM90
// GemmUniversal (persistent data-parallel scheduler, batch mode L = slice,
// any kernel schedule) writes each slice's fp32 partial product into the
// workspace, and a reduction kernel combines each element's partials
// pairwise in log2 steps (p_i += p_{i+s} for i a multiple of 2s, s = 1, 2,
// 4, ...): a fixed pairing, so bit-identical across runs. It then applies
// the epilogue once, in fp32: D = act(alpha * sum + beta * C + bias),
// converted to the output type.
//
// Why not CUTLASS's stream-K scheduler in split-K mode: its fix-up adds the
// slices' partials into one workspace tile in turn (Deterministic) or under
// a lock, so a few-tile problem waits on K slices one after the other, and
// it runs the cooperative schedule only. On the H100, 8 x 2048 x 8192 bf16:
// 32 us with CUTLASS's split-K (4 slices, 128x128), 23 us this way on 64x64
// ping-pong tiles (cuBLAS 21.5 us; benchmarks/results/splitk_probe_h100_*.json).
//
// K slices of one depth are one launch; a shorter last slice is a second
// launch of the same kernel. Used by the regular variant's split-K
// (reduction=tree) and the stream_k variant's tree reduction.
#pragma once

#include "cutlass/numeric_conversion.h"
#include "cutlass_common.hpp"

namespace dcuda {
namespace tree {

// D = act(alpha * tree_sum(partials) + beta * C + bias), one element a thread.
template <class ElementC, int MaxSlices, Bias B, Activation A>
__global__ void reduce(const float* __restrict__ partials, int64_t slice_elems, int64_t ldw, int count,
                       int64_t m, int64_t n, ElementC* c, int64_t ldc, float alpha, float beta,
                       const ElementC* __restrict__ bias, int64_t bias_row, int64_t bias_col) {
    for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < m * n;
         e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t i = e / n, j = e % n;
        float p[MaxSlices];
#pragma unroll
        for (int l = 0; l < MaxSlices; ++l) p[l] = l < count ? partials[l * slice_elems + i * ldw + j] : 0.0f;
#pragma unroll
        for (int s = 1; s < MaxSlices; s *= 2)
#pragma unroll
            for (int l = 0; l + s < MaxSlices; l += 2 * s)
                if (l + s < count) p[l] += p[l + s];
        float out = alpha * p[0];
        if (beta != 0.0f) out += beta * float(c[i * ldc + j]);
        if constexpr (B != Bias::none) out += float(bias[i * bias_row + j * bias_col]);
        c[i * ldc + j] = cutlass::NumericConverter<ElementC, float>{}(activate<A>(out));
    }
}

template <class T, int MaxSlices, class Epi>
struct SplitK {
    static constexpr int64_t kTileK = cute::size<2>(typename T::TileShape{});

    struct PartialTraits : T {
        using ElementC = float;  // the partials
    };
    using PartialGemm = UniversalGemm<PartialTraits>;
    using PartialKernel = typename PartialGemm::GemmKernel;

    // K cut into `count` slices: `full` of `depth` (whole K tiles), then one of
    // k - full * depth if that is not 0.
    struct Slices {
        int64_t depth, full, count;
    };

    static Slices slices_of(int64_t k) {
        const int64_t k_tiles = (k + kTileK - 1) / kTileK;
        const int64_t wanted = std::min<int64_t>(MaxSlices, k_tiles);
        const int64_t depth = (k_tiles + wanted - 1) / wanted * kTileK;
        return {depth, k / depth, (k + depth - 1) / depth};
    }

    // The workspace: the CUTLASS kernel's own, then the partials, one fp32
    // M x ldw matrix per slice (rows padded to 16 bytes for TMA).
    struct Layout {
        int64_t ldw, slice_elems, cutlass_bytes, partials_offset, bytes;
    };

    // The arguments of the launch that writes partials [first, first + count)
    // for the slices of depth `depth` starting at K offset k0 (partials null:
    // for the workspace size only).
    static typename PartialGemm::Arguments partial_arguments(const dispatcher_gemm_args* a, const Layout& w,
                                                             float* partials, int64_t k0, int64_t depth,
                                                             int64_t first, int64_t count) {
        auto args = gemm_arguments<PartialGemm, PartialTraits>(a);
        args.problem_shape = {int(a->m), int(a->n), int(depth), int(count)};
        const auto* A = static_cast<const typename T::ElementA*>(a->a);
        const auto* B = static_cast<const typename T::ElementB*>(a->b);
        // One K step of A: an element along a row (row-major) or a column; of B likewise.
        const int64_t a_step = T::kARow ? 1 : a->lda, b_step = T::kBRow ? a->ldb : 1;
        args.mainloop.ptr_A = A + k0 * a_step;
        args.mainloop.ptr_B = B + k0 * b_step;
        cute::get<2>(args.mainloop.dA) = depth * a_step;
        cute::get<2>(args.mainloop.dB) = depth * b_step;
        float* d = partials ? partials + first * w.slice_elems : nullptr;
        args.epilogue.thread.alpha = 1.0f;
        args.epilogue.thread.beta = 0.0f;
        args.epilogue.ptr_C = d;
        args.epilogue.ptr_D = d;
        args.epilogue.dC = args.epilogue.dD = stride_with_ld<typename PartialKernel::StrideD>(w.ldw);
        cute::get<2>(args.epilogue.dC) = cute::get<2>(args.epilogue.dD) = w.slice_elems;
        return args;
    }

    // The launches of a call: the full slices, then the short one (count 0: none).
    struct Launches {
        typename PartialGemm::Arguments full, rest;
        int64_t full_count, rest_count;
    };

    static Launches launches_of(const dispatcher_gemm_args* a, const Layout& w, float* partials) {
        const Slices s = slices_of(a->k);
        return {partial_arguments(a, w, partials, 0, s.depth, 0, s.full),
                partial_arguments(a, w, partials, s.full * s.depth, a->k - s.full * s.depth, s.full, 1),
                s.full, s.count - s.full};
    }

    static Layout layout_of(const dispatcher_gemm_args* a) {
        Layout w;
        w.ldw = (a->n + 3) / 4 * 4;
        w.slice_elems = a->m * w.ldw;
        const Launches l = launches_of(a, w, nullptr);
        w.cutlass_bytes = std::max<int64_t>(l.full_count ? PartialGemm::get_workspace_size(l.full) : 0,
                                            l.rest_count ? PartialGemm::get_workspace_size(l.rest) : 0);
        w.partials_offset = (w.cutlass_bytes + 255) / 256 * 256;
        w.bytes = w.partials_offset + slices_of(a->k).count * w.slice_elems * int64_t(sizeof(float));
        return w;
    }

    // The split-K launches and the reduction, on operands TMA can read.
    static int run_aligned(const dispatcher_gemm_args* a) {
        if (a->batch > 1) throw Failure(DISPATCHER_UNSUPPORTED, "split-K (tree) runs one GEMM per launch");
        const Layout w = layout_of(a);
        if (a->workspace_bytes < w.bytes || !a->workspace)
            throw Failure(DISPATCHER_ERROR, "workspace smaller than dispatcher_workspace_size()");
        using ElementC = typename T::ElementC;
        const dispatcher_operand bias = fused_bias<Epi::bias>(a);
        auto* base = static_cast<char*>(a->workspace);
        auto* partials = reinterpret_cast<float*>(base + w.partials_offset);
        Launches l = launches_of(a, w, partials);
        const auto stream = static_cast<cudaStream_t>(a->stream);
        if (l.full_count) run_gemm<PartialGemm>(l.full, base, w.cutlass_bytes, stream);
        if (l.rest_count) run_gemm<PartialGemm>(l.rest, base, w.cutlass_bytes, stream);
        constexpr int kThreads = 256;
        const int64_t blocks = std::min<int64_t>((a->m * a->n + kThreads - 1) / kThreads,
                                                 int64_t(multiprocessor_count(current_device())) * 8);
        reduce<ElementC, MaxSlices, Epi::bias, Epi::activation><<<int(blocks), kThreads, 0, stream>>>(
            partials, w.slice_elems, w.ldw, int(l.full_count + l.rest_count), a->m, a->n,
            static_cast<ElementC*>(a->c), a->ldc, scaled_alpha(a), float(a->beta),
            static_cast<const ElementC*>(bias.data), bias.row_stride, bias.col_stride);
        check_cuda(cudaGetLastError(), "split-K reduction launch");
        return DISPATCHER_OK;
    }

    // A call: on the operands, or on staged copies of those that break TMA's 16-byte rule.
    static int run(const dispatcher_gemm_args* a) { return staged_call<T, Epi>(a, run_aligned); }

    static int64_t workspace_bytes(const dispatcher_gemm_args* a) {
        return staged_workspace_bytes<T, Epi>(a, [](const dispatcher_gemm_args* s) { return layout_of(s).bytes; });
    }
};

}  // namespace tree
}  // namespace dcuda
