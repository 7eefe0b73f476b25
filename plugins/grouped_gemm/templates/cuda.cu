// gemm-dispatcher grouped GEMM, CUDA target: a CUTLASS 3.x SM90 pointer-array
// grouped GEMM (GroupProblemShape). Generated file.
//
// The ABI hands over per-group sizes, device pointers and leading dimensions
// in host arrays; run() lays them out as CUTLASS wants them (problem shapes,
// pointer arrays, strides) and stages them into the front of the
// plugin-owned device workspace with one copy, then launches once.
${prelude}
#include <vector>

namespace {
using T = KernelTraits;
using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
using C = dcuda::Collectives<T, T::PtrArrayMainloopSchedule, T::PtrArrayEpilogueSchedule,
                             T::LayoutA*, T::LayoutB*, T::LayoutC*>;
using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, C::Mainloop, C::Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
using StrideA = typename GemmKernel::InternalStrideA;
using StrideB = typename GemmKernel::InternalStrideB;
using StrideC = typename GemmKernel::InternalStrideC;
using StrideD = typename GemmKernel::InternalStrideD;
using Shape3 = typename ProblemShape::UnderlyingProblemShape;

constexpr size_t align16(size_t n) { return (n + 15) / 16 * 16; }
constexpr size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Byte offsets of the staged arrays for g groups, and their total, rounded
// up so that CUTLASS's own workspace after them (which holds TMA
// descriptors) stays 256-byte aligned.
struct Staging {
    size_t shapes, a, b, c, sa, sb, sc, sd, bytes;
    explicit Staging(size_t g) {
        size_t at = 0;
        auto take = [&](size_t n) { size_t here = at; at += align16(n); return here; };
        shapes = take(g * sizeof(Shape3));
        a = take(g * sizeof(void*));
        b = take(g * sizeof(void*));
        c = take(g * sizeof(void*));
        sa = take(g * sizeof(StrideA));
        sb = take(g * sizeof(StrideB));
        sc = take(g * sizeof(StrideC));
        sd = take(g * sizeof(StrideD));
        bytes = align256(at);
    }
};

std::vector<int64_t> active_groups(const dispatcher_grouped_args* a) {
    if (!a || a->group_count < 0) throw dcuda::Failure(DISPATCHER_ERROR, "bad grouped argument struct");
    std::vector<int64_t> active;
    for (int64_t g = 0; g < a->group_count; ++g) {
        if (a->m[g] < 0 || a->n[g] < 0 || a->k[g] < 0)
            throw dcuda::Failure(DISPATCHER_ERROR, "group " + std::to_string(g) + " has a negative size");
        if (a->m[g] > INT32_MAX || a->n[g] > INT32_MAX || a->k[g] > INT32_MAX)
            throw dcuda::Failure(DISPATCHER_UNSUPPORTED, "group sizes must fit in 32 bits");
        if (a->m[g] && a->n[g] && a->k[g]) active.push_back(g);
    }
    return active;
}

typename Gemm::Arguments arguments_of(const dispatcher_grouped_args* a, const std::vector<Shape3>& shapes,
                                      char* staged) {
    const Staging s(shapes.size());
    typename Gemm::Arguments arguments;
    decltype(arguments.epilogue.thread) fusion;
    fusion.alpha = float(a->alpha);
    fusion.beta = float(a->beta);
    fusion.alpha_ptr = nullptr;
    fusion.beta_ptr = nullptr;
    fusion.alpha_ptr_array = nullptr;
    fusion.beta_ptr_array = nullptr;
    fusion.dAlpha = {cute::_0{}, cute::_0{}, 0};
    fusion.dBeta = {cute::_0{}, cute::_0{}, 0};
    arguments = typename Gemm::Arguments{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        {int(shapes.size()), reinterpret_cast<Shape3*>(staged + s.shapes), shapes.data()},
        {reinterpret_cast<const T::ElementA**>(staged + s.a), reinterpret_cast<StrideA*>(staged + s.sa),
         reinterpret_cast<const T::ElementB**>(staged + s.b), reinterpret_cast<StrideB*>(staged + s.sb)},
        {fusion, reinterpret_cast<const T::ElementC**>(staged + s.c), reinterpret_cast<StrideC*>(staged + s.sc),
         reinterpret_cast<T::ElementC**>(staged + s.c), reinterpret_cast<StrideD*>(staged + s.sd)},
        dcuda::hardware(0)};
    arguments.scheduler.max_swizzle_size = T::kSwizzle;
    return arguments;
}

std::vector<Shape3> shapes_of(const dispatcher_grouped_args* a, const std::vector<int64_t>& active) {
    std::vector<Shape3> shapes;
    for (int64_t g : active) shapes.push_back(Shape3{int(a->m[g]), int(a->n[g]), int(a->k[g])});
    return shapes;
}

int64_t workspace_bytes(const dispatcher_grouped_args* a) {
    const auto active = active_groups(a);
    const auto shapes = shapes_of(a, active);
    auto arguments = arguments_of(a, shapes, nullptr);
    return int64_t(Staging(active.size()).bytes + Gemm::get_workspace_size(arguments));
}

int run(const dispatcher_grouped_args* a) {
    return dcuda::guarded([&] {
        const auto active = active_groups(a);
        auto stream = static_cast<cudaStream_t>(a->stream);
        for (int64_t g = 0; g < a->group_count; ++g)  // K = 0: the product is zero
            if (a->m[g] && a->n[g] && !a->k[g])
                dcuda::check_cuda(cudaMemset2DAsync(a->c[g], a->ldc[g] * sizeof(T::ElementC), 0,
                                                    a->n[g] * sizeof(T::ElementC), a->m[g], stream),
                                  "zeroing a K = 0 group");
        if (active.empty()) return DISPATCHER_OK;
        const Staging s(active.size());
        if (!a->workspace || a->workspace_bytes < int64_t(s.bytes))
            throw dcuda::Failure(DISPATCHER_ERROR, "workspace smaller than dispatcher_grouped_workspace_size()");
        const auto shapes = shapes_of(a, active);
        std::vector<char> host(s.bytes);
        for (size_t i = 0; i < active.size(); ++i) {
            const int64_t g = active[i];
            if (!a->a[g] || !a->b[g] || !a->c[g]) throw dcuda::Failure(DISPATCHER_ERROR, "null operand pointer");
            const int64_t min_lda = T::kARow ? a->k[g] : a->m[g];
            const int64_t min_ldb = T::kBRow ? a->n[g] : a->k[g];
            if (a->lda[g] < min_lda || a->ldb[g] < min_ldb || a->ldc[g] < a->n[g])
                throw dcuda::Failure(DISPATCHER_ERROR, "leading dimension smaller than the matrix in group " + std::to_string(g));
            reinterpret_cast<Shape3*>(host.data() + s.shapes)[i] = shapes[i];
            reinterpret_cast<const void**>(host.data() + s.a)[i] = a->a[g];
            reinterpret_cast<const void**>(host.data() + s.b)[i] = a->b[g];
            reinterpret_cast<void**>(host.data() + s.c)[i] = a->c[g];
            reinterpret_cast<StrideA*>(host.data() + s.sa)[i] = dcuda::stride_with_ld<StrideA>(a->lda[g]);
            reinterpret_cast<StrideB*>(host.data() + s.sb)[i] = dcuda::stride_with_ld<StrideB>(a->ldb[g]);
            reinterpret_cast<StrideC*>(host.data() + s.sc)[i] = dcuda::stride_with_ld<StrideC>(a->ldc[g]);
            reinterpret_cast<StrideD*>(host.data() + s.sd)[i] = dcuda::stride_with_ld<StrideD>(a->ldc[g]);
        }
        char* staged = static_cast<char*>(a->workspace);
        dcuda::check_cuda(cudaMemcpyAsync(staged, host.data(), s.bytes, cudaMemcpyHostToDevice, stream),
                          "staging grouped arguments");
        auto arguments = arguments_of(a, shapes, staged);
        return dcuda::run_gemm<Gemm>(arguments, staged + s.bytes, a->workspace_bytes - int64_t(s.bytes), stream);
    });
}
}  // namespace

DISPATCHER_DEFINE_COMMON_EXPORTS(KERNEL_NAME)

extern "C" DISPATCHER_EXPORT int dispatcher_run_grouped_gemm(const dispatcher_grouped_args* args) {
    return run(args);
}

extern "C" DISPATCHER_EXPORT int64_t dispatcher_grouped_workspace_size(const dispatcher_grouped_args* args) {
    return dcuda::size_or_error([&] { return workspace_bytes(args); });
}
