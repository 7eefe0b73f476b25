// The micro-kernel's arithmetic: one policy per instruction family.
//
// Packed panels hold KG consecutive k values of one row of A (or one column
// of B) side by side in one 32-bit group, so one instruction multiplies the
// group of one row of A, broadcast, with a vector of B's column groups and
// adds the KG products of each lane into its accumulator:
//
//   Fma      KG 1: the compute type (float FMAs, int32 multiply-adds); any ISA
//   MaddI16  KG 2: int8 as int16 pairs, pmaddwd (x86: SSE2, AVX2, AVX-512BW);
//            exact: |a0*b0 + a1*b1| <= 2^15, far from pmaddwd's one
//            saturating case (all four inputs -2^15)
//   DotU8S8  KG 4: vpdpbusd (AVX512-VNNI, AVX-VNNI), unsigned x signed bytes:
//            B is packed offset by 128 (u = b + 128) and each A row's sum,
//            times -128, is added once per sliver: sum a (b + 128) - 128 sum a
//            = sum a b. The accumulator may wrap on the way (vpdpbusd does
//            not saturate); all arithmetic is modulo 2^32, so the result is
//            exact wherever the exact sum fits int32 (problem.py's K bound)
//   DotBf16  KG 2: bf16 pairs, vdpbf16ps (AVX512-BF16) / bfdot (aarch64 BF16),
//            float32 accumulation; bf16 and 8-bit float inputs are bf16
//            values exactly. Both instructions treat subnormal bf16 inputs as
//            zero; bfdot (without FEAT_EBF16) also rounds to odd
//   DotS8    KG 4: sdot (aarch64 DotProd), signed x signed bytes
//
// The matrix instructions take pairs instead (`pairs`): one register holds a
// k group of two rows of A, another one of two columns of B, and one
// instruction adds their 2x2 product into a 2x2 block of accumulators
// (`pair_micro_kernel`; the packed layout is the same, rows side by side):
//   MmlaS8   KG 8: smmla (aarch64 I8MM), signed x signed bytes
//
// The tile instructions (`tiles`, AMX) multiply 16x16 tiles of accumulators
// (`tile_micro_kernel`): A's groups are whole tile rows (64 bytes of k: KGA
// 32 bf16 or 64 int8), B's pairs or quadruples of k per column as above, and
// a K block is padded to whole tiles (KPAD):
//   TileBf16 tdpbf16ps (AMX-BF16), bf16 and 8-bit float inputs
//   TileS8   tdpbssd (AMX-INT8), signed x signed bytes
//
// A policy says how a storage value is packed (pack_a, pack_b, into its
// packed types A and B), how a group of A becomes a step's operand (group;
// not for pairs) and what one step does (step); a tile policy instead holds
// the tiles (configure, release, load_acc, zero_acc, store_acc) and does one
// chunk (multiply). A policy whose A slivers end with one int32 per row to
// add to that row's accumulators says so with row_offset_scale (the offset
// is row_offset_scale times the row's sum of A).
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(__AMX_TILE__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace dcpu {

// The 32-bit group at p, in every 32-bit lane of a V.
template <class V, class G>
inline V broadcast_group(const G* p) {
    typedef uint32_t U __attribute__((vector_size(sizeof(V))));
    uint32_t bits;
    std::memcpy(&bits, p, sizeof bits);
    return (V)(U{} + bits);
}

// The bf16 encoding of a float that is a bf16 value (its upper half).
inline uint16_t bf16_bits(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    return static_cast<uint16_t>(bits >> 16);
}

struct Fma {
    static constexpr int KG = 1;
    static constexpr int32_t row_offset_scale = 0;
    template <class Codec> using A = typename Codec::compute;
    template <class Codec> using B = typename Codec::compute;
    template <class Codec>
    static typename Codec::compute pack_a(typename Codec::storage v) { return Codec::load(v); }
    template <class Codec>
    static typename Codec::compute pack_b(typename Codec::storage v) { return Codec::load(v); }
    template <class V, class PA>
    static inline PA group(const PA* a) { return a[0]; }
    template <class V, class S>
    static inline V step(V acc, S a, V b) { return acc + a * b; }
};

#if defined(__SSE2__)
struct MaddI16 {
    static constexpr int KG = 2;
    static constexpr int32_t row_offset_scale = 0;
    template <class Codec> using A = int16_t;
    template <class Codec> using B = int16_t;
    template <class Codec>
    static int16_t pack_a(typename Codec::storage v) { return static_cast<int16_t>(Codec::load(v)); }
    template <class Codec>
    static int16_t pack_b(typename Codec::storage v) { return static_cast<int16_t>(Codec::load(v)); }
    template <class V>
    static inline V group(const int16_t* a) { return broadcast_group<V>(a); }
    template <class V>
    static inline V step(V acc, V a, V b) {
        if constexpr (sizeof(V) == 64)
            return acc + (V)_mm512_madd_epi16((__m512i)a, (__m512i)b);
        else if constexpr (sizeof(V) == 32)
            return acc + (V)_mm256_madd_epi16((__m256i)a, (__m256i)b);
        else
            return acc + (V)_mm_madd_epi16((__m128i)a, (__m128i)b);
    }
};
#endif

// DotU8S8's panels: signed A with its rows' offsets, B + 128. (Its step, the
// VNNI instruction, is apart, so tests/test_cpu_dot_kernels.py can check this
// arithmetic with an emulated step on machines without VNNI.)
struct PanelsU8S8 {
    static constexpr int KG = 4;
    static constexpr int32_t row_offset_scale = -128;
    template <class Codec> using A = int8_t;
    template <class Codec> using B = uint8_t;
    template <class Codec>
    static int8_t pack_a(typename Codec::storage v) { return static_cast<int8_t>(Codec::load(v)); }
    template <class Codec>
    static uint8_t pack_b(typename Codec::storage v) { return static_cast<uint8_t>(Codec::load(v) + 128); }
    template <class V>
    static inline V group(const int8_t* a) { return broadcast_group<V>(a); }
};

#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
struct DotU8S8 : PanelsU8S8 {
    template <class V>
    static inline V step(V acc, V a, V b) {
        static_assert(sizeof(V) == 64 || sizeof(V) == 32, "VNNI vectors are 256- or 512-bit");
#if defined(__AVX512VNNI__)
        if constexpr (sizeof(V) == 64)
            return (V)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)b, (__m512i)a);
        else
            return (V)_mm256_dpbusd_epi32((__m256i)acc, (__m256i)b, (__m256i)a);
#else
        return (V)_mm256_dpbusd_avx_epi32((__m256i)acc, (__m256i)b, (__m256i)a);
#endif
    }
};
#endif

#if defined(__AVX512BF16__) || defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
struct DotBf16 {
    static constexpr int KG = 2;
    static constexpr int32_t row_offset_scale = 0;
    template <class Codec> using A = uint16_t;
    template <class Codec> using B = uint16_t;
    template <class Codec>
    static uint16_t pack_a(typename Codec::storage v) { return bf16_bits(Codec::load(v)); }
    template <class Codec>
    static uint16_t pack_b(typename Codec::storage v) { return bf16_bits(Codec::load(v)); }
    template <class V>
    static inline V group(const uint16_t* a) { return broadcast_group<V>(a); }
    template <class V>
    static inline V step(V acc, V a, V b) {
#if defined(__AVX512BF16__)
        if constexpr (sizeof(V) == 64)
            return (V)_mm512_dpbf16_ps((__m512)acc, (__m512bh)a, (__m512bh)b);
        else
            return (V)_mm256_dpbf16_ps((__m256)acc, (__m256bh)a, (__m256bh)b);
#else
        static_assert(sizeof(V) == 16, "NEON vectors are 128-bit");
        return (V)vbfdotq_f32((float32x4_t)acc, (bfloat16x8_t)a, (bfloat16x8_t)b);
#endif
    }
};
#endif

#if defined(__ARM_FEATURE_DOTPROD)
struct DotS8 {
    static constexpr int KG = 4;
    static constexpr int32_t row_offset_scale = 0;
    template <class Codec> using A = int8_t;
    template <class Codec> using B = int8_t;
    template <class Codec>
    static int8_t pack_a(typename Codec::storage v) { return static_cast<int8_t>(Codec::load(v)); }
    template <class Codec>
    static int8_t pack_b(typename Codec::storage v) { return static_cast<int8_t>(Codec::load(v)); }
    template <class V>
    static inline V group(const int8_t* a) { return broadcast_group<V>(a); }
    template <class V>
    static inline V step(V acc, V a, V b) {
        static_assert(sizeof(V) == 16, "NEON vectors are 128-bit");
        return (V)vdotq_s32((int32x4_t)acc, (int8x16_t)b, (int8x16_t)a);
    }
};
#endif

// AMX's panels (the tiles apart, as PanelsU8S8).
struct TilePanelsBf16 {
    static constexpr bool tiles = true;
    static constexpr int KG = 2, KGA = 32, KPAD = 32;
    static constexpr int32_t row_offset_scale = 0;
    template <class Codec> using A = uint16_t;
    template <class Codec> using B = uint16_t;
    template <class Codec>
    static uint16_t pack_a(typename Codec::storage v) { return bf16_bits(Codec::load(v)); }
    template <class Codec>
    static uint16_t pack_b(typename Codec::storage v) { return bf16_bits(Codec::load(v)); }
};

struct TilePanelsS8 {
    static constexpr bool tiles = true;
    static constexpr int KG = 4, KGA = 64, KPAD = 64;
    static constexpr int32_t row_offset_scale = 0;
    template <class Codec> using A = int8_t;
    template <class Codec> using B = int8_t;
    template <class Codec>
    static int8_t pack_a(typename Codec::storage v) { return static_cast<int8_t>(Codec::load(v)); }
    template <class Codec>
    static int8_t pack_b(typename Codec::storage v) { return static_cast<int8_t>(Codec::load(v)); }
};

#if defined(__AMX_TILE__)
// The AMX tile registers: 8 tiles of 16 rows x 64 bytes (palette 1), as
// `tile_micro_kernel` uses them: 0-3 the 2x2 accumulator tiles of a 32x32
// block, 4-5 A's two 16-row tiles, 6-7 B's two 16-column tiles. (GCC's tile
// intrinsics take literal tile numbers.) Linux hands a process the tile
// state only when asked (arch_prctl ARCH_REQ_XCOMP_PERM, once per process);
// a thread loads the configuration before its tiles and releases them after.
struct AmxTiles {
    struct alignas(64) Config {
        uint8_t palette = 1, start_row = 0, reserved[14] = {};
        uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
        uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
    };
    static void configure() {
        // (syscall is variadic: its arguments are passed as the longs the kernel reads)
        static const bool granted = syscall(SYS_arch_prctl, 0x1023L /* ARCH_REQ_XCOMP_PERM */,
                                            18L /* XFEATURE_XTILEDATA */) == 0;
        if (!granted)
            throw std::runtime_error("AMX: Linux did not grant this process the tile state "
                                     "(arch_prctl ARCH_REQ_XCOMP_PERM; needs Linux 5.16 or later)");
        static const Config config;
        _tile_loadconfig(&config);
    }
    static void release() { _tile_release(); }
    // The 32x32 block at c (rows `stride` bytes apart) in or out of tiles 0-3.
    static void load_acc(const void* c, size_t stride) {
        const char* p = static_cast<const char*>(c);
        _tile_loadd(0, p, stride);
        _tile_loadd(1, p + 64, stride);
        _tile_loadd(2, p + 16 * stride, stride);
        _tile_loadd(3, p + 16 * stride + 64, stride);
    }
    static void zero_acc() {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    static void store_acc(void* c, size_t stride) {
        char* p = static_cast<char*>(c);
        _tile_stored(0, p, stride);
        _tile_stored(1, p + 64, stride);
        _tile_stored(2, p + 16 * stride, stride);
        _tile_stored(3, p + 16 * stride + 64, stride);
    }
    // A's 32 rows (a, 16 rows `a_stride` bytes apart, then the next 16) and
    // B's 32 columns (b: rows `b_stride` bytes apart, 64 bytes of column
    // groups on the left, 64 on the right) into tiles 4-7.
    static void load_operands(const void* a, size_t a_stride, const void* b, size_t b_stride) {
        _tile_loadd(4, a, a_stride);
        _tile_loadd(5, static_cast<const char*>(a) + 16 * a_stride, a_stride);
        _tile_loadd(6, b, b_stride);
        _tile_loadd(7, static_cast<const char*>(b) + 64, b_stride);
    }
};
#endif

#if defined(__AMX_BF16__)
struct TileBf16 : TilePanelsBf16, AmxTiles {
    static void multiply(const void* a, size_t a_stride, const void* b, size_t b_stride) {
        load_operands(a, a_stride, b, b_stride);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
};
#endif

#if defined(__AMX_INT8__)
struct TileS8 : TilePanelsS8, AmxTiles {
    static void multiply(const void* a, size_t a_stride, const void* b, size_t b_stride) {
        load_operands(a, a_stride, b, b_stride);
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
    }
};
#endif

#if defined(__ARM_FEATURE_MATMUL_INT8)
struct MmlaS8 {
    static constexpr int KG = 8;
    static constexpr bool pairs = true;
    static constexpr int32_t row_offset_scale = 0;
    template <class Codec> using A = int8_t;
    template <class Codec> using B = int8_t;
    template <class Codec>
    static int8_t pack_a(typename Codec::storage v) { return static_cast<int8_t>(Codec::load(v)); }
    template <class Codec>
    static int8_t pack_b(typename Codec::storage v) { return static_cast<int8_t>(Codec::load(v)); }
    template <class V>
    static inline V step(V acc, V a, V b) {
        return (V)vmmlaq_s32((int32x4_t)acc, (int8x16_t)a, (int8x16_t)b);
    }
};
#endif

// Whether policy D multiplies pairs (a matrix instruction) or tiles.
template <class D, class = void>
struct Pairs : std::false_type {};
template <class D>
struct Pairs<D, std::void_t<decltype(D::pairs)>> : std::bool_constant<D::pairs> {};
template <class D, class = void>
struct Tiles : std::false_type {};
template <class D>
struct Tiles<D, std::void_t<decltype(D::tiles)>> : std::bool_constant<D::tiles> {};

// A's k group (KGA) and the multiple a K block is padded to (KPAD): KG unless
// the policy says otherwise.
template <class D, class = void>
struct PanelShape {
    static constexpr int a_group = D::KG, pad = D::KG;
};
template <class D>
struct PanelShape<D, std::void_t<decltype(D::KGA)>> {
    static constexpr int a_group = D::KGA, pad = D::KPAD;
};

}  // namespace dcpu
