// Staging of operands TMA cannot read in place.
//
// A TMA load or store needs the matrix's address, pitch, batch stride and
// contiguous extent in multiples of 16 bytes (CUTLASS's can_implement checks
// the same); odd sizes (K = 777 in bf16) and views at odd offsets break it.
// Such a call runs on zero-padded copies in the call's workspace: one copy
// launch for every staged input, the GEMM on the padded problem, one copy of
// the padded result back into C. Zero rows and columns of K add nothing, and
// the padded rows and columns of D are dropped. Everything is queued on the
// call's stream, so it can be captured in a CUDA graph like the GEMM itself,
// and the Python side needs nothing but the workspace size it asks for.
#pragma once

#ifdef __CUDACC__
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cstdint>

#include "dispatcher_abi.h"

namespace dcuda {

// One operand as stored: `batch` matrices `batch_stride` elements apart
// (0: one matrix for all), each `outer` lines of `inner` elements `ld`
// apart, contiguous (`step` 0: one value repeated, a broadcast bias).
struct Stored {
    const void* data;
    int64_t outer, inner, ld, batch_stride;
    int64_t step = 1;
};

// A copy of `from` into `to` (dst lines past from's extents get zeros), of
// `batch` matrices of `bytes`-byte elements. `to.data` is an offset into the
// workspace until the call binds it.
struct Move {
    Stored from, to;
    int64_t batch;
    int bytes;
};

inline int64_t round_up(int64_t x, int64_t step) { return (x + step - 1) / step * step; }

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// How a call runs on staged operands: the argument block the GEMM gets
// (pointing into the workspace where staged), the copies before it, the copy
// of D back into C after it, and the workspace bytes the copies take.
struct Staging {
    dispatcher_gemm_args args{};
    dispatcher_operand bias{};
    Move in[4]{};
    int moves_in = 0;
    Move out{};
    bool copy_out = false;
    int64_t bytes = 0;

    bool any() const { return moves_in > 0 || copy_out || bytes > 0; }

    // Stage `from` (element bytes `size`, `batch` matrices) as a padded
    // (outer, inner) copy in the workspace; returns its stored form.
    Stored place(const Stored& from, int64_t outer, int64_t inner, int64_t batch, int size, bool copy_in) {
        const int64_t count = from.batch_stride == 0 ? 1 : batch;
        Stored to{reinterpret_cast<const void*>(bytes), outer, inner, inner,
                  from.batch_stride == 0 ? 0 : outer * inner};
        bytes += round_up(count * outer * inner * size, 256);
        if (copy_in) in[moves_in++] = Move{from, to, count, size};
        return to;
    }

    // The argument block bound to `workspace`: staged pointers moved from
    // offsets to addresses; the kernel's own scratch starts after the copies.
    dispatcher_gemm_args bound(void* workspace) {
        auto at = [&](const void* offset) {
            return static_cast<void*>(static_cast<char*>(workspace) + reinterpret_cast<intptr_t>(offset));
        };
        dispatcher_gemm_args a = args;
        for (int i = 0; i < moves_in; ++i) in[i].to.data = at(in[i].to.data);
        if (copy_out) out.from.data = at(out.from.data);
        if (staged_a) a.a = at(a.a);
        if (staged_b) a.b = at(a.b);
        if (staged_c) a.c = at(a.c);
        if (staged_bias) {
            bias.data = at(bias.data);
            a.extra = &bias;
            a.extra_count = 1;
        }
        a.workspace = bytes ? static_cast<char*>(workspace) + bytes : workspace;
        a.workspace_bytes = args.workspace_bytes - bytes;
        return a;
    }

    bool staged_a = false, staged_b = false, staged_c = false, staged_bias = false;
};

// Whether a kernel can read extra operand 0 of `a` (its bias) as a
// contiguous vector along M (or N): one value is, whatever its stride.
inline bool bias_contiguous(const dispatcher_gemm_args* a, bool along_m) {
    const dispatcher_operand& bias = a->extra[0];
    return (along_m ? a->m : a->n) <= 1 || (along_m ? bias.row_stride : bias.col_stride) == 1;
}

// The staging of one call (`staging_of<T, BiasAlongM, BiasAlongN>`): which
// operands the kernel of traits T cannot read in place, and their padded
// copies. The padded sizes: K to a multiple of the inputs' 16 bytes where it
// is contiguous in A or B, M where A is column-major, N where it is
// contiguous in B or C. An operand is staged when a padded size is one of its
// extents or its address, pitch or batch stride is off 16 bytes.
template <class T, bool HasBias, bool BiasAlongM>
Staging staging_of(const dispatcher_gemm_args* a) {
    using EA = typename T::ElementA;
    using EB = typename T::ElementB;
    using EC = typename T::ElementC;
    constexpr int64_t alA = 16 / sizeof(EA), alB = 16 / sizeof(EB), alC = 16 / sizeof(EC);
    constexpr bool kCRow = T::kCRow;
    Staging s;
    s.args = *a;
    const int64_t m = a->m, n = a->n, k = a->k, batch = a->batch > 1 ? a->batch : 1;
    const bool k_in_a = T::kARow, k_in_b = !T::kBRow;
    const int64_t kp = ((k_in_a && k % alA) || (k_in_b && k % alB)) ? round_up(k, std::max(alA, alB)) : k;
    const int64_t mp = ((!T::kARow && m % alA) || (!kCRow && m % alC))
                           ? round_up(m, std::max(T::kARow ? int64_t(1) : alA, kCRow ? int64_t(1) : alC))
                           : m;
    const int64_t np = ((T::kBRow && n % alB) || (kCRow && n % alC))
                           ? round_up(n, std::max(T::kBRow ? alB : int64_t(1), kCRow ? alC : int64_t(1)))
                           : n;
    auto off = [&](const void* p, int64_t ld, int64_t bs, int64_t al) {
        return !aligned16(p) || ld % al || (batch > 1 && bs % al);
    };
    // A: (M, K) row-major or its transpose
    const Stored sa{a->a, T::kARow ? m : k, T::kARow ? k : m, a->lda, a->batch_stride_a};
    if (mp != m || kp != k || off(a->a, a->lda, a->batch_stride_a, alA)) {
        const Stored to = s.place(sa, T::kARow ? mp : kp, T::kARow ? kp : mp, batch, sizeof(EA), true);
        s.args.a = to.data, s.args.lda = to.ld, s.args.batch_stride_a = to.batch_stride, s.staged_a = true;
    }
    const Stored sb{a->b, T::kBRow ? k : n, T::kBRow ? n : k, a->ldb, a->batch_stride_b};
    if (np != n || kp != k || off(a->b, a->ldb, a->batch_stride_b, alB)) {
        const Stored to = s.place(sb, T::kBRow ? kp : np, T::kBRow ? np : kp, batch, sizeof(EB), true);
        s.args.b = to.data, s.args.ldb = to.ld, s.args.batch_stride_b = to.batch_stride, s.staged_b = true;
    }
    const Stored sc{a->c, kCRow ? m : n, kCRow ? n : m, a->ldc, a->batch_stride_c};
    if (mp != m || np != n || off(a->c, a->ldc, a->batch_stride_c, alC)) {
        const Stored to = s.place(sc, kCRow ? mp : np, kCRow ? np : mp, batch, sizeof(EC), a->beta != 0.0);
        s.args.c = const_cast<void*>(to.data), s.args.ldc = to.ld, s.args.batch_stride_c = to.batch_stride;
        s.staged_c = true;
        s.out = Move{to, sc, batch, int(sizeof(EC))};
        s.copy_out = true;
    }
    if constexpr (HasBias) {
        if (a->extra_count > 0 && a->extra && a->extra[0].data) {
            s.bias = a->extra[0];
            const int64_t len = BiasAlongM ? m : n, lenp = BiasAlongM ? mp : np;
            int64_t& stride = BiasAlongM ? s.bias.row_stride : s.bias.col_stride;
            // One value (len 1, any stride) is contiguous; one value broadcast
            // along the bias (stride 0) is staged as a vector of it.
            const bool broadcast = stride == 0 && len > 1;
            if (broadcast ||
                ((stride == 1 || len == 1) && (lenp != len || off(s.bias.data, 0, s.bias.batch_stride, alC)))) {
                const Stored from{s.bias.data, 1, len, len, s.bias.batch_stride, broadcast ? 0 : 1};
                const Stored to = s.place(from, 1, lenp, batch, sizeof(EC), true);
                s.bias.data = to.data, s.bias.batch_stride = to.batch_stride, s.staged_bias = true;
                stride = 1;
            }
        }
    }
    s.args.m = mp, s.args.n = np, s.args.k = kp;
    return s;
}

// The copies themselves (nvcc only: the plan above is plain C++, which the
// CPU tests compile to check it).
#ifdef __CUDACC__
// Up to four moves in one launch (blockIdx.z picks the move): every staged
// input of a call costs one kernel launch together.
struct Moves {
    Move move[4];
};

// Whether every line of `m`'s destination takes whole 16-byte stores: a
// staged copy's lines do (their pitch and extent are padded to 16 bytes);
// C copied back usually does not.
__host__ __device__ inline bool whole_lines(const Move& m) {
    const int64_t b = m.bytes;
    return ((reinterpret_cast<uintptr_t>(m.to.data) | uintptr_t(m.to.ld * b) | uintptr_t(m.to.batch_stride * b) |
             uintptr_t(m.to.inner * b)) & 15) == 0;
}

// The work items of one line of `m` (`copy_lines`): 16-byte chunks of whole
// lines; else, at most, one more chunk and the elements of two partial ones.
__host__ __device__ inline int64_t line_items(const Move& m) {
    const int64_t per = 16 / m.bytes;
    return whole_lines(m) ? m.to.inner / per : m.to.inner / per + 2 * per;
}

// Lines of `m`, threadIdx.x along a line and threadIdx.y over lines (short
// lines share a block). Each thread gathers 16 bytes of elements and stores
// them at once; a line whose start is not on a 16-byte boundary (C copied
// back: 10607 x 10897 bf16 copied element by element took 1.1 ms, four
// times the GEMM) has its elements before the first boundary and after the
// last whole chunk copied one by one.
template <class Word>
__device__ void copy_lines(const Move& m) {
    constexpr int kPer = 16 / sizeof(Word);
    const Word* src = static_cast<const Word*>(m.from.data);
    Word* dst = static_cast<Word*>(const_cast<void*>(m.to.data));
    const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, step = int64_t(gridDim.x) * blockDim.x;
    const int64_t lines = m.batch * m.to.outer;
    for (int64_t line = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; line < lines;
         line += int64_t(gridDim.y) * blockDim.y) {
        const int64_t b = line / m.to.outer, i = line - b * m.to.outer;
        const Word* from = src + b * m.from.batch_stride + i * m.from.ld;
        Word* to = dst + b * m.to.batch_stride + i * m.to.ld;
        const int64_t have = i < m.from.outer ? m.from.inner : 0;  // source elements on this line
        auto element = [&](int64_t e) { return e < have ? from[e * m.from.step] : Word(0); };
        // elements [0, head) and [tail, inner) one by one, [head, tail) in chunks
        const int64_t head = std::min<int64_t>((16 - (reinterpret_cast<uintptr_t>(to) & 15)) % 16 / sizeof(Word),
                                               m.to.inner);
        const int64_t chunks = (m.to.inner - head) / kPer, tail = head + chunks * kPer;
        const int64_t items = chunks + head + (m.to.inner - tail);
        for (int64_t c = first; c < items; c += step) {
            if (c < chunks) {
                alignas(16) Word chunk[kPer];
#pragma unroll
                for (int e = 0; e < kPer; ++e) chunk[e] = element(head + c * kPer + e);
                reinterpret_cast<uint4*>(to + head)[c] = *reinterpret_cast<const uint4*>(chunk);
            } else {
                const int64_t e = c - chunks < head ? c - chunks : tail + (c - chunks - head);
                to[e] = element(e);
            }
        }
    }
}

__global__ void copy_padded(Moves moves) {
    const Move& m = moves.move[blockIdx.z];
    switch (m.bytes) {  // the same for the whole block
        case 1: copy_lines<uint8_t>(m); break;
        case 2: copy_lines<uint16_t>(m); break;
        case 4: copy_lines<uint32_t>(m); break;
        default: copy_lines<uint64_t>(m); break;
    }
}

// Queue the copies `move[0, count)` on `stream` as one launch: 256 threads
// a block, as many along a line as its work items need (a power of two),
// the rest over lines; about one item per thread.
inline cudaError_t copy(const Move* move, int count, cudaStream_t stream) {
    if (count < 1) return cudaSuccess;
    Moves moves{};
    int64_t items = 1, lines = 1;
    for (int i = 0; i < count; ++i) {
        moves.move[i] = move[i];
        items = std::max(items, line_items(move[i]));
        lines = std::max(lines, move[i].batch * move[i].to.outer);
    }
    unsigned along = 1;
    while (along < 256 && along < items) along *= 2;
    const dim3 threads(along, 256 / along);
    const dim3 grid(unsigned(std::min<int64_t>((items + along - 1) / along, 64)),
                    unsigned(std::min<int64_t>((lines + threads.y - 1) / threads.y, 65535)), unsigned(count));
    copy_padded<<<grid, threads, 0, stream>>>(moves);
    return cudaGetLastError();
}

#endif  // __CUDACC__

}  // namespace dcuda
