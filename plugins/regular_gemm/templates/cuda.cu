// gemm-dispatcher regular GEMM, CUDA target: a CUTLASS 3.x SM90 GemmUniversal
// instance with the persistent data-parallel tile scheduler, or CUTLASS's
// stream-K scheduler where the config splits K or asks for the hybrid
// decomposition (dcuda::Decomposition); or, for the `gemv` schedule,
// the target's kernel for M or N up to 16 (cuda/gemv.hpp). Generated file.
${prelude}
#if DCUDA_GEMV
#include "cuda/gemv.hpp"
#endif
namespace {
using T = KernelTraits;
#if DCUDA_GEMV
int run(const dispatcher_gemm_args* a) {
    return dcuda::guarded([&] { return dcuda::gemv::run<T, dcuda::Bias::${bias}, dcuda::Activation::${activation}>(a); });
}
#else
using Epi = dcuda::Epilogue<dcuda::Bias::${bias}, dcuda::Activation::${activation}>;
using Split = dcuda::Decomposition<${splits}, ${hybrid}>;
using Gemm = dcuda::UniversalGemm<T, Epi, Split::Scheduler>;

typename Gemm::Arguments arguments_of(const dispatcher_gemm_args* a) {
    auto arguments = dcuda::universal_arguments<Gemm, T, Epi>(a);
    Split::apply(arguments);
    return arguments;
}

int run(const dispatcher_gemm_args* a) {
    return dcuda::guarded([&] { return dcuda::run_call<Gemm, T, Epi>(a, arguments_of); });
}
#endif

const dispatcher_registry_entry kRegistry[] = {{KERNEL_NAME, &run}};
}  // namespace

DISPATCHER_DEFINE_GEMM_EXPORTS(KERNEL_NAME, run)
#if DCUDA_GEMV
// no workspace: nothing is staged (the kernel reads any alignment in place)
extern "C" DISPATCHER_EXPORT int64_t dispatcher_workspace_size(const dispatcher_gemm_args* args) {
    return dcuda::size_or_error([&] {
        dcuda::check_args<T>(args);
        return int64_t(0);
    });
}
#else
DCUDA_DEFINE_WORKSPACE_EXPORT(Gemm, T, Epi, arguments_of)
#endif

extern "C" DISPATCHER_EXPORT const dispatcher_registry_entry* dispatcher_registry(int* count) {
    *count = 1;
    return kRegistry;
}
