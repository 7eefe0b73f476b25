// gemm-dispatcher regular GEMM, CUDA target: a CUTLASS 3.x SM90 GemmUniversal
// instance with the persistent data-parallel tile scheduler. Generated file.
${prelude}
namespace {
using T = KernelTraits;
using C = dcuda::Collectives<T, T::MainloopSchedule, T::EpilogueSchedule, T::LayoutA, T::LayoutB, T::LayoutC>;
using GemmKernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>,
                                                        C::Mainloop, C::Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

typename Gemm::Arguments make_arguments(const dispatcher_gemm_args* a) {
    using namespace dcuda;
    auto* c = static_cast<T::ElementC*>(a->c);
    return typename Gemm::Arguments{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {int(a->m), int(a->n), int(a->k), 1},
        {static_cast<const T::ElementA*>(a->a), stride_with_ld<typename Gemm::GemmKernel::StrideA>(a->lda),
         static_cast<const T::ElementB*>(a->b), stride_with_ld<typename Gemm::GemmKernel::StrideB>(a->ldb)},
        {{float(a->alpha), float(a->beta)},
         c, stride_with_ld<typename Gemm::GemmKernel::StrideC>(a->ldc),
         c, stride_with_ld<typename Gemm::GemmKernel::StrideD>(a->ldc)},
        hardware(a->workers)};
}

int run(const dispatcher_gemm_args* a) {
    return dcuda::guarded([&] {
        dcuda::check_args<T>(a);
        auto arguments = make_arguments(a);
        return dcuda::run_gemm<Gemm>(arguments, a->workspace, a->workspace_bytes,
                                     static_cast<cudaStream_t>(a->stream));
    });
}

const dispatcher_registry_entry kRegistry[] = {{KERNEL_NAME, &run}};
}  // namespace

DISPATCHER_DEFINE_COMMON_EXPORTS(KERNEL_NAME)

extern "C" DISPATCHER_EXPORT int dispatcher_run_gemm(const dispatcher_gemm_args* args) { return run(args); }

extern "C" DISPATCHER_EXPORT const dispatcher_registry_entry* dispatcher_registry(int* count) {
    *count = 1;
    return kRegistry;
}
