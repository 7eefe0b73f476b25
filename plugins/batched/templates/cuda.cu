// gemm-dispatcher batched GEMM, CUDA target: a CUTLASS 3.x SM90 GemmUniversal
// instance in batch mode L (each operand's batch stride in mode 2 of its
// stride; 0 = shared) with the fused epilogue. Generated file.
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

}  // namespace

DISPATCHER_DEFINE_COMMON_EXPORTS(KERNEL_NAME)

extern "C" DISPATCHER_EXPORT int dispatcher_run_gemm(const dispatcher_gemm_args* args) { return run(args); }
