// gemm-dispatcher regular GEMM, CUDA target: a CUTLASS 3.x SM90 GemmUniversal
// instance with the persistent data-parallel tile scheduler. Generated file.
${prelude}
namespace {
using T = KernelTraits;
using Epi = dcuda::Epilogue<dcuda::Bias::${bias}, dcuda::Activation::${activation}>;
using C = dcuda::Collectives<T, T::MainloopSchedule, T::EpilogueSchedule, T::LayoutA, T::LayoutB, T::LayoutC, Epi>;
using GemmKernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>,
                                                        C::Mainloop, C::Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

int run(const dispatcher_gemm_args* a) {
    return dcuda::guarded([&] { return dcuda::run_universal<Gemm, T, Epi>(a); });
}

const dispatcher_registry_entry kRegistry[] = {{KERNEL_NAME, &run}};
}  // namespace

DISPATCHER_DEFINE_COMMON_EXPORTS(KERNEL_NAME)

extern "C" DISPATCHER_EXPORT int dispatcher_run_gemm(const dispatcher_gemm_args* args) { return run(args); }

extern "C" DISPATCHER_EXPORT const dispatcher_registry_entry* dispatcher_registry(int* count) {
    *count = 1;
    return kRegistry;
}
