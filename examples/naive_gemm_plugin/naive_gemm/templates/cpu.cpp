// The `naive` example variant: one dot product per output element.
${prelude}
namespace {
using T = KernelTraits;

int run(const dispatcher_gemm_args* args) {
    return dispatcher_abi::guarded([&] {
        const dcpu::Problem<T> P = dcpu::make_problem<T>(args);
#pragma omp parallel for
        for (int64_t i = 0; i < P.m; ++i)
            for (int64_t j = 0; j < P.n; ++j) {
                T::Acc sum = 0;
                for (int64_t p = 0; p < P.k; ++p) {
                    const auto a = P.a[T::a_row ? i * P.lda + p : p * P.lda + i];
                    const auto b = P.b[T::b_row ? p * P.ldb + j : j * P.ldb + p];
                    sum += T::A::load(a) * T::B::load(b);
                }
                auto& c = P.c[i * P.ldc + j];
                using S = dcpu::Scalar<T>;
                c = T::C::store(S(P.alpha) * S(sum) +
                                (P.beta == 0.0 ? S(0) : S(P.beta) * S(T::C::load(c))));
            }
        return DISPATCHER_OK;
    });
}
}  // namespace

DISPATCHER_DEFINE_COMMON_EXPORTS(KERNEL_NAME)

extern "C" DISPATCHER_EXPORT int dispatcher_run_gemm(const dispatcher_gemm_args* args) {
    return run(args);
}
