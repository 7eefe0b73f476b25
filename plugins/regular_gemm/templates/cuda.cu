// gemm-dispatcher regular GEMM, CUDA target: a CUTLASS 3.x SM90 GemmUniversal
// instance with the persistent data-parallel tile scheduler, or CUTLASS's
// stream-K scheduler where the config splits K with the linear reduction or
// asks for the hybrid decomposition (dcuda::Decomposition); or split-K with
// the tree reduction (the target's cuda/split_k_tree.hpp: partials in the
// workspace, a reduction kernel applies the epilogue); or, for the `gemv`
// schedule, the target's kernel for M or N up to 4 (cuda/gemv.hpp).
// Generated file.
${prelude}
#define DCUDA_TREE_SPLIT_K ${tree}
#if DCUDA_GEMV
#include "cuda/gemv.hpp"
#elif DCUDA_TREE_SPLIT_K
#include "cuda/split_k_tree.hpp"
#endif
namespace {
using T = KernelTraits;
using Epi = dcuda::Epilogue<dcuda::Bias::${bias}, dcuda::Activation::${activation}>;
#if DCUDA_GEMV
int run(const dispatcher_gemm_args* a) {
    return dcuda::guarded([&] { return dcuda::gemv::run<T, Epi::bias, Epi::activation>(a); });
}

int64_t workspace_bytes(const dispatcher_gemm_args* a) {
    dcuda::check_args<T>(a);
    return 0;  // nothing is staged: the kernel reads any alignment in place
}
#elif DCUDA_TREE_SPLIT_K
using SplitK = dcuda::tree::SplitK<T, ${splits}, Epi>;

int run(const dispatcher_gemm_args* a) {
    return dcuda::guarded([&] { return SplitK::run(a); });
}

int64_t workspace_bytes(const dispatcher_gemm_args* a) { return SplitK::workspace_bytes(a); }
#else
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

int64_t workspace_bytes(const dispatcher_gemm_args* a) {
    return dcuda::call_workspace_bytes<Gemm, T, Epi>(a, arguments_of);
}
#endif

const dispatcher_registry_entry kRegistry[] = {{KERNEL_NAME, &run}};
}  // namespace

DISPATCHER_DEFINE_GEMM_EXPORTS(KERNEL_NAME, run)

extern "C" DISPATCHER_EXPORT int64_t dispatcher_workspace_size(const dispatcher_gemm_args* args) {
    return dcuda::size_or_error([&] { return workspace_bytes(args); });
}

extern "C" DISPATCHER_EXPORT const dispatcher_registry_entry* dispatcher_registry(int* count) {
    *count = 1;
    return kRegistry;
}
