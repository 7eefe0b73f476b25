// gemm-dispatcher regular GEMM, CUDA target: a CUTLASS 3.x SM90 GemmUniversal
// instance with the persistent data-parallel tile scheduler. Generated file.
${prelude}
namespace {
using T = KernelTraits;
using Epi = dcuda::Epilogue<dcuda::Bias::${bias}, dcuda::Activation::${activation}>;
using Gemm = dcuda::UniversalGemm<T, Epi>;

int run(const dispatcher_gemm_args* a) {
    return dcuda::guarded([&] { return dcuda::run_universal<Gemm, T, Epi>(a); });
}

const dispatcher_registry_entry kRegistry[] = {{KERNEL_NAME, &run}};
}  // namespace

DISPATCHER_DEFINE_GEMM_EXPORTS(KERNEL_NAME, run)

extern "C" DISPATCHER_EXPORT const dispatcher_registry_entry* dispatcher_registry(int* count) {
    *count = 1;
    return kRegistry;
}
