// gemm-dispatcher regular GEMM, CUDA target: a CUTLASS 3.x SM90 GemmUniversal
// instance with the persistent data-parallel tile scheduler, or split-K
// (dcuda::SplitK) where the config splits K. Generated file.
${prelude}
namespace {
using T = KernelTraits;
using Epi = dcuda::Epilogue<dcuda::Bias::${bias}, dcuda::Activation::${activation}>;
using Split = dcuda::SplitK<${splits}>;
using Gemm = dcuda::UniversalGemm<T, Epi, Split::Scheduler>;

typename Gemm::Arguments arguments_of(const dispatcher_gemm_args* a) {
    auto arguments = dcuda::universal_arguments<Gemm, T, Epi>(a);
    Split::apply(arguments);
    return arguments;
}

int run(const dispatcher_gemm_args* a) {
    return dcuda::guarded([&] { return dcuda::run_call<Gemm, T, Epi>(a, arguments_of); });
}

const dispatcher_registry_entry kRegistry[] = {{KERNEL_NAME, &run}};
}  // namespace

DISPATCHER_DEFINE_GEMM_EXPORTS(KERNEL_NAME, run)
DCUDA_DEFINE_WORKSPACE_EXPORT(Gemm, T, Epi, arguments_of)

extern "C" DISPATCHER_EXPORT const dispatcher_registry_entry* dispatcher_registry(int* count) {
    *count = 1;
    return kRegistry;
}
