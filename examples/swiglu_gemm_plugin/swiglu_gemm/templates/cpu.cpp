// The `swiglu` example variant: out = silu(alpha x @ w1) * (alpha x @ w3) + beta c.
// The tile library computes both products of a tile (packing, micro-kernel);
// this file is the schedule and the epilogue that combines them.
${prelude}
#include <stdexcept>

namespace {
using T = KernelTraits;                      // x @ w1: the config's layouts
using S = dcpu::Scalar<T>;                   // the epilogue's arithmetic type
// x @ w3: the traits of w3's layout, picked at run time off its strides; a type
// of its own, so that Buffers<W3> gives the second product its own accumulator.
template <bool Row> struct W3 : T { static constexpr bool b_row = Row; };

template <class U>
void swiglu(const dcpu::Problem<T>& P, const dcpu::Problem<U>& P3, int threads) {
    const S alpha = S(P.alpha), beta = S(P.beta);
    dcpu::parallel_tiles(threads, P.tiles(), [&](int64_t t) {
        const dcpu::TileCoord c = dcpu::tile_coord(P, t);
        T::Acc* h1 = dcpu::Buffers<T>::local().acc.get();   // MC x NC, row stride NC
        T::Acc* h3 = dcpu::Buffers<U>::local().acc.get();
        dcpu::accumulate_tile<T>(P, c.i0, c.mc, c.j0, c.nc, 0, P.k, h1, false);
        dcpu::accumulate_tile<U>(P3, c.i0, c.mc, c.j0, c.nc, 0, P.k, h3, false);
        for (int i = 0; i < c.mc; ++i)
            for (int j = 0; j < c.nc; ++j) {
                const S gate = dcpu::activate<dcpu::Activation::silu>(alpha * S(h1[i * T::NC + j]));
                const S up = alpha * S(h3[i * T::NC + j]);
                auto& out = P.c[(c.i0 + i) * P.ldc + c.j0 + j];   // holds c when beta != 0
                out = T::C::store(gate * up + (P.beta == 0.0 ? S(0) : beta * S(T::C::load(out))));
            }
    });
}

int run(const dispatcher_gemm_args* args) {
    return dispatcher_abi::guarded([&] {
        const dcpu::Problem<T> P = dcpu::make_problem<T>(args);  // checked; C row-major
        if (args->extra_count != 1) throw std::invalid_argument("swiglu takes one extra operand, w3");
        // w3 as a second B: row- or column-major off its strides, in elements;
        // a dim of size 1 comes as stride 0, like a broadcast one (which we refuse).
        const int64_t rs = args->extra[0].row_stride, cs = args->extra[0].col_stride;
        const bool row = (cs == 1 || P.n == 1) && (rs != 0 || P.k == 1);
        if (!row && !((rs == 1 || P.k == 1) && (cs != 0 || P.n == 1)))
            return dispatcher_abi::fail(DISPATCHER_UNSUPPORTED, "w3 broadcasts along K or N");
        dispatcher_gemm_args a3 = *args;                        // the same problem, with b = w3
        a3.b = args->extra[0].data;
        a3.ldb = row ? (P.k == 1 ? P.n : rs) : (P.n == 1 ? P.k : cs);
        const int threads = dcpu::thread_count(T::threads, args->workers);
        if (row) swiglu(P, dcpu::make_problem<W3<true>>(&a3), threads);
        else swiglu(P, dcpu::make_problem<W3<false>>(&a3), threads);
        return DISPATCHER_OK;
    });
}
}  // namespace

DISPATCHER_DEFINE_GEMM_EXPORTS(KERNEL_NAME, run)
