// The `residual` example variant: out = alpha * a @ b + gamma * residual, batched.
// The tile library does the product (packing, micro-kernel); this file is the
// schedule and the epilogue.
${prelude}
#include <stdexcept>

namespace {
using T = KernelTraits;
using S = dcpu::Scalar<T>;                  // the epilogue's arithmetic type
using Out = T::C::storage;

int run(const dispatcher_gemm_args* args) {
    return dispatcher_abi::guarded([&] {
        const dcpu::Problem<T> P = dcpu::make_problem<T>(args);  // checked; batch, strides, extras
        if (args->extra_count != 1 || args->param_count != 1)
            throw std::invalid_argument("residual takes one extra operand and one parameter");
        const S gamma = S(args->params[0]), alpha = S(P.alpha);
        const int64_t per_batch = P.tiles();
        const int threads = dcpu::thread_count(T::threads, args->workers);
        dcpu::parallel_tiles(threads, per_batch * P.batch, [&](int64_t t) {  // exceptions kept
            const dcpu::Problem<T> one = P.at(t / per_batch);      // batch t / per_batch
            const dcpu::TileCoord c = dcpu::tile_coord(one, t % per_batch);
            T::Acc* acc = dcpu::Buffers<T>::local().acc.get();   // MC x NC, row stride NC
            dcpu::accumulate_tile<T>(one, c.i0, c.mc, c.j0, c.nc, 0, one.k, acc, false);
            for (int i = 0; i < c.mc; ++i)
                for (int j = 0; j < c.nc; ++j) {
                    const S r = S(T::C::load(one.extra_at<Out>(0, c.i0 + i, c.j0 + j)));
                    one.c[(c.i0 + i) * one.ldc + c.j0 + j] =
                        T::C::store(alpha * S(acc[i * T::NC + j]) + gamma * r);
                }
        });
        return DISPATCHER_OK;
    });
}
}  // namespace

DISPATCHER_DEFINE_GEMM_EXPORTS(KERNEL_NAME, run)
