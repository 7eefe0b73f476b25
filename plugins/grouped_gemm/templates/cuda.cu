// gemm-dispatcher grouped GEMM, CUDA target: a CUTLASS 3.x SM90 pointer-array
// grouped GEMM (GroupProblemShape). Generated file.
//
// Two entry points lay the groups out as CUTLASS wants them (problem shapes,
// pointer arrays, strides) at the front of the plugin-owned device workspace:
//   run_list    - the list form: sizes, pointers and leading dimensions come
//                 in host arrays and are staged with one copy;
//   run_stacked - the stacked (mixture-of-experts) form: a one-block kernel
//                 derives them on the device from the int32 row offsets, so
//                 the host never reads a group size (no synchronisation; the
//                 call can be captured in a CUDA graph and replayed with new
//                 offsets). CUTLASS then gets no host problem shapes and runs
//                 its persistent grid over whatever the device shapes hold.
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

__host__ __device__ constexpr size_t align16(size_t n) { return (n + 15) / 16 * 16; }
__host__ __device__ constexpr size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Byte offsets of the staged arrays for g groups, and their total, rounded
// up so that CUTLASS's own workspace after them (which holds TMA
// descriptors) stays 256-byte aligned. `first_free_row` (stacked form): the
// first row of C no group owns, written by the preparing kernel.
struct Staging {
    size_t first_free_row, shapes, a, b, c, sa, sb, sc, sd, bytes;
    __host__ __device__ explicit Staging(size_t g) {
        size_t at = 0;
        auto take = [&](size_t n) { size_t here = at; at += align16(n); return here; };
        first_free_row = take(sizeof(int64_t));
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

// `host_shapes`: the groups' shapes on the host (list form), or null when
// only the device knows them (stacked form).
typename Gemm::Arguments arguments_of(double alpha, double beta, int groups, const Shape3* host_shapes,
                                      char* staged) {
    const Staging s(groups);
    typename Gemm::Arguments arguments;
    decltype(arguments.epilogue.thread) fusion;
    fusion.alpha = float(alpha);
    fusion.beta = float(beta);
    fusion.alpha_ptr = nullptr;
    fusion.beta_ptr = nullptr;
    fusion.alpha_ptr_array = nullptr;
    fusion.beta_ptr_array = nullptr;
    fusion.dAlpha = {cute::_0{}, cute::_0{}, 0};
    fusion.dBeta = {cute::_0{}, cute::_0{}, 0};
    arguments = typename Gemm::Arguments{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        {groups, reinterpret_cast<Shape3*>(staged + s.shapes), host_shapes},
        {reinterpret_cast<const T::ElementA**>(staged + s.a), reinterpret_cast<StrideA*>(staged + s.sa),
         reinterpret_cast<const T::ElementB**>(staged + s.b), reinterpret_cast<StrideB*>(staged + s.sb)},
        {fusion, reinterpret_cast<const T::ElementC**>(staged + s.c), reinterpret_cast<StrideC*>(staged + s.sc),
         reinterpret_cast<T::ElementC**>(staged + s.c), reinterpret_cast<StrideD*>(staged + s.sd)},
        dcuda::hardware(0)};
    dcuda::schedule<T>(arguments.scheduler);
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
    auto arguments = arguments_of(a->alpha, a->beta, int(shapes.size()), shapes.data(), nullptr);
    return int64_t(Staging(active.size()).bytes + Gemm::get_workspace_size(arguments));
}

int run_list(const dispatcher_grouped_args* a) {
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
        auto arguments = arguments_of(a->alpha, a->beta, int(shapes.size()), shapes.data(), staged);
        return dcuda::run_gemm<Gemm>(arguments, staged + s.bytes, a->workspace_bytes - int64_t(s.bytes), stream);
    });
}
// ------------------------------------------------------------ stacked form
// What the preparing kernel needs, by value (strides are the same for every group).
struct Stacked {
    const int32_t* offsets;
    int groups;
    int64_t total_m;
    int n, k;
    const T::ElementA* a;
    int64_t a_row;  // elements from one row of A to the next
    const T::ElementB* b;
    int64_t stride_b;
    T::ElementC* c;
    int64_t ldc;
    StrideA sa;
    StrideB sb;
    StrideC sc;
    StrideD sd;
};

// One block: checks every offset (non-decreasing, within total_m), then
// writes each group's shape, pointers and strides into the staging area. Any
// bad offset gives every group M = 0 and no free rows: nothing is written.
__global__ void prepare_stacked(Stacked call, char* staged) {
    const Staging s(call.groups);
    int bad = 0;
    for (int g = threadIdx.x; g < call.groups; g += blockDim.x) {
        const int64_t start = g ? call.offsets[g - 1] : 0, end = call.offsets[g];
        bad |= end < start || end > call.total_m;
    }
    bad = __syncthreads_or(bad);
    for (int g = threadIdx.x; g < call.groups; g += blockDim.x) {
        const int64_t start = g ? call.offsets[g - 1] : 0, end = call.offsets[g];
        reinterpret_cast<Shape3*>(staged + s.shapes)[g] = Shape3{bad ? 0 : int(end - start), call.n, call.k};
        const int64_t row = bad ? 0 : start;
        reinterpret_cast<const T::ElementA**>(staged + s.a)[g] = call.a + row * call.a_row;
        reinterpret_cast<const T::ElementB**>(staged + s.b)[g] = call.b + g * call.stride_b;
        reinterpret_cast<T::ElementC**>(staged + s.c)[g] = call.c + row * call.ldc;
        reinterpret_cast<StrideA*>(staged + s.sa)[g] = call.sa;
        reinterpret_cast<StrideB*>(staged + s.sb)[g] = call.sb;
        reinterpret_cast<StrideC*>(staged + s.sc)[g] = call.sc;
        reinterpret_cast<StrideD*>(staged + s.sd)[g] = call.sd;
    }
    if (threadIdx.x == 0)
        *reinterpret_cast<int64_t*>(staged + s.first_free_row) =
            bad ? call.total_m : (call.groups ? call.offsets[call.groups - 1] : 0);
}

// Zeroes the rows of C that no group owns (from the first free row on).
__global__ void zero_free_rows(const int64_t* first_free_row, int64_t total_m, int n, T::ElementC* c, int64_t ldc) {
    const int64_t first = *first_free_row, count = (total_m - first) * n;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
        c[(first + i / n) * ldc + i % n] = T::ElementC(0);
}

void check_stacked(const dispatcher_grouped_mm_args* a) {
    if (!a || a->group_count < 0 || a->total_m < 0 || a->n < 0 || a->k < 0)
        throw dcuda::Failure(DISPATCHER_ERROR, "bad grouped_mm argument struct");
    if (a->group_count > INT32_MAX || a->total_m > INT32_MAX || a->n > INT32_MAX || a->k > INT32_MAX)
        throw dcuda::Failure(DISPATCHER_UNSUPPORTED, "grouped_mm sizes must fit in 32 bits");
    if (!a->offsets || !a->a || !a->b || !a->c) throw dcuda::Failure(DISPATCHER_ERROR, "null operand pointer");
    if (!T::kARow)
        throw dcuda::Failure(DISPATCHER_UNSUPPORTED, "the stacked form needs a row-major A on cuda "
                                                     "(a group's rows must start 16-byte aligned)");
}

// The stacked call as the kernel runs it: where TMA cannot read an operand
// in place (K, or N where it is contiguous, off a multiple of 16 bytes; a
// pointer, pitch or group stride off 16 bytes), on zero-padded copies at
// the front of the workspace, as a single-problem call is staged
// (native/cuda/staging.hpp): A's rows, each group's B, and C's rows, which
// are copied back after the GEMM (and in before it: bad offsets run no
// group, and C must then come back as it was). Zero columns of K add nothing; C's padded
// columns are dropped. `args` points into the workspace by offset until
// `bind` moves its staged pointers to addresses.
struct StackedCall {
    dispatcher_grouped_mm_args args;
    dcuda::Staging copies;  // its moves and byte count (its argument block is unused here)
    bool staged_a = false, staged_b = false, staged_c = false;

    explicit StackedCall(const dispatcher_grouped_mm_args* a) : args(*a) {
        using EA = T::ElementA;
        using EB = T::ElementB;
        using EC = T::ElementC;
        constexpr int64_t alA = 16 / sizeof(EA), alB = 16 / sizeof(EB), alC = 16 / sizeof(EC);
        const int64_t m = a->total_m, n = a->n, k = a->k, groups = a->group_count;
        const int64_t kp = (k % alA || (!T::kBRow && k % alB)) ? dcuda::round_up(k, std::max(alA, alB)) : k;
        const int64_t np = ((T::kBRow && n % alB) || n % alC)
                               ? dcuda::round_up(n, std::max(T::kBRow ? alB : int64_t(1), alC)) : n;
        auto off = [](const void* p, int64_t ld, int64_t al) { return !dcuda::aligned16(p) || ld % al; };
        if (kp != k || off(a->a, a->lda, alA)) {
            const auto to = copies.place(dcuda::Stored{a->a, m, k, a->lda, 0}, m, kp, 1, sizeof(EA), true);
            args.a = const_cast<void*>(to.data), args.lda = to.ld, staged_a = true;
        }
        const dcuda::Stored b{a->b, T::kBRow ? k : n, T::kBRow ? n : k, a->ldb, a->stride_b};
        if (kp != k || np != n || off(a->b, a->ldb, alB) || (groups > 1 && a->stride_b % alB)) {
            const auto to = copies.place(b, T::kBRow ? kp : np, T::kBRow ? np : kp, groups, sizeof(EB), true);
            args.b = const_cast<void*>(to.data), args.ldb = to.ld, args.stride_b = to.batch_stride, staged_b = true;
        }
        if (np != n || off(a->c, a->ldc, alC)) {
            const dcuda::Stored c{a->c, m, n, a->ldc, 0};
            // copied in too: where the offsets are bad nothing runs, and C must come back unchanged
            const auto to = copies.place(c, m, np, 1, sizeof(EC), true);
            args.c = const_cast<void*>(to.data), args.ldc = to.ld, staged_c = true;
            copies.out = dcuda::Move{to, c, 1, int(sizeof(EC))};
            copies.copy_out = true;
        }
        args.n = np, args.k = kp;
    }

    // The call bound to `workspace`: staged operands moved from offsets to
    // addresses; the workspace the grouped kernel gets starts after them.
    void bind(void* workspace) {
        auto at = [&](const void* offset) {
            return static_cast<void*>(static_cast<char*>(workspace) + reinterpret_cast<intptr_t>(offset));
        };
        for (int i = 0; i < copies.moves_in; ++i) copies.in[i].to.data = at(copies.in[i].to.data);
        if (copies.copy_out) copies.out.from.data = at(copies.out.from.data);
        if (staged_a) args.a = at(args.a);
        if (staged_b) args.b = at(args.b);
        if (staged_c) args.c = at(args.c);
        args.workspace = static_cast<char*>(workspace) + copies.bytes;
        args.workspace_bytes -= copies.bytes;
    }
};

typename Gemm::Arguments stacked_arguments(const dispatcher_grouped_mm_args* a, char* staged) {
    return arguments_of(a->alpha, 0.0, int(a->group_count), nullptr, staged);
}

int64_t stacked_workspace_bytes(const dispatcher_grouped_mm_args* a) {
    check_stacked(a);
    const StackedCall call(a);
    auto arguments = stacked_arguments(&call.args, nullptr);
    return call.copies.bytes + int64_t(Staging(a->group_count).bytes + Gemm::get_workspace_size(arguments));
}

int run_stacked(const dispatcher_grouped_mm_args* given) {
    return dcuda::guarded([&] {
        check_stacked(given);
        if (!given->total_m || !given->n) return DISPATCHER_OK;
        StackedCall call(given);
        if (!given->workspace || given->workspace_bytes < call.copies.bytes)
            throw dcuda::Failure(DISPATCHER_ERROR, "workspace smaller than dispatcher_grouped_mm_workspace_size() "
                                                   "(operands that break TMA's 16-byte rule are staged in it)");
        call.bind(given->workspace);
        const dispatcher_grouped_mm_args* a = &call.args;
        auto stream = static_cast<cudaStream_t>(a->stream);
        dcuda::check_cuda(dcuda::copy(call.copies.in, call.copies.moves_in, stream), "staging the operands");
        const Staging s(a->group_count);
        if (!a->workspace || a->workspace_bytes < int64_t(s.bytes))
            throw dcuda::Failure(DISPATCHER_ERROR, "workspace smaller than dispatcher_grouped_mm_workspace_size()");
        char* staged = static_cast<char*>(a->workspace);
        Stacked stacked{static_cast<const int32_t*>(a->offsets), int(a->group_count), a->total_m, int(a->n),
                        int(a->k), static_cast<const T::ElementA*>(a->a), a->lda,
                        static_cast<const T::ElementB*>(a->b), a->stride_b, static_cast<T::ElementC*>(a->c), a->ldc,
                        dcuda::stride_with_ld<StrideA>(a->lda), dcuda::stride_with_ld<StrideB>(a->ldb),
                        dcuda::stride_with_ld<StrideC>(a->ldc), dcuda::stride_with_ld<StrideD>(a->ldc)};
        prepare_stacked<<<1, 1024, 0, stream>>>(stacked, staged);
        dcuda::check_cuda(cudaGetLastError(), "preparing the stacked groups");
        const int64_t elements = a->total_m * a->n;
        const int blocks = int(std::min<int64_t>((elements + 255) / 256, 4 * dcuda::multiprocessor_count(dcuda::current_device())));
        zero_free_rows<<<blocks, 256, 0, stream>>>(reinterpret_cast<const int64_t*>(staged + s.first_free_row),
                                                   a->total_m, int(a->n), stacked.c, a->ldc);
        dcuda::check_cuda(cudaGetLastError(), "zeroing the rows no group owns");
        int status = DISPATCHER_OK;
        if (a->group_count && a->k) {
            auto arguments = stacked_arguments(a, staged);
            status = dcuda::run_gemm<Gemm>(arguments, staged + s.bytes, a->workspace_bytes - int64_t(s.bytes), stream);
        }
        if (status == DISPATCHER_OK && call.copies.copy_out)
            dcuda::check_cuda(dcuda::copy(&call.copies.out, 1, stream), "copying the staged result");
        return status;
    });
}
}  // namespace

DISPATCHER_DEFINE_COMMON_EXPORTS(KERNEL_NAME)

extern "C" DISPATCHER_EXPORT int dispatcher_run_grouped_gemm(const dispatcher_grouped_args* args) {
    return run_list(args);
}

extern "C" DISPATCHER_EXPORT int dispatcher_run_grouped_mm(const dispatcher_grouped_mm_args* args) {
    return run_stacked(args);
}

extern "C" DISPATCHER_EXPORT int64_t dispatcher_grouped_mm_workspace_size(const dispatcher_grouped_mm_args* args) {
    return dcuda::size_or_error([&] { return stacked_workspace_bytes(args); });
}

extern "C" DISPATCHER_EXPORT int64_t dispatcher_grouped_workspace_size(const dispatcher_grouped_args* args) {
    return dcuda::size_or_error([&] { return workspace_bytes(args); });
}
