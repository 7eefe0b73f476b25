// Test-only kernel: behaviour 0 ok, 1 segfault, 2 hang, 3 one wrong value, 4 right but slow
// (a busy loop of 4M steps first: milliseconds, many times the small GEMMs the tests time),
// 5 status -2 (the problem is unsupported) without writing anything.
${prelude}
namespace {
using T = KernelTraits;
constexpr int kBehaviour = ${behaviour};

int run(const dispatcher_gemm_args* args) {
    return dispatcher_abi::guarded([&] {
        const dcpu::Problem<T> P = dcpu::make_problem<T>(args);
        if (kBehaviour == 5) return dispatcher_abi::fail(DISPATCHER_UNSUPPORTED, "this kernel runs no problem");
        if (kBehaviour == 1) {
            volatile int* null = nullptr;
            *null = 1;
        }
        if (kBehaviour == 2) {
            volatile bool spin = true;
            while (spin) {
            }
        }
        if (kBehaviour == 4) {
            volatile int64_t steps = 0;
            while (steps < 4000000) steps = steps + 1;
        }
        for (int64_t t = 0; t < P.tiles(); ++t) dcpu::compute_tile<T>(P, t);
        if (kBehaviour == 3) P.c[0] = T::C::store(12345.0f);
        return DISPATCHER_OK;
    });
}
}  // namespace

DISPATCHER_DEFINE_COMMON_EXPORTS(KERNEL_NAME)

extern "C" DISPATCHER_EXPORT int dispatcher_run_gemm(const dispatcher_gemm_args* args) { return run(args); }
