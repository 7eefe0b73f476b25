// The CPU tile library that generated gemm-dispatcher sources instantiate.
//
// A kernel is a `Traits` type (dtypes, block tile, micro-tile, layouts, the
// micro-kernel's arithmetic: a policy of dot_ops.hpp) and three building
// blocks every variant shares:
//   accumulate_tile  - one output block over a K range: packs A and B into
//                      zero-padded panels (converting any storage dtype to the
//                      policy's packed types while packing) and runs the
//                      register-blocked micro-kernel over them;
//   store_tile       - the epilogue: alpha/beta, then the fused bias and
//                      activation an `Epilogue` type names, converting to the
//                      output dtype;
//   compute_tile     - both, for one whole output block.
// A batched launch (dispatcher_gemm_args.batch > 1) is a Problem whose
// `at(b)` gives the problem of batch b.
// How blocks are scheduled over threads (data-parallel, grouped, stream-K) is
// variant knowledge and lives in each plugin's template.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <string>
#include <vector>

#include "cpu/placement.hpp"
#include "cpu/vec_math.hpp"
#include "dot_ops.hpp"
#include "dispatcher_abi.h"

namespace dcpu {

// ---------------------------------------------------------------- codecs ----
// A codec names the storage type of one operand and converts it to and from
// the compute type. Everything is converted while packing, so the
// micro-kernel only ever sees the packed type of its policy (the compute
// type, float or int32, or the narrow type a dot-product instruction takes).

struct F32 {
    using storage = float;
    using compute = float;
    static inline float load(storage v) { return v; }
    static inline storage store(float v) { return v; }
};

// IEEE binary16 storage. GCC takes _Float16 in C++ on x86-64 from version 12
// but on aarch64 only from 13; aarch64's __fp16 is the same format there
// (converted by fcvt, rounding to nearest even), in every GCC and Clang.
#if defined(__aarch64__)
using half = __fp16;
#else
using half = _Float16;
#endif

struct F16 {
    using storage = half;
    using compute = float;
    static inline float load(storage v) { return static_cast<float>(v); }
    static inline storage store(float v) { return static_cast<storage>(v); }
};

struct BF16 {
    using storage = uint16_t;
    using compute = float;
    static inline float load(storage v) {
        uint32_t bits = static_cast<uint32_t>(v) << 16;
        float f;
        std::memcpy(&f, &bits, sizeof f);
        return f;
    }
    static inline storage store(float f) {
        uint32_t bits;
        std::memcpy(&bits, &f, sizeof bits);
        if (std::isnan(f)) return static_cast<storage>((bits >> 16) | 0x40);
        bits += 0x7FFFu + ((bits >> 16) & 1u);  // round to nearest even
        return static_cast<storage>(bits >> 16);
    }
};

// 8-bit floats decode through a 256-entry table the code generator writes from
// ml_dtypes, so every encoding (OCP and FNUZ) decodes exactly as numpy does.
template <const float (&Table)[256]>
struct Fp8 {
    using storage = uint8_t;
    using compute = float;
    static inline float load(storage v) { return Table[v]; }
};

struct I8 {
    using storage = int8_t;
    using compute = int32_t;
    static inline int32_t load(storage v) { return v; }
};

struct I32 {
    using storage = int32_t;
    using compute = int32_t;
    static inline int32_t load(storage v) { return v; }
    static inline storage store(double v) {
        v = std::nearbyint(v);
        v = std::min(std::max(v, -2147483648.0), 2147483647.0);
        return static_cast<int32_t>(v);
    }
};

// ---------------------------------------------------------------- traits ----
template <class A_, class B_, class C_, int MC_, int NC_, int KC_, int MR_, int NR_,
          bool ARow_, bool BRow_, int VecBytes_, int Threads_, class Dot_ = Fma>
struct Traits {
    using A = A_;
    using B = B_;
    using C = C_;
    using Acc = typename A_::compute;
    static constexpr int MR = MR_, NR = NR_, KC = KC_;
    // Block tiles are whole multiples of the micro-tile.
    static constexpr int MC = (MC_ + MR_ - 1) / MR_ * MR_;
    static constexpr int NC = (NC_ + NR_ - 1) / NR_ * NR_;
    static constexpr bool a_row = ARow_, b_row = BRow_;
    static constexpr int vec_bytes = VecBytes_;
    static constexpr int threads = Threads_;  // 0: all OpenMP threads
    static_assert((NR_ * sizeof(Acc)) % VecBytes_ == 0, "NR must fill whole vectors");

    // Packed panels (see `pack_sliver`): element types and k groups (A's
    // are KGA deep, B's KG; a K block is padded to a multiple of KPAD).
    using Dot = Dot_;
    using PA = typename Dot_::template A<A_>;
    using PB = typename Dot_::template B<B_>;
    static constexpr int KG = Dot_::KG, KGA = PanelShape<Dot_>::a_group, KPAD = PanelShape<Dot_>::pad;
    static constexpr bool pairs = Pairs<Dot_>::value, tiles = Tiles<Dot_>::value;
    static_assert(tiles || KGA == KG, "A and B groups differ for tile instructions only");
    static_assert(tiles || (KG * sizeof(PA) * (pairs ? 2 : 1) == sizeof(Acc) * (pairs ? 4 : 1) &&
                            KG * sizeof(PB) * (pairs ? 2 : 1) == sizeof(Acc) * (pairs ? 4 : 1)),
                  "a k group fills one accumulator lane (of a pair: one 2x2 block)");
    static_assert(!pairs || (MR_ % 2 == 0 && NR_ % 2 == 0), "pairs of rows and columns");
    static_assert(!tiles || (MR_ == 32 && NR_ == 32), "tile micro-kernels compute 32x32");
    static constexpr size_t padded(int kc) { return size_t(kc + KPAD - 1) / KPAD * KPAD; }
    static constexpr size_t groups(int kc) { return padded(kc) / KG; }
    static constexpr size_t a_groups(int kc) { return padded(kc) / KGA; }
    static constexpr size_t a_sliver_bytes(int kc) {
        return padded(kc) * MR * sizeof(PA) + (Dot_::row_offset_scale ? MR * sizeof(int32_t) : 0);
    }
    static constexpr size_t b_sliver_bytes(int kc) { return padded(kc) * NR * sizeof(PB); }
    static constexpr size_t a_panel_bytes = size_t(MC / MR) * a_sliver_bytes(KC);
    static constexpr size_t b_panel_bytes = size_t(NC / NR) * b_sliver_bytes(KC);
};

// ------------------------------------------------------------- epilogue ----
// What the epilogue fuses after alpha * acc + beta * C, compiled into the
// kernel: a bias (one value per output row or per output column, stored in
// the output dtype, extra operand 0) and then an activation.
enum class Bias { none, row, col };
enum class Activation { none, relu, gelu, silu };

template <Bias Bias_, Activation Act_>
struct Epilogue {
    static constexpr Bias bias = Bias_;
    static constexpr Activation activation = Act_;
    static constexpr bool plain = Bias_ == Bias::none && Act_ == Activation::none;
};
using PlainEpilogue = Epilogue<Bias::none, Activation::none>;

// The activation of one value: x a float vector (vec_math.hpp), one float
// (through a vector of four: a template's own scalar epilogue) or one double
// (integer kernels, whose epilogue computes in double: libm).
template <Activation A, class S>
static inline S activate(S x) {
    if constexpr (A == Activation::relu) return x < S{} ? S{} : x;  // NaN stays NaN
    if constexpr (std::is_same_v<S, float>) {
        typedef float four __attribute__((vector_size(16)));
        return activate<A>(four{x, x, x, x})[0];
    } else if constexpr (std::is_same_v<S, double>) {
        if constexpr (A == Activation::gelu) return 0.5 * x * std::erfc(-x * 0.70710678118654752440);
        if constexpr (A == Activation::silu) return x / (1.0 + std::exp(-x));
    } else {
        if constexpr (A == Activation::gelu) return vmath::gelu(x);
        if constexpr (A == Activation::silu) return vmath::silu(x);
    }
    return x;
}

// v[0, n) = activation(v[0, n)), float rows a vector of VecBytes at a time.
template <Activation A, int VecBytes, class S>
void activate_row(S* v, int n) {
    if constexpr (A == Activation::none) {
        return;
    } else if constexpr (std::is_same_v<S, float>) {
        typedef float vec __attribute__((vector_size(VecBytes)));
        constexpr int L = VecBytes / sizeof(float);
        const auto apply = [v](int j, size_t bytes) {
            vec x{};
            std::memcpy(&x, v + j, bytes);
            x = activate<A>(x);
            std::memcpy(v + j, &x, bytes);
        };
        int j = 0;
        for (; j + L <= n; j += L) apply(j, sizeof(vec));
        if (j < n) apply(j, sizeof(float) * size_t(n - j));  // the last lanes zero
    } else {
        for (int j = 0; j < n; ++j) v[j] = activate<A>(v[j]);
    }
}

// Memory a kernel asks to be prefetched.
struct Region {  // `rows` runs of `bytes` bytes, `stride` bytes apart
    const char* base = nullptr;
    int64_t rows = 0, bytes = 0, stride = 0;
};

// One problem as the kernel sees it: C is row-major with leading dim ldc.
template <class T>
struct Problem {
    const typename T::A::storage* a;
    const typename T::B::storage* b;
    typename T::C::storage* c;
    int64_t m, n, k, lda, ldb, ldc;
    double alpha, beta;
    uint64_t generation;  // unique per launch and batch: keys the packed-panel cache
    // Whether a thread may run two tiles of one column back to back, so a
    // packed B panel is worth keeping (the plugin's schedule knows).
    bool reuse_b_panels = true;
    int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;  // elements; 0: shared
    int64_t batch_index = 0;                                       // which batch this is
    const dispatcher_operand* extra = nullptr;                     // extra operands
    int32_t extra_count = 0;
    // All of A packed once (`SharedPackedA`): the panel of tile row ti and
    // K block kb at (ti * k_iters() + kb / KC) * a_panel_bytes; null: each
    // tile packs the A blocks it reads.
    const unsigned char* packed_a = nullptr;
    // The source of the tile this thread computes next (its first K block),
    // prefetched during this tile's last K block (set by a schedule that
    // knows it, e.g. batches of small matrices: `prefetch_next_tile`).
    Region after_a, after_b;

    int64_t tiles_m() const { return (m + T::MC - 1) / T::MC; }
    int64_t tiles_n() const { return (n + T::NC - 1) / T::NC; }
    int64_t tiles() const { return tiles_m() * tiles_n(); }
    int64_t k_iters() const { return (k + T::KC - 1) / T::KC; }

    // The problem of batch `index`. Batches that share B (stride 0) share its
    // generation too, so a thread reuses a packed B panel across them.
    Problem at(int64_t index) const {
        Problem p = *this;
        p.a += index * stride_a;
        p.b += index * stride_b;
        p.c += index * stride_c;
        p.batch_index = index;
        if (stride_b) p.generation += uint64_t(index);
        if (stride_a) p.packed_a = nullptr;  // a packed A is batch 0's
        return p;
    }
    // Element (i, j) of extra operand `e` in this batch.
    template <class S>
    S extra_at(int e, int64_t i, int64_t j) const {
        const dispatcher_operand& x = extra[e];
        return static_cast<const S*>(x.data)[batch_index * x.batch_stride + i * x.row_stride +
                                             j * x.col_stride];
    }
};

// `count` consecutive generations, unique in the process.
inline uint64_t next_generation(uint64_t count = 1) {
    static std::atomic<uint64_t> counter{0};
    return counter.fetch_add(count) + 1;
}

// The problem of a (batched) GEMM call for epilogue `Epi`, with every argument
// checked; a bad one throws (the ABI guard turns it into status -1 with the
// message). The ABI-2 fields all 0 are one unscaled GEMM.
template <class T, class Epi = PlainEpilogue>
Problem<T> make_problem(const dispatcher_gemm_args* args) {
    if (!args) throw std::invalid_argument("null argument struct");
    if (!args->a || !args->b || !args->c) throw std::invalid_argument("null operand pointer");
    if (args->m < 1 || args->n < 1 || args->k < 1)
        throw std::invalid_argument("M, N and K must be >= 1");
    const int64_t min_lda = T::a_row ? args->k : args->m;
    const int64_t min_ldb = T::b_row ? args->n : args->k;
    if (args->lda < min_lda || args->ldb < min_ldb || args->ldc < args->n)
        throw std::invalid_argument("leading dimension smaller than the matrix (lda " +
                                    std::to_string(args->lda) + ", ldb " +
                                    std::to_string(args->ldb) + ", ldc " +
                                    std::to_string(args->ldc) + ")");
    const int64_t batch = std::max<int64_t>(args->batch, 1);
    if (args->batch < 0 || args->batch_stride_a < 0 || args->batch_stride_b < 0 ||
        args->batch_stride_c < 0)
        throw std::invalid_argument("negative batch count or batch stride");
    if (batch > 1 && args->batch_stride_c < (args->m - 1) * args->ldc + args->n)
        throw std::invalid_argument("batch_stride_c " + std::to_string(args->batch_stride_c) +
                                    " makes the output matrices of two batches overlap");
    if (args->extra_count < 0 || (args->extra_count > 0 && !args->extra))
        throw std::invalid_argument("extra_count without extra operands");
    if constexpr (Epi::bias != Bias::none) {
        if (args->extra_count < 1 || !args->extra[0].data)
            throw std::invalid_argument("this kernel fuses a bias: extra operand 0 must be the bias");
    }
    const double scale_a = args->scale_a == 0.0 ? 1.0 : args->scale_a;
    const double scale_b = args->scale_b == 0.0 ? 1.0 : args->scale_b;
    const double alpha = scale_a == 1.0 && scale_b == 1.0 ? args->alpha : args->alpha * scale_a * scale_b;
    Problem<T> P{static_cast<const typename T::A::storage*>(args->a),
                 static_cast<const typename T::B::storage*>(args->b),
                 static_cast<typename T::C::storage*>(args->c),
                 args->m, args->n, args->k, args->lda, args->ldb, args->ldc,
                 alpha, args->beta, next_generation(uint64_t(batch))};
    P.batch = batch;
    P.stride_a = args->batch_stride_a;
    P.stride_b = args->batch_stride_b;
    P.stride_c = args->batch_stride_c;
    P.extra = args->extra;
    P.extra_count = args->extra_count;
    return P;
}

// An exception must not leave an OpenMP region: the runtime would call
// std::terminate and abort the caller's process (a thread's buffers that
// cannot be allocated throw std::bad_alloc). Work inside a region runs through
// `run`, which keeps the first exception and skips the work left; `rethrow`,
// after the region, hands it to the ABI guard (status -1 with its message).
class RegionErrors {
  public:
    template <class Work>
    void run(Work&& work) noexcept {
        if (failed_.load(std::memory_order_relaxed)) return;
        try {
            work();
        } catch (...) {
            if (!failed_.exchange(true)) first_ = std::current_exception();
        }
    }
    void rethrow() const {
        if (first_) std::rethrow_exception(first_);
    }

  private:
    std::atomic<bool> failed_{false};
    std::exception_ptr first_;
};

// The cost of a tile for `parallel_tiles`' static split: all alike.
struct EqualTiles {
    double operator()(int64_t) const { return 1.0; }
};

// work(t) for t in [0, tiles) on `threads` OpenMP threads, the workers kept
// off the caller's CPU (`WorkerPlacement`); the first exception is rethrown after. chunk 0: each thread one
// contiguous run of t (consecutive tiles of one column share a packed B
// panel), the runs of about equal total `cost(t)` (edge tiles cost less:
// equal counts would leave one thread all the full tiles); else runs of
// `chunk` tiles handed out as threads finish, so a thread on a core shared
// with other work takes fewer.
template <class Work, class Cost = EqualTiles>
void parallel_tiles(int threads, int64_t tiles, Work&& work, int chunk = 0, Cost cost = Cost{}) {
    if (threads > tiles) threads = static_cast<int>(tiles);  // a thread with no tile would only be woken
    if (threads <= 1) {  // no team: a small problem costs what its tiles cost
        for (int64_t t = 0; t < tiles; ++t) work(t);
        return;
    }
    RegionErrors errors;
    const WorkerPlacement placement;
    if (chunk > 0) {
#pragma omp parallel num_threads(threads) proc_bind(close)
        {
            placement.settle(omp_get_thread_num(), omp_get_num_threads());
#pragma omp for schedule(dynamic, chunk)
            for (int64_t t = 0; t < tiles; ++t) errors.run([&] { work(t); });
        }
    } else {
        // The cost of the tiles before tile t's middle, and of them all.
        std::unique_ptr<double[]> middle(new double[size_t(tiles)]);
        double total = 0.0;
        for (int64_t t = 0; t < tiles; ++t) {
            const double c = cost(t);
            middle[t] = total + c / 2;
            total += c;
        }
#pragma omp parallel num_threads(threads) proc_bind(close)
        {
            const int team = omp_get_num_threads(), r = omp_get_thread_num();
            placement.settle(r, team);
            // Thread r's run: the tiles whose middle falls in its share of the
            // cost. (Not the tiles whose start does: 257 x 1031 in 240x512
            // tiles is two full tiles and four thin ones, and the second
            // full one starts just short of half the cost, so one thread
            // took both, 96% of the work: 0.54x OpenBLAS on 2 cores.)
            auto first = [&](int share) {
                return std::lower_bound(middle.get(), middle.get() + tiles, total * share / team) - middle.get();
            };
            const int64_t end = r + 1 == team ? tiles : first(r + 1);
            for (int64_t t = first(r); t < end; ++t) errors.run([&] { work(t); });
        }
    }
    errors.rethrow();
}

// Floating-point operations worth waking one more worker for, where neither
// the config nor the call sets the thread count: waking a sleeping OpenMP
// worker costs microseconds, and far more when the other cores are busy (a
// 4 x 16x8x24 batched GEMM took 270 us on two threads of a 2-core machine
// compiling in the background, 5 us on one), while 1 MFLOP is about 10 us
// of one core's work.
constexpr double kFlopsPerThread = 1 << 20;

// The threads of a launch: the call's `workers`, else the config's, else as
// many as the problem's `flops` keep busy, up to OpenMP's count (0: unknown).
inline int thread_count(int compiled, int32_t requested, double flops = 0) {
    if (requested > 0) return requested;
    if (compiled > 0) return compiled;
    const int most = omp_get_max_threads();
    if (flops <= 0) return most;
    return static_cast<int>(std::max(1.0, std::min(double(most), flops / kFlopsPerThread)));
}

// --------------------------------------------------------- thread buffers ----
// Guard bytes around every per-thread buffer, in a test build that defines
// DCPU_GUARD_BYTES (a multiple of 64; tests/test_cpu_dot_kernels.py): set to
// kGuard when the buffer is allocated and checked after every block
// (`Buffers::check_guards`), so a write past a buffer's end or before its
// start is an error that names the buffer, where it would otherwise corrupt
// the heap and make malloc abort the process some time later.
#ifndef DCPU_GUARD_BYTES
#define DCPU_GUARD_BYTES 0
#endif
constexpr size_t kGuardBytes = DCPU_GUARD_BYTES;
static_assert(kGuardBytes % 64 == 0, "guards keep the buffers 64-byte aligned");
constexpr unsigned char kGuard = 0xA5;

struct AlignedFree {
    void operator()(void* p) const { std::free(static_cast<char*>(p) - kGuardBytes); }
};

// `bytes` of memory, 64-byte aligned (and between guards in a test build).
inline void* aligned_buffer(size_t bytes) {
    const size_t whole = (bytes + 63) / 64 * 64;
    char* p = static_cast<char*>(std::aligned_alloc(64, whole + 2 * kGuardBytes));
    if (!p) throw std::bad_alloc();
    if (kGuardBytes) {
        std::memset(p, kGuard, kGuardBytes);
        std::memset(p + kGuardBytes + bytes, kGuard, whole - bytes + kGuardBytes);
    }
    return p + kGuardBytes;
}

// Throws if anything wrote to the guards of `buffer` (an `aligned_buffer` of `bytes`).
inline void check_guards(const void* buffer, size_t bytes, const char* name) {
    if (!kGuardBytes || !buffer) return;
    const unsigned char* p = static_cast<const unsigned char*>(buffer);
    const size_t end = (bytes + 63) / 64 * 64 + kGuardBytes;
    for (size_t i = 1; i <= kGuardBytes; ++i)
        if (p[-static_cast<std::ptrdiff_t>(i)] != kGuard)
            throw std::runtime_error(std::string("dcpu: the ") + name + " buffer was written " +
                                     std::to_string(i) + " bytes before its start");
    for (size_t i = end; i-- > bytes;)
        if (p[i] != kGuard)
            throw std::runtime_error(std::string("dcpu: the ") + name + " buffer (" + std::to_string(bytes) +
                                     " bytes) was written " + std::to_string(i - bytes + 1) +
                                     " bytes past its end");
}

// A buffer a thread keeps for its next call, grown on demand (a fresh one
// would be paged in on every call): `reserve(bytes)` returns at least that.
struct KeptBuffer {
    std::unique_ptr<unsigned char, AlignedFree> buffer;
    size_t capacity = 0;
    unsigned char* reserve(size_t bytes) {
        if (capacity < bytes) {
            capacity = 0;  // a failed allocation below leaves no stale size
            buffer.reset();
            buffer.reset(static_cast<unsigned char*>(aligned_buffer(bytes)));
            capacity = bytes;
        }
        return buffer.get();
    }
};

template <class T>
void pack_b(const Problem<T>& P, int64_t k0, int kc, int64_t j0, int nc, unsigned char* out);

// Packed panels and the block accumulator, one set per thread, grown on demand.
//
// The packed B panel of one column of block tiles (every K block of it) is
// kept: a thread that runs the tiles of one column one after another packs B
// once for all of them. It is keyed by (launch generation, column); panels
// over kPanelCacheBytes, or that no other tile of the thread can read, are
// not kept.
template <class T>
struct Buffers {
    using Acc = typename T::Acc;
    static constexpr size_t kPanelCacheBytes = size_t(64) << 20;
    std::unique_ptr<unsigned char, AlignedFree> a_panel, b_panels;
    std::unique_ptr<Acc, AlignedFree> acc;
    size_t b_capacity = 0;              // bytes in b_panels
    uint64_t b_generation = 0;          // launch whose panels b_panels holds
    int64_t b_column = -1;              // their column start j0
    std::unique_ptr<bool[]> b_packed;   // which K blocks are packed
    size_t b_blocks = 0;

    static constexpr size_t acc_bytes = size_t(T::MC) * T::NC * sizeof(Acc);

    static void* make(size_t bytes) { return aligned_buffer(bytes); }
    static Buffers& local() {
        static thread_local Buffers buffers;
        if (!buffers.acc) {
            buffers.a_panel.reset(static_cast<unsigned char*>(make(T::a_panel_bytes)));
            buffers.acc.reset(static_cast<Acc*>(make(acc_bytes)));
        }
        return buffers;
    }
    // A test build's check that no write left its buffer (see kGuardBytes).
    void check_guards() const {
        dcpu::check_guards(a_panel.get(), T::a_panel_bytes, "packed A panel");
        dcpu::check_guards(acc.get(), acc_bytes, "block accumulator");
        dcpu::check_guards(b_panels.get(), b_capacity, "packed B panels");
    }
    // Whether the panel of the K block at kb of column j0 is packed already
    // (cached by an earlier tile of this launch), so its source need not be read.
    bool b_packed_already(const Problem<T>& P, int64_t j0, int64_t kb) const {
        const size_t block = size_t(kb / T::KC);
        return b_generation == P.generation && b_column == j0 && block < b_blocks && b_packed[block];
    }
    // The packed panel of K block `block` of column j0, packing it if needed.
    const unsigned char* b_panel(const Problem<T>& P, int64_t j0, int nc, int64_t kb, int kc) {
        const size_t panel = T::b_panel_bytes;
        const size_t blocks = size_t(P.k_iters());
        // Caching pays off only if this thread computes another tile of the
        // column; else a cached panel is written to memory and never read
        // again (on long-K problems that doubles B's memory traffic).
        const bool reused = P.reuse_b_panels && P.tiles_m() > 1;
        const bool cacheable = reused && blocks * panel <= kPanelCacheBytes;
        const size_t want = cacheable ? blocks : 1;
        if (b_capacity < want * panel) {
            b_panels.reset(static_cast<unsigned char*>(make(want * panel)));
            b_capacity = want * panel;
            b_generation = 0;
        }
        if (b_blocks < want) {
            b_packed.reset(new bool[want]);
            b_blocks = want;
            b_generation = 0;
        }
        if (!cacheable) {
            pack_b<T>(P, kb, kc, j0, nc, b_panels.get());
            return b_panels.get();
        }
        if (b_generation != P.generation || b_column != j0) {
            std::fill(b_packed.get(), b_packed.get() + b_blocks, false);
            b_generation = P.generation;
            b_column = j0;
        }
        const size_t block = size_t(kb / T::KC);
        unsigned char* dst = b_panels.get() + block * panel;
        if (!b_packed[block]) {
            pack_b<T>(P, kb, kc, j0, nc, dst);
            b_packed[block] = true;
        }
        return dst;
    }
};

// ---------------------------------------------------------------- packing ----
// A block (mc x kc) is packed as MR-row slivers and a B block (kc x nc) as
// NR-column slivers, each `groups` k groups deep (kc padded to the policy's
// KPAD): group g holds the KG consecutive k values g*KG.. of each of the
// sliver's R lines (rows of A, columns of B) side by side, zero past kc and
// past the block's edge: sliver[(g * R + line) * KG + q] = X[line][g * KG + q].
// (KG 1 is the classic k-major panel; a tile instruction's A has KG 32 or 64:
// a sliver's group is 64 bytes of each row, one tile row.) element(line, p)
// reads the source, already packed.
// Loops run k outer and lines inner: the stores are contiguous, and every
// layout reads contiguously either along the lines (row-major A is read as
// MR sequential streams, 2x faster than row by row).
template <int R, int KG, class PT, class Element>
inline void pack_sliver(PT* __restrict dst, int lines, int kc, int groups, PT zero, Element element) {
    const int whole = kc / KG;
    if (lines == R) {
        for (int g = 0; g < whole; ++g)
#pragma GCC unroll 16
            for (int l = 0; l < R; ++l)
#pragma GCC unroll 4
                for (int q = 0; q < KG; ++q) dst[(g * R + l) * KG + q] = element(l, g * KG + q);
    } else {
        for (int g = 0; g < whole; ++g)
            for (int l = 0; l < R; ++l)
                for (int q = 0; q < KG; ++q)
                    dst[(g * R + l) * KG + q] = l < lines ? element(l, g * KG + q) : zero;
    }
    for (int g = whole; g < groups; ++g)  // a partial group, and zero ones up to `groups`
        for (int l = 0; l < R; ++l)
            for (int q = 0; q < KG; ++q) {
                const int p = g * KG + q;
                dst[(g * R + l) * KG + q] = l < lines && p < kc ? element(l, p) : zero;
            }
}

// A float 8 x 8 block transposed in registers: rows r[0..8) become columns.
typedef float Float8 __attribute__((vector_size(32)));

inline void transpose8(Float8 (&r)[8]) {
    Float8 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {  // pairs of rows: interleave their elements
        t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < 8; i += 4)  // pairs of pairs: interleave their element pairs
        for (int h = 0; h < 2; ++h) {
            u[i + 2 * h] = __builtin_shufflevector(t[i + h], t[i + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
            u[i + 2 * h + 1] = __builtin_shufflevector(t[i + h], t[i + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        }
    for (int i = 0; i < 4; ++i) {  // halves: the low four rows' and the high four's
        r[i] = __builtin_shufflevector(u[i], u[i + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        r[i + 4] = __builtin_shufflevector(u[i], u[i + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    }
}

// A sliver of R whole lines that run along k in the source (value p of line l
// at src[l * ld + p]) packed as a classic k-major float panel (KG 1):
// sliver[p * R + l]. Packing it value by value reads R lines at once, one
// value from each, and stores single floats (4096 x 4096 column-major B took
// 40 ms on one EPYC core); 8 values of 8 lines at a time, transposed in
// registers, it took 10 (a sequential read of it, 6). Past kc, zeros up to
// `groups`. Returns false (nothing packed) where the panel is not float.
template <int R, int KG, class PT, class Codec, class Pack>
bool pack_sliver_along_k(PT* __restrict dst, const typename Codec::storage* src, int64_t ld, int kc,
                         int groups, Pack pack) {
    if constexpr (!std::is_same_v<PT, float> || KG != 1 || R % 8 != 0) {
        return false;
    } else {
        const int whole = kc / 8 * 8;
        for (int l0 = 0; l0 < R; l0 += 8) {  // 8 lines at a time: 8 sequential streams
            for (int p0 = 0; p0 < whole; p0 += 8) {
                Float8 r[8];
                for (int l = 0; l < 8; ++l)
                    for (int q = 0; q < 8; ++q) r[l][q] = pack(src[(l0 + l) * ld + p0 + q]);
                transpose8(r);
                for (int q = 0; q < 8; ++q) std::memcpy(dst + size_t(p0 + q) * R + l0, &r[q], sizeof(Float8));
            }
        }
        for (int p = whole; p < groups; ++p)
            for (int l = 0; l < R; ++l) dst[size_t(p) * R + l] = p < kc ? pack(src[l * ld + p]) : PT(0);
        return true;
    }
}

// The whole slivers of a block whose lines run along the source's rows
// (value p of line l of sliver s at src[p * ld + s * R + l]: row-major B,
// column-major A), their whole k groups packed by rows, kRowBlock of them at
// a time across the block, so each row's values are read in one pass; the
// rest of their groups after. Returns how many slivers that is (the caller
// packs a partial last one). Sliver by sliver, `pack_sliver` reads R values
// of each of kc rows, ld apart, per sliver: a 4096 x 4096 row-major B read
// 4 GB/s from memory that way on a 2-core EPYC, where reading by rows gets 20
// (16 x 4096 x 4096 fp32: 0.73 -> 0.96x OpenBLAS). kRowBlock rows per
// sliver keep each sliver's stores contiguous (one row per sliver was slower
// on 512-column blocks).
template <int R, int KG, class PT, class S, class Pack>
int pack_slivers_by_rows(unsigned char* out, size_t sliver_bytes, const S* src, int64_t ld, int lines, int kc,
                         int groups, PT zero, Pack pack) {
    constexpr int kRowBlock = 8;
    const int whole = kc / KG, slivers = lines / R;
    auto at = [&](int p, int s, int l) { return pack(src[p * ld + s * R + l]); };
    for (int g0 = 0; g0 < whole; g0 += kRowBlock)
        for (int s = 0; s < slivers; ++s) {
            PT* dst = reinterpret_cast<PT*>(out + s * sliver_bytes);
            for (int g = g0; g < std::min(whole, g0 + kRowBlock); ++g)
                for (int q = 0; q < KG; ++q)
                    for (int l = 0; l < R; ++l) dst[(g * R + l) * KG + q] = at(g * KG + q, s, l);
        }
    for (int s = 0; s < slivers; ++s) {  // a partial k group, and zero ones up to `groups`
        PT* dst = reinterpret_cast<PT*>(out + s * sliver_bytes);
        for (int g = whole; g < groups; ++g)
            for (int l = 0; l < R; ++l)
                for (int q = 0; q < KG; ++q) dst[(g * R + l) * KG + q] = g * KG + q < kc ? at(g * KG + q, s, l) : zero;
    }
    return slivers;
}

// A block (mc x kc) at (i0, k0) -> MR-row slivers. A policy with row offsets
// (dot_ops.hpp) appends each row's: row_offset_scale x the sum of its A values.
template <class T>
void pack_a(const Problem<T>& P, int64_t i0, int mc, int64_t k0, int kc, unsigned char* out) {
    using Dot = typename T::Dot;
    using PA = typename T::PA;
    using Codec = typename T::A;
    constexpr int MR = T::MR, KG = T::KGA;
    const PA zero = Dot::template pack_a<Codec>(typename Codec::storage{});
    const int64_t lda = P.lda;
    const int slivers = (mc + MR - 1) / MR, groups = int(T::a_groups(kc));
    auto pack = [](typename Codec::storage v) { return Dot::template pack_a<Codec>(v); };
    int first = 0;  // the slivers before it are packed by rows
    if constexpr (!T::a_row)
        first = pack_slivers_by_rows<MR, KG>(out, T::a_sliver_bytes(kc), P.a + k0 * lda + i0, lda, mc, kc, groups,
                                             zero, pack);
    for (int s = 0; s < slivers; ++s) {
        PA* dst = reinterpret_cast<PA*>(out + s * T::a_sliver_bytes(kc));
        const int rows = std::min(MR, mc - s * MR);
        if constexpr (T::a_row) {
            const auto* src = P.a + (i0 + s * MR) * lda + k0;
            if (rows < MR || !pack_sliver_along_k<MR, KG, PA, Codec>(dst, src, lda, kc, groups, pack))
                pack_sliver<MR, KG>(dst, rows, kc, groups, zero, [&](int i, int p) { return pack(src[i * lda + p]); });
        } else if (s >= first) {
            const auto* src = P.a + k0 * lda + i0 + s * MR;
            pack_sliver<MR, KG>(dst, rows, kc, groups, zero, [&](int i, int p) { return pack(src[p * lda + i]); });
        }
        if constexpr (Dot::row_offset_scale != 0) {
            int32_t offsets[MR];
            for (int i = 0; i < MR; ++i) {
                int32_t sum = 0;
                for (int e = 0; e < groups * KG; ++e) sum += dst[(e / KG * MR + i) * KG + e % KG];
                offsets[i] = Dot::row_offset_scale * sum;
            }
            std::memcpy(dst + size_t(groups) * MR * KG, offsets, sizeof offsets);
        }
    }
}

// B block (kc x nc) at (k0, j0) -> NR-column slivers.
template <class T>
void pack_b(const Problem<T>& P, int64_t k0, int kc, int64_t j0, int nc, unsigned char* out) {
    using Dot = typename T::Dot;
    using PB = typename T::PB;
    using Codec = typename T::B;
    constexpr int NR = T::NR, KG = T::KG;
    const PB zero = Dot::template pack_b<Codec>(typename Codec::storage{});
    const int64_t ldb = P.ldb;
    const int slivers = (nc + NR - 1) / NR, groups = int(T::groups(kc));
    auto pack = [](typename Codec::storage v) { return Dot::template pack_b<Codec>(v); };
    int first = 0;  // the slivers before it are packed by rows
    if constexpr (T::b_row)
        first = pack_slivers_by_rows<NR, KG>(out, T::b_sliver_bytes(kc), P.b + k0 * ldb + j0, ldb, nc, kc, groups,
                                             zero, pack);
    for (int s = first; s < slivers; ++s) {
        PB* dst = reinterpret_cast<PB*>(out + s * T::b_sliver_bytes(kc));
        const int cols = std::min(NR, nc - s * NR);
        if constexpr (T::b_row) {
            const auto* src = P.b + k0 * ldb + j0 + s * NR;
            pack_sliver<NR, KG>(dst, cols, kc, groups, zero, [&](int j, int p) { return pack(src[p * ldb + j]); });
        } else {
            const auto* src = P.b + (j0 + s * NR) * ldb + k0;
            if (cols < NR || !pack_sliver_along_k<NR, KG, PB, Codec>(dst, src, ldb, kc, groups, pack))
                pack_sliver<NR, KG>(dst, cols, kc, groups, zero, [&](int j, int p) { return pack(src[j * ldb + p]); });
        }
    }
}

// ------------------------------------------------------------- prefetch ----
// Packing reads its operands from memory, and a thread packs and computes in
// turn, so unhidden packing costs as much as the arithmetic on long-K
// problems (measured: 64x64x262144 fp32 spends half its time packing). While
// one K block computes, the micro-kernel requests the next block's source
// lines into L2, two lines of a row per k step, so the next packing reads from
// cache. (Two, not one: with rows packed whole, in-process A/B on the 2-core
// EPYC gave 0.90-0.92x OpenBLAS against 0.86-0.88 at 64x4096x4096 and
// 0.91-0.95 against 0.86-0.88 at 1024^3.)
class LinePrefetcher {
  public:
    static constexpr int64_t kLine = 64;
    static constexpr int kLinesPerStep = 2;
    LinePrefetcher() : region_(2) {}
    LinePrefetcher(Region first, Region second) : regions_{first, second} { skip_empty(); }
    inline bool active() const { return region_ != 2; }
    inline void next() {
        if (region_ == 2) return;
        const Region& r = regions_[region_];
        for (int i = 0; i < kLinesPerStep && offset_ < r.bytes; ++i, offset_ += kLine)
            __builtin_prefetch(r.base + row_ * r.stride + offset_, 0, 2);
        if (offset_ >= r.bytes) {
            offset_ = 0;
            if (++row_ == r.rows) row_ = 0, ++region_, skip_empty();
        }
    }

  private:
    void skip_empty() {
        while (region_ < 2 && (regions_[region_].rows == 0 || regions_[region_].bytes == 0)) ++region_;
    }
    Region regions_[2];
    int region_ = 0;  // 2: done (a default prefetcher requests nothing)
    int64_t row_ = 0, offset_ = 0;
};

// The source lines of block [r0, r0 + rows) x [c0, c0 + cols) of a matrix
// with leading dimension ld, stored row- or column-major.
template <class S>
Region block_region(const S* matrix, int64_t ld, bool row_major, int64_t r0, int64_t rows, int64_t c0,
                    int64_t cols) {
    constexpr int64_t sz = sizeof(S);
    if (row_major) return {reinterpret_cast<const char*>(matrix + r0 * ld + c0), rows, cols * sz, ld * sz};
    return {reinterpret_cast<const char*>(matrix + c0 * ld + r0), cols, rows * sz, ld * sz};
}

// Runs step(p) for p = 0 .. steps - 1 (a micro-kernel's k steps), requesting the
// prefetcher's next two lines with each while it has lines left (the first
// few percent of a block's steps), then in a loop of the arithmetic alone:
// the prefetcher's check in every step had cost the fp32 AVX2 loop two of
// its 26 instructions. On one core of the 2-core EPYC, 2048^3 went from 0.81
// to 0.83x OpenBLAS (medians of 6 alternating process pairs; two sets of 3
// pairs gave 0.77 -> 0.81 and 0.80 -> 0.83): small and within this VM's
// noise, but the loop is two instructions shorter and no set measured it slower.
template <class Step>
inline void k_steps(int steps, LinePrefetcher& prefetch, Step&& step) {
    int p = 0;
    for (; p < steps && prefetch.active(); ++p) {
        prefetch.next();
        step(p);
    }
    for (; p < steps; ++p) step(p);
}

// ----------------------------------------------------------- micro-kernel ----
// A matrix instruction's micro-kernel: (MR/2) x (NR/2) accumulators, each the
// 2x2 block [r0c0 r0c1 r1c0 r1c1] of one pair of rows and one of columns; a
// step multiplies each row pair's k group (2 x KG values, one register) with
// each column pair's.
template <class T>
inline void pair_micro_kernel(int kc, const unsigned char* __restrict a_sliver,
                              const unsigned char* __restrict b_sliver, typename T::Acc* __restrict c,
                              int64_t ldc, bool accumulate, LinePrefetcher& prefetch) {
    using Acc = typename T::Acc;
    constexpr int MP = T::MR / 2, NP = T::NR / 2, KG = T::KG;
    constexpr size_t half = 2 * sizeof(Acc);  // one row of a 2x2 block
    typedef Acc vec __attribute__((vector_size(4 * sizeof(Acc))));
    const auto* ap = reinterpret_cast<const typename T::PA*>(a_sliver);
    const auto* bp = reinterpret_cast<const typename T::PB*>(b_sliver);

    vec acc[MP][NP];
#pragma GCC unroll 16
    for (int r = 0; r < MP; ++r)
#pragma GCC unroll 16
        for (int q = 0; q < NP; ++q) {
            acc[r][q] = vec{};
            if (accumulate) {
                std::memcpy(&acc[r][q], c + 2 * r * ldc + 2 * q, half);
                std::memcpy(reinterpret_cast<char*>(&acc[r][q]) + half, c + (2 * r + 1) * ldc + 2 * q, half);
            }
        }
    k_steps(static_cast<int>(T::groups(kc)), prefetch, [&](int) __attribute__((always_inline)) {
        vec b[NP];
#pragma GCC unroll 16
        for (int q = 0; q < NP; ++q) std::memcpy(&b[q], bp + q * 2 * KG, sizeof(vec));
#pragma GCC unroll 16
        for (int r = 0; r < MP; ++r) {
            vec a;
            std::memcpy(&a, ap + r * 2 * KG, sizeof(vec));
#pragma GCC unroll 16
            for (int q = 0; q < NP; ++q) acc[r][q] = T::Dot::step(acc[r][q], a, b[q]);
        }
        ap += T::MR * KG;
        bp += T::NR * KG;
    });
#pragma GCC unroll 16
    for (int r = 0; r < MP; ++r)
#pragma GCC unroll 16
        for (int q = 0; q < NP; ++q) {
            std::memcpy(c + 2 * r * ldc + 2 * q, &acc[r][q], half);
            std::memcpy(c + (2 * r + 1) * ldc + 2 * q, reinterpret_cast<const char*>(&acc[r][q]) + half, half);
        }
}

// MR x NR accumulators in registers over the k groups of one A and one B
// sliver: each step multiplies one group of each row of A, broadcast, with
// the NR / lanes vectors of B's groups (T::Dot's instruction). Written with
// GCC vector extensions so -march picks the instructions where the policy
// does not name them.
template <class T>
inline void group_micro_kernel(int kc, const unsigned char* __restrict a_sliver,
                               const unsigned char* __restrict b_sliver, typename T::Acc* __restrict c,
                               int64_t ldc, bool accumulate, LinePrefetcher& prefetch) {
    using Acc = typename T::Acc;
    using Dot = typename T::Dot;
    constexpr int VL = T::vec_bytes / sizeof(Acc);
    constexpr int NV = T::NR / VL;
    constexpr int MR = T::MR, KG = T::KG;
    typedef Acc vec __attribute__((vector_size(T::vec_bytes)));
    const auto* ap = reinterpret_cast<const typename T::PA*>(a_sliver);
    const auto* bp = reinterpret_cast<const typename T::PB*>(b_sliver);

    vec acc[MR][NV];
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) {
            if (accumulate)
                std::memcpy(&acc[i][v], c + i * ldc + v * VL, sizeof(vec));
            else
                acc[i][v] = vec{};
        }
    k_steps(static_cast<int>(T::groups(kc)), prefetch, [&](int) __attribute__((always_inline)) {
        vec b[NV];
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) std::memcpy(&b[v], bp + v * VL * KG, sizeof(vec));
#pragma GCC unroll 32
        for (int i = 0; i < MR; ++i) {
            const auto a = Dot::template group<vec>(ap + i * KG);
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) acc[i][v] = Dot::step(acc[i][v], a, b[v]);
        }
        ap += MR * KG;
        bp += T::NR * KG;
    });
    if constexpr (Dot::row_offset_scale != 0) {
        // The rows' offsets follow the sliver's groups; added modulo 2^32.
        typedef uint32_t uvec __attribute__((vector_size(T::vec_bytes)));
        int32_t offsets[MR];
        std::memcpy(offsets, ap, sizeof offsets);
#pragma GCC unroll 32
        for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) acc[i][v] = (vec)((uvec)acc[i][v] + uint32_t(offsets[i]));
    }
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) std::memcpy(c + i * ldc + v * VL, &acc[i][v], sizeof(vec));
}

// A tile instruction's micro-kernel (AMX): a 32x32 block in 2x2 tiles of
// 16x16 accumulators; per chunk of KPAD k values, A's 32 rows (64 bytes of k
// each, one tile row) times B's 32 columns (KPAD / KG rows of column groups,
// 64 bytes per 16 columns). The policy holds the tiles (dot_ops.hpp).
template <class T>
inline void tile_micro_kernel(int kc, const unsigned char* __restrict a_sliver,
                              const unsigned char* __restrict b_sliver, typename T::Acc* __restrict c,
                              int64_t ldc, bool accumulate, LinePrefetcher& prefetch) {
    using D = typename T::Dot;
    constexpr size_t a_row = T::KGA * sizeof(typename T::PA);          // 64 bytes
    constexpr size_t b_row = T::NR * T::KG * sizeof(typename T::PB);   // 128 bytes
    const size_t c_stride = size_t(ldc) * sizeof(typename T::Acc);
    if (accumulate)
        D::load_acc(c, c_stride);
    else
        D::zero_acc();
    k_steps(static_cast<int>(T::padded(kc) / T::KPAD), prefetch, [&](int x) __attribute__((always_inline)) {
        D::multiply(a_sliver + x * T::MR * a_row, a_row, b_sliver + x * (T::KPAD / T::KG) * b_row, b_row);
    });
    D::store_acc(c, c_stride);
}

template <class T>
inline void micro_kernel(int kc, const unsigned char* a_sliver, const unsigned char* b_sliver,
                         typename T::Acc* c, int64_t ldc, bool accumulate, LinePrefetcher& prefetch) {
    if constexpr (T::tiles)
        tile_micro_kernel<T>(kc, a_sliver, b_sliver, c, ldc, accumulate, prefetch);
    else if constexpr (T::pairs)
        pair_micro_kernel<T>(kc, a_sliver, b_sliver, c, ldc, accumulate, prefetch);
    else
        group_micro_kernel<T>(kc, a_sliver, b_sliver, c, ldc, accumulate, prefetch);
}

// ------------------------------------------------------- block operations ----
template <bool Tiles, class D>
struct TileScope {};
template <class D>
struct TileScope<true, D> {
    TileScope() { D::configure(); }
    ~TileScope() { D::release(); }
    TileScope(const TileScope&) = delete;
    TileScope& operator=(const TileScope&) = delete;
};

// acc[MC x NC] (+)= A[i0:i0+mc, k0:k1] @ B[k0:k1, j0:j0+nc]; `accumulate` adds
// to what acc holds instead of starting from zero. Not inlined (nor is
// store_tile): a kernel calls it from two schedules (tile by tile and the
// row runs), and two inlined copies of its micro-kernel loops made every
// kernel's build 1.2 s (a third) longer, for nothing at run time: one call
// computes a whole block.
template <class T>
__attribute__((noinline)) void accumulate_tile(const Problem<T>& P, int64_t i0, int mc, int64_t j0, int nc, int64_t k0,
                     int64_t k1, typename T::Acc* acc, bool accumulate) {
    Buffers<T>& buf = Buffers<T>::local();
    const int m_slivers = (mc + T::MR - 1) / T::MR;
    const int n_slivers = (nc + T::NR - 1) / T::NR;
    // A tile instruction's thread loads its tile configuration (another
    // library may have loaded its own since) and releases the tiles after.
    TileScope<T::tiles, typename T::Dot> tile_scope;
    for (int64_t kb = k0; kb < k1; kb += T::KC) {
        const int kc = static_cast<int>(std::min<int64_t>(T::KC, k1 - kb));
        const unsigned char* a_panel = buf.a_panel.get();
        if (P.packed_a)
            a_panel = P.packed_a + size_t(i0 / T::MC * P.k_iters() + kb / T::KC) * T::a_panel_bytes;
        else
            pack_a<T>(P, i0, mc, kb, kc, buf.a_panel.get());
        const unsigned char* b_panel = buf.b_panel(P, j0, nc, kb, kc);  // kb: a KC multiple
        const bool add = accumulate || kb > k0;
        LinePrefetcher prefetch(P.after_a, P.after_b);
        if (const int64_t next = kb + T::KC; next < k1) {
            const int next_kc = static_cast<int>(std::min<int64_t>(T::KC, k1 - next));
            prefetch = LinePrefetcher(P.packed_a ? Region{} : block_region(P.a, P.lda, T::a_row, i0, mc, next, next_kc),
                                      buf.b_packed_already(P, j0, next)
                                          ? Region{}
                                          : block_region(P.b, P.ldb, T::b_row, next, next_kc, j0, nc));
        }
        for (int sn = 0; sn < n_slivers; ++sn)
            for (int sm = 0; sm < m_slivers; ++sm)
                micro_kernel<T>(kc, a_panel + sm * T::a_sliver_bytes(kc),
                                b_panel + sn * T::b_sliver_bytes(kc),
                                acc + size_t(sm) * T::MR * T::NC + sn * T::NR, T::NC, add,
                                prefetch);
    }
    if constexpr (kGuardBytes > 0) buf.check_guards();
}

// The epilogue's arithmetic type: float for float kernels (so it
// vectorizes), double for integer ones (exact for int32 accumulators).
template <class T>
using Scalar = std::conditional_t<std::is_same_v<typename T::Acc, float>, float, double>;

// alpha * acc or beta * C, rounded to S as written. An FMA ISA would contract
// alpha * acc + beta * C into one fused operation (one rounding), and an int32
// output would then differ by one at near-ties (alpha 1.1, acc 245, C -67:
// 203, not 202) from the documented rule, which rounds each product and the
// sum to double as numpy's reference does, and from ISAs without FMA. Float
// outputs keep the contraction (their loop vectorizes; tolerances cover it).
template <class S>
static inline S product(S x, S y) {
    S p = x * y;
    if constexpr (std::is_same_v<S, double>) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
        __asm__("" : "+x"(p));  // opaque to the optimizer: no fused multiply-add
#elif defined(__GNUC__) && defined(__aarch64__)
        __asm__("" : "+w"(p));
#else
        volatile S v = p;
        p = v;
#endif
    }
    return p;
}

// C[i0:i0+mc, j0:j0+nc] = epilogue(alpha * acc + beta * C); C is not read
// when beta == 0. The bias is added in S after alpha/beta, then the
// activation, then the conversion to the output dtype (CUTLASS's order).
template <class T, class Epi = PlainEpilogue>
__attribute__((noinline)) void store_tile(const Problem<T>& P, int64_t i0, int mc, int64_t j0, int nc,
                const typename T::Acc* acc) {
    using Out = typename T::C;
    using S = Scalar<T>;
    const S alpha = static_cast<S>(P.alpha), beta = static_cast<S>(P.beta);
    if constexpr (Epi::plain) {
        for (int i = 0; i < mc; ++i) {
            auto* __restrict crow = P.c + (i0 + i) * P.ldc + j0;
            const auto* __restrict arow = acc + size_t(i) * T::NC;
            if (P.beta == 0.0) {
                for (int j = 0; j < nc; ++j) crow[j] = Out::store(alpha * S(arow[j]));
            } else {
                for (int j = 0; j < nc; ++j)
                    crow[j] = Out::store(product(alpha, S(arow[j])) +
                                         product(beta, S(Out::load(crow[j]))));
            }
        }
    } else {
        // Every loop below runs along a contiguous row, so it vectorizes: a
        // column bias (of any stride) is gathered once per tile.
        using Stored = typename Out::storage;
        alignas(64) S col_bias[Epi::bias == Bias::col ? T::NC : 1];
        if constexpr (Epi::bias == Bias::col)
            for (int j = 0; j < nc; ++j) col_bias[j] = S(Out::load(P.template extra_at<Stored>(0, 0, j0 + j)));
        for (int i = 0; i < mc; ++i) {
            auto* __restrict crow = P.c + (i0 + i) * P.ldc + j0;
            const auto* __restrict arow = acc + size_t(i) * T::NC;
            alignas(64) S v[T::NC];
            if (P.beta == 0.0) {
                for (int j = 0; j < nc; ++j) v[j] = product(alpha, S(arow[j]));
            } else {
                for (int j = 0; j < nc; ++j)
                    v[j] = product(alpha, S(arow[j])) + product(beta, S(Out::load(crow[j])));
            }
            if constexpr (Epi::bias == Bias::row) {
                const S row_bias = S(Out::load(P.template extra_at<Stored>(0, i0 + i, 0)));
                for (int j = 0; j < nc; ++j) v[j] = v[j] + row_bias;
            }
            if constexpr (Epi::bias == Bias::col)
                for (int j = 0; j < nc; ++j) v[j] = v[j] + col_bias[j];
            activate_row<Epi::activation, T::vec_bytes>(v, nc);
            for (int j = 0; j < nc; ++j) crow[j] = Out::store(v[j]);
        }
    }
}

struct TileCoord {
    int64_t i0, j0;
    int mc, nc;
};

template <class T>
TileCoord tile_coord(const Problem<T>& P, int64_t tile) {
    // Column by column: consecutive tiles share their packed B panel.
    const int64_t ti = tile % P.tiles_m(), tj = tile / P.tiles_m();
    TileCoord t{ti * T::MC, tj * T::NC, 0, 0};
    t.mc = static_cast<int>(std::min<int64_t>(T::MC, P.m - t.i0));
    t.nc = static_cast<int>(std::min<int64_t>(T::NC, P.n - t.j0));
    return t;
}

// A tile's share of the work (`parallel_tiles`' cost): its output area.
template <class T>
double tile_area(const Problem<T>& P, int64_t tile) {
    const TileCoord t = tile_coord(P, tile);
    return double(t.mc) * t.nc;
}

// Have P's last K block prefetch the first K block of tile `tile` of `next`
// (the tile this thread computes after P's): small matrices have one K block,
// so nothing else hides the memory latency of packing the next one.
template <class T>
void prefetch_next_tile(Problem<T>& P, const Problem<T>& next, int64_t tile) {
    const TileCoord t = tile_coord(next, tile);
    const int64_t kc = std::min<int64_t>(T::KC, next.k);
    P.after_a = block_region(next.a, next.lda, T::a_row, t.i0, t.mc, 0, kc);
    P.after_b = block_region(next.b, next.ldb, T::b_row, 0, kc, t.j0, t.nc);
}

// ------------------------------------------------------------- vectors ----
// A product with one output row or column (a vector times a matrix, a matrix
// times a vector) reads each element of the matrix once for one multiply:
// it is bound by memory. Packing would copy the matrix, and the micro-kernel
// would pad the vector's side to a whole micro-tile (12 to 48 lanes of work
// for one: 4096 x 4096 times a vector took 14.8 ms against OpenBLAS's 5.9), so its
// tiles take the operands as they are: a dot product per output element where
// the matrix runs along K, else scaled sums of the matrix's rows or columns
// (contiguous along the output), in the compute type; then the epilogue.
template <class T>
bool one_vector(const Problem<T>& P) {
    return P.m == 1 || P.n == 1;
}

// out[0, count) = the products of one output row or column: `matrix` holds
// `count` lines of K elements, element (line, k) at line * ld + k where it
// runs along K (`along_k`), else at k * ld + line (the operands' unit inner
// stride leaves no other case); `vector` holds K, element k at k * v_stride.
template <class M, class V, class Acc>
void vector_products(const typename M::storage* matrix, int64_t ld, bool along_k,
                     const typename V::storage* vector, int64_t v_stride, int64_t k, int64_t count,
                     Acc* __restrict out) {
    if (along_k) {
        // One dot product a line, four lines at a time: four independent sums
        // (one sum's chain of multiply-adds waits on each one's latency: 4096 x 1
        // x 4096 fp32 ran at 0.70-0.78x OpenBLAS on a 2-core AVX2 EPYC, 0.95-1.09x
        // this way), and each element of the vector loaded once for four lines.
        int64_t line = 0;
        for (; line + 4 <= count; line += 4) {
            const auto* __restrict x0 = matrix + line * ld;
            const auto* __restrict x1 = x0 + ld;
            const auto* __restrict x2 = x1 + ld;
            const auto* __restrict x3 = x2 + ld;
            Acc s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
            for (int64_t i = 0; i < k; ++i) {
                const Acc v = V::load(vector[i * v_stride]);
                s0 += M::load(x0[i]) * v;
                s1 += M::load(x1[i]) * v;
                s2 += M::load(x2[i]) * v;
                s3 += M::load(x3[i]) * v;
            }
            out[line] = s0, out[line + 1] = s1, out[line + 2] = s2, out[line + 3] = s3;
        }
        for (; line < count; ++line) {
            const auto* __restrict x = matrix + line * ld;
            Acc sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int64_t i = 0; i < k; ++i) sum += M::load(x[i]) * V::load(vector[i * v_stride]);
            out[line] = sum;
        }
        return;
    }
    for (int64_t line = 0; line < count; ++line) out[line] = 0;  // else out += vector[k] * line k of the matrix
    int64_t i = 0;
    for (; i + 4 <= k; i += 4) {  // four of K's lines at a time: four streams in flight, out stored a quarter as often
        const Acc s0 = V::load(vector[i * v_stride]), s1 = V::load(vector[(i + 1) * v_stride]),
                  s2 = V::load(vector[(i + 2) * v_stride]), s3 = V::load(vector[(i + 3) * v_stride]);
        const auto* __restrict x0 = matrix + i * ld;
        const auto* __restrict x1 = x0 + ld;
        const auto* __restrict x2 = x1 + ld;
        const auto* __restrict x3 = x2 + ld;
#pragma omp simd
        for (int64_t line = 0; line < count; ++line)
            out[line] += M::load(x0[line]) * s0 + M::load(x1[line]) * s1 + M::load(x2[line]) * s2 +
                         M::load(x3[line]) * s3;
    }
    for (; i < k; ++i) {
        const Acc scale = V::load(vector[i * v_stride]);
        const auto* __restrict x = matrix + i * ld;
#pragma omp simd
        for (int64_t line = 0; line < count; ++line) out[line] += M::load(x[line]) * scale;
    }
}

// Whether a `one_vector` problem's matrix (A for a single column, B for a
// single row) runs along K.
template <class T>
bool vector_along_k(const Problem<T>& P) {
    return P.n == 1 ? T::a_row : !T::b_row;
}

// `vector_products` of output lines [l0, l0 + count) of a `one_vector`
// problem: rows of its single column, or columns of its single row.
template <class T>
void vector_lines(const Problem<T>& P, int64_t l0, int64_t count, typename T::Acc* out) {
    const bool along_k = vector_along_k(P);
    if (P.n == 1)  // A's rows against B's column
        vector_products<typename T::A, typename T::B>(P.a + (along_k ? l0 * P.lda : l0), P.lda, along_k, P.b,
                                                      T::b_row ? P.ldb : 1, P.k, count, out);
    else  // B's columns against A's row
        vector_products<typename T::B, typename T::A>(P.b + (along_k ? l0 * P.ldb : l0), P.ldb, along_k, P.a,
                                                      T::a_row ? 1 : P.lda, P.k, count, out);
}

// The output lines `store_tile` stores at a time: a block tile's rows of the
// single column, or its columns of the single row.
template <class T>
int vector_unit(const Problem<T>& P) {
    return P.n == 1 ? T::MC : T::NC;
}

// Output lines [l0, l0 + count) of a `one_vector` problem, computed in `sums`,
// stored by `store_tile` a block tile at a time.
template <class T, class Epi>
void store_vector_lines(const Problem<T>& P, int64_t l0, int64_t count, const typename T::Acc* sums) {
    auto* acc = Buffers<T>::local().acc.get();
    const int unit = vector_unit(P);
    for (int64_t p = 0; p < count; p += unit) {
        const int piece = static_cast<int>(std::min<int64_t>(unit, count - p));
        if (P.n == 1) {
            for (int i = 0; i < piece; ++i) acc[size_t(i) * T::NC] = sums[p + i];
            store_tile<T, Epi>(P, l0 + p, piece, 0, 1, acc);
        } else {
            std::copy(sums + p, sums + p + piece, acc);
            store_tile<T, Epi>(P, 0, 1, l0 + p, piece, acc);
        }
    }
}

// One block tile of a `one_vector` problem (the tile schedules of the
// batched, grouped and stream-K variants).
template <class T, class Epi = PlainEpilogue>
void compute_vector_tile(const Problem<T>& P, int64_t tile) {
    const TileCoord t = tile_coord(P, tile);
    alignas(64) typename T::Acc sums[T::MC > T::NC ? T::MC : T::NC];
    const int64_t l0 = P.n == 1 ? t.i0 : t.j0, count = P.n == 1 ? t.mc : t.nc;
    vector_lines(P, l0, count, sums);
    store_vector_lines<T, Epi>(P, l0, count, sums);
}

// A whole `one_vector` problem on `threads` threads, in runs of output lines
// (whole block tiles' worth), one a thread. Where the matrix runs along K any
// run streams; where it runs along the output, a run reads each of its K
// lines a run's length at a time, so runs keep at least kVectorRun lines
// (tiles of 48 rows read 192-byte pieces 16 KB apart and ran at half of
// OpenBLAS's speed), on fewer threads where the output is short.
constexpr int64_t kVectorRun = 256;

template <class T, class Epi = PlainEpilogue>
void vector_product(const Problem<T>& P, int threads) {
    const int64_t lines = P.n == 1 ? P.m : P.n;
    const int unit = vector_unit(P);
    int64_t run = (lines + threads - 1) / threads;
    if (!vector_along_k(P)) run = std::max(run, std::min(kVectorRun, lines));
    run = (run + unit - 1) / unit * unit;
    parallel_tiles(threads, (lines + run - 1) / run, [&](int64_t r) {
        const int64_t l0 = r * run, count = std::min(run, lines - l0);
        std::vector<typename T::Acc> sums(static_cast<size_t>(count));
        vector_lines(P, l0, count, sums.data());
        store_vector_lines<T, Epi>(P, l0, count, sums.data());
    });
}

// One whole output block: all of K, then the epilogue.
template <class T, class Epi = PlainEpilogue>
void compute_tile(const Problem<T>& P, int64_t tile) {
    if (one_vector(P)) return compute_vector_tile<T, Epi>(P, tile);
    const TileCoord t = tile_coord(P, tile);
    auto* acc = Buffers<T>::local().acc.get();
    if (P.k == 0)
        std::fill(acc, acc + size_t(T::MC) * T::NC, typename T::Acc(0));
    accumulate_tile<T>(P, t.i0, t.mc, t.j0, t.nc, 0, P.k, acc, false);
    store_tile<T, Epi>(P, t.i0, t.mc, t.j0, t.nc, acc);
}

// A problem of one tile row (M <= MC: a skinny M) reads each B block once.
// A thread that computes its column tiles one after another, each over all of
// K, reads B as pieces of NC columns of KC rows, ldb apart; K blocks
// outermost, it reads K block kb of all its tiles in turn, each row's run of
// columns in one pass (a 2-core EPYC streamed 7-9 GB/s the first way, 13-23
// the second), and keeps one accumulator per tile. So where a thread's tiles
// fit kRowRunAccBytes of accumulators two or more at a time, its run of column
// tiles goes in groups that do: K block by K block over the group's tiles, the
// next B block prefetched during each, the epilogue after the last
// (16 x 4096 x 4096 fp32: 0.95 -> 1.0x OpenBLAS; 4 x 4096 x 4096 0.96 -> 1.3-1.5x).
constexpr size_t kRowRunAccBytes = size_t(256) << 10;

// The accumulator rows of one tile of a row run: M in whole micro-tiles.
template <class T>
size_t row_run_rows(const Problem<T>& P) {
    return size_t((P.m + T::MR - 1) / T::MR * T::MR);
}

// The column tiles whose accumulators one group of a row run holds.
template <class T>
int64_t row_run_group(const Problem<T>& P) {
    return int64_t(kRowRunAccBytes / (row_run_rows(P) * T::NC * sizeof(typename T::Acc)));
}

template <class T>
bool runs_k_outermost(const Problem<T>& P, int threads) {
    const int64_t per_thread = (P.tiles_n() + threads - 1) / threads;
    return P.tiles_m() == 1 && P.batch == 1 && P.k_iters() > 1 && per_thread > 1 && row_run_group(P) > 1;
}

// Column tiles [t0, t1) of a one-tile-row problem, K blocks outermost.
template <class T, class Epi = PlainEpilogue>
void compute_row_run(const Problem<T>& P, int64_t t0, int64_t t1) {
    using Acc = typename T::Acc;
    const int mc = static_cast<int>(P.m);
    const size_t tile_acc = row_run_rows(P) * T::NC;  // rows NC apart
    const int64_t group = std::min(row_run_group(P), t1 - t0);
    static thread_local KeptBuffer kept_buffer;  // at most kRowRunAccBytes
    Acc* const kept = reinterpret_cast<Acc*>(kept_buffer.reserve(tile_acc * size_t(group) * sizeof(Acc)));
    Problem<T> Q = P;  // P with the next B block to prefetch
    for (int64_t g0 = t0; g0 < t1; g0 += group) {
        const int64_t g1 = std::min(t1, g0 + group);
        for (int64_t kb = 0; kb < P.k; kb += T::KC) {
            const int64_t k1 = std::min<int64_t>(P.k, kb + T::KC);
            for (int64_t t = g0; t < g1; ++t) {
                // Next: the group's next tile, else its first in the next K
                // block, else the next group's first; nothing after the last.
                const bool next_tile = t + 1 < g1, next_block = k1 < P.k;
                Q.after_b = Region{};
                if (next_tile || next_block || g1 < t1) {
                    const TileCoord n = tile_coord(P, next_tile ? t + 1 : next_block ? g0 : g1);
                    const int64_t nk0 = next_tile ? kb : next_block ? k1 : 0;
                    const int64_t nkc = std::min<int64_t>(T::KC, P.k - nk0);
                    Q.after_b = block_region(P.b, P.ldb, T::b_row, nk0, nkc, n.j0, n.nc);
                }
                const TileCoord c = tile_coord(P, t);
                accumulate_tile<T>(Q, 0, mc, c.j0, c.nc, kb, k1, kept + tile_acc * size_t(t - g0), kb > 0);
            }
        }
        for (int64_t t = g0; t < g1; ++t) {
            const TileCoord c = tile_coord(P, t);
            store_tile<T, Epi>(P, 0, mc, c.j0, c.nc, kept + tile_acc * size_t(t - g0));
        }
    }
}

// All of a `runs_k_outermost` problem on `threads` threads: one run of
// consecutive column tiles each.
template <class T, class Epi = PlainEpilogue>
void compute_row_runs(const Problem<T>& P, int threads) {
    const int64_t tiles = P.tiles(), run = (tiles + threads - 1) / threads;
    parallel_tiles(threads, (tiles + run - 1) / run, [&](int64_t r) {
        compute_row_run<T, Epi>(P, r * run, std::min(tiles, (r + 1) * run));
    });
}

// All of a problem's A packed once, before its tiles run, where each tile
// row is read by several column tiles: each of those would pack the same A
// blocks again (257x1031x2049 fp32 on 96x128 tiles packed A 9 times, and
// ran at 0.83x OpenBLAS). Kept to kMaxBytes, in a buffer of the calling
// thread's that is kept for its next call (a fresh one would be paged in on
// every call: at most kMaxBytes per calling thread and kernel library);
// past that, tiles pack their own blocks, as without it.
template <class T>
class SharedPackedA {
  public:
    static constexpr size_t kMaxBytes = size_t(4) << 20;

    // Packs P's A on `threads` threads and points P at it, if it pays.
    void pack(Problem<T>& P, int threads) {
        const int64_t rows = P.tiles_m(), blocks = P.k_iters();
        const size_t bytes = size_t(rows * blocks) * T::a_panel_bytes;
        if (P.tiles_n() < 3 || bytes > kMaxBytes) return;
        unsigned char* base = kept_buffer().reserve(bytes);
        parallel_tiles(threads, rows * blocks, [&](int64_t t) {
            const int64_t i0 = t / blocks * T::MC, kb = t % blocks * T::KC;
            pack_a<T>(P, i0, static_cast<int>(std::min<int64_t>(T::MC, P.m - i0)), kb,
                      static_cast<int>(std::min<int64_t>(T::KC, P.k - kb)), base + size_t(t) * T::a_panel_bytes);
        });
        P.packed_a = base;
    }
    // A test build's check that no packing wrote past the buffer.
    void check_guards() const {
        const KeptBuffer& kept = kept_buffer();
        dcpu::check_guards(kept.buffer.get(), kept.capacity, "shared packed A");
    }

  private:
    static KeptBuffer& kept_buffer() {
        static thread_local KeptBuffer kept;
        return kept;
    }
};


// ------------------------------------------------------ shared B panels ----
// Where every thread has rows enough, a problem runs as GotoBLAS and
// OpenBLAS run it: K blocks outermost over the whole output, one B panel per
// K block (kShareBytes of it at a time, all of N where that fits) packed once
// by all the threads together and shared, each thread's own run of output
// rows in A blocks of `panel_rows` against all of it, the micro-kernels adding into C
// itself. Against the tile schedule (each thread its own columns, every K
// block of one block tile into the tile's accumulator) this packs A once, not
// once per column tile, keeps one B panel in the shared L3 for both threads
// rather than one per thread, and reads each B sliver from L3 once per A
// block; C is what streams, each micro-tile prefetched during the one before.
// On the 2-core EPYC (Zen 3, AVX2, 2 threads, in-process A/B against the
// tiles, each beside numpy in alternating rounds; this VM's ratios move by
// 0.05-0.1 between runs): 2048^3 0.80-0.85 -> 0.88-1.06x OpenBLAS (one run
// of eight 0.90 -> 0.82), 1024 x 4096 x 2048 0.92 -> 0.99, 4096 x 4096 x 1024
// 0.90-0.97 -> 0.85-0.99, 1024^3 alike; with 256 or fewer rows a thread it
// was as often slower (512 x 4096 x 1024 0.90 -> 0.78, 300 x 4096 x 1024
// 0.94-1.02 -> 0.73-0.94; 257 x 1031 x 2049 0.90 -> 1.02), hence
// kPanelRowsPerThread.
constexpr size_t kShareBytes = size_t(2) << 20;

// Rows of the A blocks a thread packs in turn: up to kPanelRows whatever the
// tile's MC (each B sliver from L3 serves kPanelRows / MR micro-kernels).
// Measured at 2048^3 (2 threads, A/B as above): blocks of 24 rows 0.91x
// OpenBLAS, 48 0.94-1.06, 72 0.88, 96 0.88-0.93, 192 0.72-0.84: a larger A
// block no longer stays in L2 beside the C lines and the B sliver it meets.
constexpr int kPanelRows = 48;

// Output rows each thread must have for `compute_shared_panels`.
constexpr int64_t kPanelRowsPerThread = 512;

template <class T>
constexpr int panel_rows() {
    return std::min(T::MC, std::max(T::MR, kPanelRows / T::MR * T::MR));
}

// Whether a kernel's C can hold its sums between K blocks: a float output
// that is the accumulator's type, and micro-kernels that take a C stride
// (not AMX's tiles).
template <class T>
constexpr bool kSumsInC =
    std::is_same_v<typename T::C::storage, float> && std::is_same_v<typename T::Acc, float> && !T::tiles;

// Whether `compute_shared_panels` runs P: a kernel with `kSumsInC`, nothing
// of C read (beta 0), one GEMM with A not packed ahead, two K blocks or
// more, and kPanelRowsPerThread rows a thread.
template <class T>
bool runs_shared_panels(const Problem<T>& P, int threads) {
    return kSumsInC<T> && P.beta == 0.0 && P.batch == 1 && !P.packed_a && P.k_iters() > 1 &&
           P.m >= kPanelRowsPerThread * std::max(threads, 1);
}

// Every micro-tile of A block [i0, i0 + mc) against B panel `panel` (slivers
// of columns [j0, j0 + nb), K block kb of depth kc), added into C (written
// where `add` is false). A micro-tile past C's edge goes through `edge`.
template <class T>
void panel_block(const Problem<T>& P, const unsigned char* a_panel, const unsigned char* panel, int64_t i0,
                 int mc, int64_t j0, int64_t nb, int kc, bool add, typename T::Acc* edge) {
    using Acc = typename T::Acc;
    constexpr int MR = T::MR, NR = T::NR;
    const int m_slivers = (mc + MR - 1) / MR;
    const int64_t n_slivers = (nb + NR - 1) / NR;
    LinePrefetcher none;
    for (int64_t sn = 0; sn < n_slivers; ++sn) {
        const int64_t j = j0 + sn * NR;
        const int cols = static_cast<int>(std::min<int64_t>(NR, P.n - j));
        for (int sm = 0; sm < m_slivers; ++sm) {
            const int64_t i = i0 + sm * MR;
            const int rows = std::min(MR, mc - sm * MR);
            // The next micro-tile's C lines, requested now: C comes from memory.
            const bool down = sm + 1 < m_slivers;
            const int64_t ni = down ? i + MR : i0, nj = down ? j : j + NR;
            if (nj < j0 + nb)
                for (int x = 0; x < MR && ni + x < i0 + mc; ++x) {
                    __builtin_prefetch(P.c + (ni + x) * P.ldc + nj, 1, 3);
                    __builtin_prefetch(P.c + (ni + x) * P.ldc + std::min(nj + NR, P.n) - 1, 1, 3);
                }
            const unsigned char* a = a_panel + sm * T::a_sliver_bytes(kc);
            const unsigned char* b = panel + sn * T::b_sliver_bytes(kc);
            Acc* c = P.c + i * P.ldc + j;
            if (rows == MR && cols == NR) {
                micro_kernel<T>(kc, a, b, c, P.ldc, add, none);
                continue;
            }
            if (add)
                for (int x = 0; x < rows; ++x) std::copy(c + x * P.ldc, c + x * P.ldc + cols, edge + x * NR);
            micro_kernel<T>(kc, a, b, edge, NR, add, none);
            for (int x = 0; x < rows; ++x) std::copy(edge + x * NR, edge + x * NR + cols, c + x * P.ldc);
        }
    }
}

// The epilogue of rows [r0, r1) x columns [j0, j0 + nb) of C, which holds
// the sums: a block tile at a time through the thread's accumulator and
// `store_tile`, run on an A block's rows right after their last K block
// (as a pass over all of C after the last panel, the bias-only epilogue at
// 2048^3 cost 9 ms of 158). A plain epilogue with alpha 1 has nothing to do.
template <class T, class Epi>
void panel_epilogue(const Problem<T>& P, int64_t r0, int64_t r1, int64_t j0, int64_t nb) {
    if (Epi::plain && P.alpha == 1.0) return;
    auto* acc = Buffers<T>::local().acc.get();
    for (int64_t i0 = r0; i0 < r1; i0 += T::MC) {
        const int mc = static_cast<int>(std::min<int64_t>(T::MC, r1 - i0));
        for (int64_t jc = j0; jc < j0 + nb; jc += T::NC) {
            const int nc = static_cast<int>(std::min<int64_t>(T::NC, j0 + nb - jc));
            for (int x = 0; x < mc; ++x) {
                const auto* row = P.c + (i0 + x) * P.ldc + jc;
                std::copy(row, row + nc, acc + size_t(x) * T::NC);
            }
            store_tile<T, Epi>(P, i0, mc, jc, nc, acc);
        }
    }
}

// All of a `runs_shared_panels` problem on `threads` threads: per column
// chunk and K block, every thread packs its share of the panel, and after a
// barrier computes its rows against all of it. (Packing the next panel in
// pieces between A blocks, two panels alternating, was slower at 2048^3:
// 0.82 against 0.90x OpenBLAS on tiles in the same run; the packing's reads
// then evict the A block and C lines the micro-kernels are using.)
template <class T, class Epi>
void shared_panels(const Problem<T>& P, int threads) {
    using Acc = typename T::Acc;
    constexpr int MR = T::MR, NR = T::NR, KC = T::KC;
    const size_t sliver = T::b_sliver_bytes(KC);
    const int64_t width = std::min<int64_t>((P.n + NR - 1) / NR, std::max<size_t>(1, kShareBytes / sliver)) * NR;
    static thread_local KeptBuffer kept;  // the calling thread's: two callers never share a panel
    unsigned char* const panel = kept.reserve(size_t(width / NR) * sliver);
    const int64_t share = ((P.m + threads - 1) / threads + MR - 1) / MR * MR;  // rows a thread, whole micro-tiles
    RegionErrors errors;
    const WorkerPlacement placement;
#pragma omp parallel num_threads(threads) proc_bind(close)
    {
        const int team = omp_get_num_threads(), r = omp_get_thread_num();
        placement.settle(r, team);
        const int64_t r0 = std::min(P.m, r * share), r1 = std::min(P.m, (r + 1) * share);
        // The thread's rows in blocks of equal micro-tile counts: a last
        // block of one micro-tile would read every B sliver for one
        // micro-kernel (300 x 4096 x 1024 ran at 0.69-0.79x OpenBLAS).
        const int64_t micro = (r1 - r0 + MR - 1) / MR, per_block = panel_rows<T>() / MR;
        const int64_t blocks = (micro + per_block - 1) / per_block;
        alignas(64) Acc edge[MR * NR];
        for (int64_t j0 = 0; j0 < P.n; j0 += width) {
            const int64_t nb = std::min(width, P.n - j0), slivers = (nb + NR - 1) / NR;
            const int64_t s0 = slivers * r / team, s1 = slivers * (r + 1) / team;
            for (int64_t kb = 0; kb < P.k; kb += KC) {
                const int kc = static_cast<int>(std::min<int64_t>(KC, P.k - kb));
#pragma omp barrier
                // Every thread is done with the last panel: each packs its share of this one.
                if (s1 > s0)
                    errors.run([&] {
                        pack_b<T>(P, kb, kc, j0 + s0 * NR, static_cast<int>(std::min(nb, s1 * NR) - s0 * NR),
                                  panel + size_t(s0) * T::b_sliver_bytes(kc));
                    });
#pragma omp barrier
                errors.run([&] {
                    unsigned char* a_panel = Buffers<T>::local().a_panel.get();
                    for (int64_t q = 0; q < blocks; ++q) {
                        const int64_t i0 = r0 + micro * q / blocks * MR;
                        const int mc = static_cast<int>(std::min(r1, r0 + micro * (q + 1) / blocks * MR) - i0);
                        pack_a<T>(P, i0, mc, kb, kc, a_panel);
                        panel_block<T>(P, a_panel, panel, i0, mc, j0, nb, kc, kb > 0, edge);
                        // After the last K block, while the block's C lines are in cache.
                        if (kb + KC >= P.k) panel_epilogue<T, Epi>(P, i0, i0 + mc, j0, nb);
                    }
                });
            }
        }
        if constexpr (kGuardBytes > 0) errors.run([&] { Buffers<T>::local().check_guards(); });
    }
    errors.rethrow();
    if constexpr (kGuardBytes > 0) check_guards(kept.buffer.get(), kept.capacity, "shared B panel");
}

// `shared_panels` where the kernel's types allow it (`runs_shared_panels`).
template <class T, class Epi = PlainEpilogue>
void compute_shared_panels(const Problem<T>& P, int threads) {
    if constexpr (kSumsInC<T>) shared_panels<T, Epi>(P, threads);
}

}  // namespace dcpu
