// Shared pieces of generated CUDA sources: CUTLASS 3.x SM90 collectives
// assembled from a KernelTraits type (written by dispatcher/targets/cuda.py),
// stride helpers and error handling. Which kernel schedule and tile
// scheduler a kernel uses is variant knowledge and lives in the templates.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "dispatcher_abi.h"
#include "staging.hpp"

namespace dcuda {

using namespace cute;

// ------------------------------------------------------------- epilogue ----
// The fused epilogue a template names with `Epilogue<Bias::.., Activation::..>`
// (the config's `bias` and `activation`): CUTLASS's epilogue fusion operation
// D = act(alpha * acc + beta * C + bias), the bias per row or per column of D
// in the output element type; the plain one is LinearCombination.
enum class Bias { none, row, col };
enum class Activation { none, relu, gelu, silu };

template <Activation A> struct ActivationFn;
template <> struct ActivationFn<Activation::none> { template <class E> using fn = cutlass::epilogue::thread::Identity<E>; };
template <> struct ActivationFn<Activation::relu> { template <class E> using fn = cutlass::epilogue::thread::ReLu<E>; };
template <> struct ActivationFn<Activation::gelu> { template <class E> using fn = cutlass::epilogue::thread::GELU<E>; };
template <> struct ActivationFn<Activation::silu> { template <class E> using fn = cutlass::epilogue::thread::SiLu<E>; };

template <class ElementC, Bias B, Activation A>
struct FusionOf {
    using type = cutlass::epilogue::fusion::LinCombEltAct<ActivationFn<A>::template fn, ElementC, float>;
};
template <class ElementC>
struct FusionOf<ElementC, Bias::none, Activation::none> {
    using type = cutlass::epilogue::fusion::LinearCombination<ElementC, float>;
};
template <class ElementC, Activation A>
struct FusionOf<ElementC, Bias::row, A> {
    using type = cutlass::epilogue::fusion::LinCombPerRowBiasEltAct<ActivationFn<A>::template fn, ElementC, float>;
};
template <class ElementC, Activation A>
struct FusionOf<ElementC, Bias::col, A> {
    using type = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<ActivationFn<A>::template fn, ElementC, float>;
};

template <Bias B, Activation A>
struct Epilogue {
    static constexpr Bias bias = B;
    static constexpr Activation activation = A;
    template <class ElementC>
    using Fusion = typename FusionOf<ElementC, B, A>::type;
};
using PlainEpilogue = Epilogue<Bias::none, Activation::none>;

// The activation on one fp32 value, for the target's kernels that apply the
// epilogue themselves (gemv.hpp, split_k_tree.hpp): as CUTLASS's functors.
template <Activation A>
__device__ inline float activate(float v) {
    if constexpr (A == Activation::relu) return fmaxf(v, 0.0f);
    if constexpr (A == Activation::gelu) return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    if constexpr (A == Activation::silu) return v / (1.0f + __expf(-v));
    return v;
}

// The mainloop and epilogue collectives of one kernel. LayoutA/B/C are the
// traits' layouts, or pointers to them for pointer-array (grouped) kernels.
template <class T, class MainloopSchedule, class EpilogueSchedule, class LayoutA, class LayoutB,
          class LayoutC, class Epi = PlainEpilogue>
struct Collectives {
    static constexpr int kAlignA = 128 / cutlass::sizeof_bits<typename T::ElementA>::value;
    static constexpr int kAlignB = 128 / cutlass::sizeof_bits<typename T::ElementB>::value;
    static constexpr int kAlignC = 128 / cutlass::sizeof_bits<typename T::ElementC>::value;

    using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename T::TileShape,
        typename T::ClusterShape, cutlass::epilogue::collective::EpilogueTileAuto, float, float,
        typename T::ElementC, LayoutC, kAlignC, typename T::ElementC, LayoutC, kAlignC,
        EpilogueSchedule, typename Epi::template Fusion<typename T::ElementC>>::CollectiveOp;

    using Stages = std::conditional_t<
        (T::kStages > 0), cutlass::gemm::collective::StageCount<(T::kStages > 0 ? T::kStages : 2)>,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
            sizeof(typename Epilogue::SharedStorage))>>;

    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename T::ElementA, LayoutA, kAlignA,
        typename T::ElementB, LayoutB, kAlignB, float, typename T::TileShape,
        typename T::ClusterShape, Stages, MainloopSchedule>::CollectiveOp;
};

// A GemmUniversal over problem shape (M, N, K, L) with the traits' schedules
// and fused epilogue `Epi`, and tile scheduler `Scheduler` (void: the
// persistent data-parallel one).
template <class T, class Epi = PlainEpilogue, class Scheduler = void>
using UniversalGemm = cutlass::gemm::device::GemmUniversalAdapter<cutlass::gemm::kernel::GemmUniversal<
    cute::Shape<int, int, int, int>,
    typename Collectives<T, typename T::MainloopSchedule, typename T::EpilogueSchedule, typename T::LayoutA,
                         typename T::LayoutB, typename T::LayoutC, Epi>::Mainloop,
    typename Collectives<T, typename T::MainloopSchedule, typename T::EpilogueSchedule, typename T::LayoutA,
                         typename T::LayoutB, typename T::LayoutC, Epi>::Epilogue,
    Scheduler>>;

// The tile scheduler of a kernel and what it sets in a call's arguments.
// `Splits` > 1: CUTLASS's stream-K scheduler in split-K mode, each output
// tile summed over `Splits` slices of K; split-K fills the GPU when a problem
// has few output tiles and a long K (e.g. M x 1 x 4096: 16 tiles for 132
// SMs). `Hybrid`: the same scheduler in its heuristic mode, full waves of
// tiles data-parallel and the last partial wave shared out stream-K, so a
// mid-size problem whose tiles leave most SMs idle in the last wave keeps
// them busy (5120^3 on 128x256 tiles: 800 tiles, 6.06 waves of 132 SMs).
// Either way the partial tiles are reduced in a fixed order, so results do
// not vary from run to run. Neither: the persistent data-parallel scheduler.
template <int Splits, bool Hybrid = false>
struct Decomposition {
    static_assert(!(Hybrid && Splits > 1), "split-K and the hybrid decomposition exclude each other");
    static constexpr bool kStreamK = Hybrid || Splits > 1;
    using Scheduler = std::conditional_t<kStreamK, cutlass::gemm::StreamKScheduler, void>;
    template <class Arguments>
    static void apply(Arguments& arguments) {
        if constexpr (kStreamK) {
            using Mode = cutlass::gemm::kernel::detail::DecompositionMode;
            arguments.scheduler.decomposition_mode = Hybrid ? Mode::Heuristic : Mode::SplitK;
            arguments.scheduler.reduction_mode = cutlass::gemm::kernel::detail::ReductionMode::Deterministic;
            arguments.scheduler.splits = Splits;
        }
    }
};

// A CUTLASS stride whose one dynamic leading mode holds `ld` (elements).
template <class Stride>
Stride stride_with_ld(int64_t ld) {
    Stride s{};
    if constexpr (cute::is_static<std::remove_reference_t<decltype(cute::get<0>(s))>>::value)
        cute::get<1>(s) = ld;
    else
        cute::get<0>(s) = ld;
    return s;
}

// Per-device facts asked of the driver once, not on every launch.
constexpr int kMaxDevices = 64;

inline int current_device() {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) device = 0;
    return device;
}

inline int multiprocessor_count(int device) {
    static std::atomic<int> counts[kMaxDevices] = {};
    int n = counts[device].load(std::memory_order_relaxed);
    if (n == 0) {
        n = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
        counts[device].store(n, std::memory_order_relaxed);
    }
    return n;
}

inline cutlass::KernelHardwareInfo hardware(int32_t workers) {
    cutlass::KernelHardwareInfo hw;
    hw.device_id = current_device();
    hw.sm_count = workers > 0 ? workers : multiprocessor_count(hw.device_id);
    return hw;
}

struct Failure : std::runtime_error {
    int status;
    Failure(int s, const std::string& what) : std::runtime_error(what), status(s) {}
};

// A failed runtime call also leaves its error as the thread's "last error",
// which the next library to call cudaGetLastError (torch after its own
// launches) would take for its own: it is cleared here, and reported once, by us.
inline void check_cuda(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        throw Failure(DISPATCHER_ERROR, std::string(what) + ": " + cudaGetErrorString(e));
    }
}

// The arguments of a single-problem call, checked (sizes, pointers, leading
// dimensions for the compiled layouts).
template <class T>
void check_args(const dispatcher_gemm_args* a) {
    if (!a) throw Failure(DISPATCHER_ERROR, "null argument struct");
    if (!a->a || !a->b || !a->c) throw Failure(DISPATCHER_ERROR, "null operand pointer");
    if (a->m < 1 || a->n < 1 || a->k < 1) throw Failure(DISPATCHER_ERROR, "M, N and K must be >= 1");
    if (a->m > INT32_MAX || a->n > INT32_MAX || a->k > INT32_MAX)
        throw Failure(DISPATCHER_UNSUPPORTED, "M, N and K must fit in 32 bits");
    const int64_t min_lda = T::kARow ? a->k : a->m;
    const int64_t min_ldb = T::kBRow ? a->n : a->k;
    if (a->lda < min_lda || a->ldb < min_ldb || a->ldc < a->n)
        throw Failure(DISPATCHER_ERROR, "leading dimension smaller than the matrix");
}

// A kernel's tile schedule on its scheduler's arguments: the swizzle, and
// the raster order where the config names one (T::kRaster 1 along M, 2
// along N; 0 keeps the scheduler's own rule).
template <class T, class SchedulerArguments>
void schedule(SchedulerArguments& scheduler) {
    using Raster = cutlass::gemm::kernel::detail::RasterOrderOptions;
    scheduler.max_swizzle_size = T::kSwizzle;
    if constexpr (T::kRaster != 0) scheduler.raster_order = T::kRaster == 1 ? Raster::AlongM : Raster::AlongN;
}

// The Arguments of a single-problem GemmUniversal (C is read for beta and
// written in place, so C and D are one buffer).
template <class Gemm, class T>
typename Gemm::Arguments gemm_arguments(const dispatcher_gemm_args* a) {
    using K = typename Gemm::GemmKernel;
    auto* c = static_cast<typename T::ElementC*>(a->c);
    typename Gemm::Arguments arguments{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {int(a->m), int(a->n), int(a->k), 1},
        {static_cast<const typename T::ElementA*>(a->a), stride_with_ld<typename K::StrideA>(a->lda),
         static_cast<const typename T::ElementB*>(a->b), stride_with_ld<typename K::StrideB>(a->ldb)},
        {{float(a->alpha), float(a->beta)},
         c, stride_with_ld<typename K::StrideC>(a->ldc),
         c, stride_with_ld<typename K::StrideD>(a->ldc)},
        hardware(a->workers)};
    schedule<T>(arguments.scheduler);
    return arguments;
}

// alpha with the call's per-tensor scales folded in (a scale of 0: unset, 1).
inline float scaled_alpha(const dispatcher_gemm_args* a) {
    const double scale = (a->scale_a == 0.0 ? 1.0 : a->scale_a) * (a->scale_b == 0.0 ? 1.0 : a->scale_b);
    return float(a->alpha * scale);
}

// The bias operand (extra operand 0) of a kernel that fuses one, checked to
// be there; an empty operand for a kernel that does not (B none).
template <Bias B>
dispatcher_operand fused_bias(const dispatcher_gemm_args* a) {
    if constexpr (B == Bias::none) {
        return dispatcher_operand{nullptr, 0, 0, 0};
    } else {
        if (a->extra_count < 1 || !a->extra || !a->extra[0].data)
            throw Failure(DISPATCHER_ERROR, "this kernel fuses a bias: extra operand 0 must be the bias");
        return a->extra[0];
    }
}

// The ABI-2 fields of a call on a single-problem kernel's arguments: the
// batch (mode L, each operand's batch stride; 0 = one matrix for every
// batch), the per-tensor scales folded into alpha, and the fused bias
// (extra operand 0; CUTLASS reads it contiguously along its axis, else -2).
template <class Gemm, class T, class Epi>
void apply_abi2(typename Gemm::Arguments& arguments, const dispatcher_gemm_args* a) {
    const int64_t batch = a->batch > 1 ? a->batch : 1;
    if (batch > INT32_MAX) throw Failure(DISPATCHER_UNSUPPORTED, "batch must fit in 32 bits");
    cute::get<3>(arguments.problem_shape) = int(batch);
    cute::get<2>(arguments.mainloop.dA) = a->batch_stride_a;
    cute::get<2>(arguments.mainloop.dB) = a->batch_stride_b;
    cute::get<2>(arguments.epilogue.dC) = a->batch_stride_c;
    cute::get<2>(arguments.epilogue.dD) = a->batch_stride_c;
    arguments.epilogue.thread.alpha = scaled_alpha(a);
    if constexpr (Epi::bias != Bias::none) {
        const dispatcher_operand bias = fused_bias<Epi::bias>(a);
        if (!bias_contiguous(a, Epi::bias == Bias::row))
            throw Failure(DISPATCHER_UNSUPPORTED, "the CUDA bias epilogue reads a contiguous bias vector");
        arguments.epilogue.thread.bias_ptr = static_cast<const typename T::ElementC*>(bias.data);
        cute::get<2>(arguments.epilogue.thread.dBias) = bias.batch_stride;
    }
}

// Raise the kernel's dynamic shared memory limit once per device. (CUTLASS's
// initialize() does it on every call: a driver call per launch.)
template <class Kernel>
void allow_shared_memory(int device) {
    constexpr int kBytes = Kernel::SharedStorageSize;
    if constexpr (kBytes >= (48 << 10)) {
        static std::atomic<bool> done[kMaxDevices] = {};
        if (done[device].load(std::memory_order_acquire)) return;
        check_cuda(cudaFuncSetAttribute(cutlass::device_kernel<Kernel>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes),
                   "cudaFuncSetAttribute(max dynamic shared memory)");
        done[device].store(true, std::memory_order_release);
    }
}

// Status -2 for a problem the kernel cannot run (alignment, sizes), decided
// by CUTLASS's own can_implement; -1 for a workspace smaller than it needs.
template <class Gemm>
void check_can_run(const typename Gemm::Arguments& arguments, int64_t workspace_bytes) {
    if (Gemm::can_implement(arguments) != cutlass::Status::kSuccess)
        throw Failure(DISPATCHER_UNSUPPORTED,
                      "CUTLASS can_implement rejected the problem (TMA needs 16-byte aligned "
                      "pointers and leading dimensions)");
    if (static_cast<int64_t>(Gemm::get_workspace_size(arguments)) > workspace_bytes)
        throw Failure(DISPATCHER_ERROR, "workspace smaller than dispatcher_workspace_size()");
}

// The kernel on `stream` with built params, in one driver call: what
// GemmUniversalAdapter::run() does for an SM90 kernel, less its cluster
// launcher's cudaFuncSetAttribute (non-portable cluster sizes, which no
// kernel here uses: clusters hold at most 8 blocks) on every launch.
template <class Kernel>
void launch_kernel(typename Kernel::Params& params, cudaStream_t stream) {
    using Cluster = typename Kernel::DispatchPolicy::ClusterShape;
    static_assert(cute::size(Cluster{}) <= 8, "a cluster of more than 8 blocks needs a non-portable launch");
    cudaLaunchAttribute cluster[1];
    cluster[0].id = cudaLaunchAttributeClusterDimension;
    cluster[0].val.clusterDim.x = cute::size<0>(Cluster{});
    cluster[0].val.clusterDim.y = cute::size<1>(Cluster{});
    cluster[0].val.clusterDim.z = cute::size<2>(Cluster{});
    cudaLaunchConfig_t config{};
    config.gridDim = Kernel::get_grid_shape(params);
    config.blockDim = Kernel::get_block_shape();
    config.dynamicSmemBytes = Kernel::SharedStorageSize;
    config.stream = stream;
    config.attrs = cluster;
    config.numAttrs = cute::size(Cluster{}) > 1 ? 1 : 0;
    void* kernel_params[] = {&params};
    check_cuda(cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(cutlass::device_kernel<Kernel>),
                                   kernel_params),
               "kernel launch");
}

// Initialize the workspace and launch with built params: what a
// GemmUniversalAdapter's initialize() + run() do, minus what they repeat
// per call (see allow_shared_memory and launch_kernel).
template <class Gemm>
int launch(const typename Gemm::Arguments& arguments, typename Gemm::GemmKernel::Params& params,
           void* workspace, cudaStream_t stream) {
    using Kernel = typename Gemm::GemmKernel;
    allow_shared_memory<Kernel>(arguments.hw_info.device_id);
    cutlass::Status st = Kernel::initialize_workspace(arguments, workspace, stream);
    if (st != cutlass::Status::kSuccess)
        throw Failure(DISPATCHER_ERROR, std::string("CUTLASS workspace initialization failed: ") +
                                            cutlassGetStatusString(st));
    launch_kernel<Kernel>(params, stream);
    return DISPATCHER_OK;
}

// One launch from arguments (the grouped path: its arguments point at
// per-call staging, so its params are built every time).
template <class Gemm>
int run_gemm(typename Gemm::Arguments& arguments, void* workspace, int64_t workspace_bytes,
             cudaStream_t stream) {
    check_can_run<Gemm>(arguments, workspace_bytes);
    auto params = Gemm::GemmKernel::to_underlying_arguments(arguments, workspace);
    return launch<Gemm>(arguments, params, workspace, stream);
}

// Everything a single-problem call's params are built from (the ABI-2
// fields too: batch, strides, scales and the first extra operand).
using CallKey = std::array<int64_t, 25>;

inline CallKey call_key(const dispatcher_gemm_args* a, int device) {
    auto bits = [](double x) {
        int64_t v = 0;
        std::memcpy(&v, &x, sizeof v);
        return v;
    };
    auto address = [](const void* p) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(p)); };
    const dispatcher_operand none{nullptr, 0, 0, 0};
    const dispatcher_operand& e = a->extra_count > 0 && a->extra ? a->extra[0] : none;
    return {address(a->a), address(a->b), address(a->c), a->m, a->n, a->k, a->lda, a->ldb, a->ldc,
            bits(a->alpha), bits(a->beta), address(a->workspace), a->workspace_bytes, a->workers, device,
            a->batch, a->batch_stride_a, a->batch_stride_b, a->batch_stride_c, bits(a->scale_a),
            bits(a->scale_b), address(e.data), e.row_stride, e.col_stride, e.batch_stride};
}

// A single-problem launch whose params are kept per thread with the call
// they were built for. Building them encodes the TMA descriptors, most of a
// launch's host time, and a loop over one problem repeats its call exactly
// (torch's caching allocator hands each new output back at the same
// address), so such a loop builds them once.
template <class Gemm>
int run_single(typename Gemm::Arguments& arguments, const dispatcher_gemm_args* a, cudaStream_t stream) {
    struct Last {
        CallKey call{};
        bool valid = false;
        typename Gemm::GemmKernel::Params params;
    };
    static thread_local Last last;
    const CallKey call = call_key(a, arguments.hw_info.device_id);
    if (!last.valid || last.call != call) {
        last.valid = false;
        check_can_run<Gemm>(arguments, a->workspace_bytes);
        last.params = Gemm::GemmKernel::to_underlying_arguments(arguments, a->workspace);
        last.call = call;
        last.valid = true;
    }
    return launch<Gemm>(arguments, last.params, a->workspace, stream);
}

// The Arguments of a call on a single-problem (or batch mode L)
// GemmUniversal kernel with fused epilogue `Epi`.
template <class Gemm, class T, class Epi>
typename Gemm::Arguments universal_arguments(const dispatcher_gemm_args* a) {
    auto arguments = gemm_arguments<Gemm, T>(a);
    apply_abi2<Gemm, T, Epi>(arguments, a);
    return arguments;
}

// The staging of a call (staging.hpp) on a kernel of traits T whose fused
// epilogue `Epi` may read a bias along M or N.
template <class T, class Epi>
Staging staging_for(const dispatcher_gemm_args* a) {
    return staging_of<T, Epi::bias != Bias::none, Epi::bias == Bias::row>(a);
}

// The workspace a call needs when `scratch(args)` is what its body needs
// for the problem it runs: the staged copies (staging.hpp), then that.
template <class T, class Epi, class Scratch>
int64_t staged_workspace_bytes(const dispatcher_gemm_args* a, Scratch&& scratch) {
    check_args<T>(a);
    Staging s = staging_for<T, Epi>(a);
    if (!s.any()) return scratch(a);
    // The body's arguments as the call binds them (a staged bias is only in
    // the bound block), at a stand-in address nothing is read through.
    Staging bound = s;
    const dispatcher_gemm_args body = bound.bound(reinterpret_cast<void*>(uintptr_t(4096)));
    return s.bytes + scratch(&body);
}

// Run `body(args)` on the call itself, or, where an operand breaks TMA's
// 16-byte rule, on zero-padded copies in the call's workspace (the body
// gets the rest of the workspace) with the result copied back; all on the
// call's stream. Every CUDA kernel's entry point goes through here.
template <class T, class Epi, class Body>
int staged_call(const dispatcher_gemm_args* a, Body&& body) {
    check_args<T>(a);
    const auto stream = static_cast<cudaStream_t>(a->stream);
    Staging s = staging_for<T, Epi>(a);
    if (!s.any()) return body(a);
    if (!a->workspace || a->workspace_bytes < s.bytes)
        throw Failure(DISPATCHER_ERROR, "workspace smaller than dispatcher_workspace_size() (operands that "
                                        "break TMA's 16-byte rule are staged in the workspace)");
    const dispatcher_gemm_args staged = s.bound(a->workspace);
    check_cuda(copy(s.in, s.moves_in, stream), "staging the operands");
    const int status = body(&staged);
    if (status == DISPATCHER_OK && s.copy_out) check_cuda(copy(&s.out, 1, stream), "copying the staged result");
    return status;
}

// The workspace of a single-problem kernel whose Arguments `make` builds.
template <class Gemm, class T, class Epi, class Make>
int64_t call_workspace_bytes(const dispatcher_gemm_args* a, Make&& make) {
    return staged_workspace_bytes<T, Epi>(
        a, [&](const dispatcher_gemm_args* s) { return static_cast<int64_t>(Gemm::get_workspace_size(make(s))); });
}

// One call of a single-problem kernel whose Arguments `make` builds.
template <class Gemm, class T, class Epi, class Make>
int run_call(const dispatcher_gemm_args* a, Make&& make) {
    return staged_call<T, Epi>(a, [&](const dispatcher_gemm_args* s) {
        auto arguments = make(s);
        return run_single<Gemm>(arguments, s, static_cast<cudaStream_t>(s->stream));
    });
}

// The ABI guard for CUDA entry points: Failure keeps its status.
template <class Body>
int guarded(Body&& body) {
    return dispatcher_abi::guarded([&] {
        try {
            return body();
        } catch (const Failure& f) {
            return dispatcher_abi::fail(f.status, f.what());
        }
    });
}

// A size query that must not throw across the C ABI: a negative status
// (-2: a problem the kernel cannot run, as the launch would say; else -1)
// and the last error.
template <class Body>
int64_t size_or_error(Body&& body) {
    try {
        return body();
    } catch (const Failure& f) {
        dispatcher_abi::last_error() = f.what();
        return f.status;
    } catch (const std::exception& e) {
        dispatcher_abi::last_error() = e.what();
        return -1;
    }
}

}  // namespace dcuda

// The workspace size query of a single-problem kernel (`run_call`): the
// bytes of its staged copies and its own scratch.
#define DCUDA_DEFINE_WORKSPACE_EXPORT(GEMM, TRAITS, EPI, ARGUMENTS_OF)                          \
    extern "C" DISPATCHER_EXPORT int64_t dispatcher_workspace_size(const dispatcher_gemm_args* args) { \
        return dcuda::size_or_error(                                                          \
            [&] { return dcuda::call_workspace_bytes<GEMM, TRAITS, EPI>(args, ARGUMENTS_OF); }); \
    }
