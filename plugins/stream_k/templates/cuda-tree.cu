// gemm-dispatcher stream-K GEMM with the tree reduction, CUDA target.
// Generated file.
//
// CUTLASS's stream-K fix-up reduces in order (Deterministic) or in arrival
// order (Nondeterministic) and has no tree, so the tree is split-K with the
// target's reduction kernel (cuda/split_k_tree.hpp): K cut into at most
// ${splits} slices, each slice's fp32 partial in the workspace, combined
// pairwise in log2 steps, alpha and beta applied once.
${prelude}
#include "cuda/split_k_tree.hpp"

namespace {
using SplitK = dcuda::tree::SplitK<KernelTraits, ${splits}, dcuda::PlainEpilogue>;
}  // namespace

DISPATCHER_DEFINE_COMMON_EXPORTS(KERNEL_NAME)

extern "C" DISPATCHER_EXPORT int dispatcher_run_gemm(const dispatcher_gemm_args* args) {
    return dcuda::guarded([&] { return SplitK::run(args); });
}

extern "C" DISPATCHER_EXPORT int64_t dispatcher_workspace_size(const dispatcher_gemm_args* args) {
    return dcuda::size_or_error([&] { return SplitK::workspace_bytes(args); });
}
