// gemm-dispatcher batched GEMM, CUDA target: a CUTLASS 3.x SM90 GemmUniversal
// instance in batch mode L (each operand's batch stride in mode 2 of its
// stride; 0 = shared) with the fused epilogue. Generated file.
${prelude}
namespace {
using T = KernelTraits;
using Epi = dcuda::Epilogue<dcuda::Bias::${bias}, dcuda::Activation::${activation}>;
using Gemm = dcuda::UniversalGemm<T, Epi>;

int run(const dispatcher_gemm_args* a) {
    return dcuda::guarded([&] { return dcuda::run_universal<Gemm, T, Epi>(a); });
}

}  // namespace

DISPATCHER_DEFINE_GEMM_EXPORTS(KERNEL_NAME, run)
