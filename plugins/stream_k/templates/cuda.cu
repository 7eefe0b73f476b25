// gemm-dispatcher stream-K GEMM, CUDA target: a CUTLASS 3.x SM90 GemmUniversal
// instance with cutlass::gemm::StreamKScheduler. Generated file.
//
// The decomposition (heuristic hybrid, stream-K, split-K, data-parallel) and
// the reduction (deterministic turnstile or nondeterministic) are compiled
// in; the workspace is sized by the kernel and owned by the plugin.
${prelude}
namespace {
using T = KernelTraits;
using C = dcuda::Collectives<T, T::MainloopSchedule, T::EpilogueSchedule, T::LayoutA, T::LayoutB, T::LayoutC>;
using GemmKernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, C::Mainloop,
                                                        C::Epilogue, cutlass::gemm::StreamKScheduler>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
using Decomposition = cutlass::gemm::kernel::detail::DecompositionMode;
using Reduction = cutlass::gemm::kernel::detail::ReductionMode;

typename Gemm::Arguments arguments_of(const dispatcher_gemm_args* a) {
    auto arguments = dcuda::gemm_arguments<Gemm, T>(a);
    arguments.scheduler.decomposition_mode = Decomposition::${decomposition};
    arguments.scheduler.reduction_mode = Reduction::${reduction};
    arguments.scheduler.splits = ${splits};
    return arguments;
}

int run(const dispatcher_gemm_args* a) {
    return dcuda::guarded([&] { return dcuda::run_call<Gemm, T, dcuda::PlainEpilogue>(a, arguments_of); });
}
}  // namespace

DISPATCHER_DEFINE_COMMON_EXPORTS(KERNEL_NAME)

extern "C" DISPATCHER_EXPORT int dispatcher_run_gemm(const dispatcher_gemm_args* args) { return run(args); }

DCUDA_DEFINE_WORKSPACE_EXPORT(Gemm, T, dcuda::PlainEpilogue, arguments_of)
