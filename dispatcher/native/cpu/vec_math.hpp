// Vectorized float math of the fused epilogues: exp and the standard normal
// CDF (the erf of GELU), and the activations built on them.
//
// Written with GCC vector extensions over any float vector type V (`float
// __attribute__((vector_size(N)))`), like the micro-kernel: the ISA's -march
// picks the instructions (SSE2, AVX2 with FMA, AVX-512, NEON), and there is
// no intrinsic, table or branch per lane. Every function is accurate to a few
// float32 ulps over the whole float range, with the relative error measured
// against float64 libm on every float32 input (docs/architecture.md, "Fused
// activations"); NaN propagates.
//
// GELU is x * Phi(x). Written as 0.5 * x * (1 + erf(x / sqrt 2)) in float,
// it loses its digits for negative x as 1 + erf cancels (GELU(-4) was 3e-4
// off, GELU(-5) 4 %, GELU(-6) 0), so Phi is computed from its own tail:
// Phi(-u) for u >= 0 is t * exp(-u^2/2 + h(t)), t = 1 / (1 + 0.375 u), h a
// polynomial fitted to log(Phi(-u)) + u^2/2 - log t, and Phi(x) = 1 - Phi(-x)
// for x >= 0 (at most one bit lost there: Phi(-x) <= 1/2).
#pragma once

#include <cstdint>

namespace dcpu::vmath {

// The int32 vector with V's lanes, for the bit operations.
template <class V>
struct Bits {
    typedef int32_t type __attribute__((vector_size(sizeof(V))));
};
template <class V>
using bits_t = typename Bits<V>::type;

template <class V>
inline V splat(float s) {
    return V{} + s;
}

// f * exp(hi + lo), |lo| below a few units. lo joins after the range
// reduction of hi + lo, so an exactly computed hi (GELU's -u^2/2) keeps its
// precision, and f multiplies before the final scaling by 2^n, so a product
// in the subnormal range is rounded once. Above 89, hi + lo gives f * inf;
// below -150, 0 (exp(-150) < 2^-216: 0 for any |f| below 2^66).
template <class V>
inline V exp_times(V hi, V lo, V f) {
    using I = bits_t<V>;
    const V x = hi + lo;
    const I over = x > 89.0f, under = x < -150.0f;
    // Round x / ln 2 to the nearest integer n: adding 1.5 * 2^23 leaves n in
    // the low mantissa bits.
    const V shifter = splat<V>(12582912.0f);
    const V t = x * 1.44269504088896341f + shifter;
    const V n = t - shifter;
    const I ni = reinterpret_cast<I>(t) - reinterpret_cast<I>(shifter);
    // r = hi + lo - n ln 2, ln 2 in two parts (Cody and Waite): n * 0.693359375
    // is exact, and so is its difference from an exact hi.
    const V r = ((hi - n * 0.693359375f) + n * 2.12194440e-4f) + lo;
    // exp(r) on |r| <= ln(2)/2 (Cephes' expf polynomial, 1 ulp).
    V p = splat<V>(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    V e = f * (p * (r * r) + r + 1.0f);
    // * 2^n in two steps, each exponent in range for n in [-217, 128].
    const I n1 = ni >> 1, n2 = ni - n1;
    e = e * reinterpret_cast<V>((n1 + 127) << 23);
    e = e * reinterpret_cast<V>((n2 + 127) << 23);
    return over ? f * __builtin_inff() : (under ? V{} : e);
}

template <class V>
inline V exp(V x) {
    return exp_times(x, V{}, splat<V>(1.0f));
}

template <class V>
inline V abs(V x) {
    using I = bits_t<V>;
    return reinterpret_cast<V>(reinterpret_cast<I>(x) & 0x7fffffff);
}

// f * Phi(-u) for u >= 0, Phi(-u) the lower tail of the standard normal, and
// t f for t = 1 / (1 + 0.375 u) (a caller that needs Phi(x) = 1 - Phi(-x)
// asks for f = 1). Where u * Phi(-u) rounds to 0 in float32 (u > 14.5), 0.
template <class V>
inline V normal_lower_tail_times(V u, V f) {
    using I = bits_t<V>;
    constexpr float kMaxU = 14.5f, kK = 0.29688883f;  // kK = exp(mean of h)
    const I beyond = u > kMaxU;
    u = beyond ? splat<V>(kMaxU) : u;
    // h(t) - log kK, fitted (Chebyshev, to 3.2e-9) on t in [1/(1 + 14.5 * 0.375), 1]
    // mapped to s in [-1, 1], in powers of s.
    const V t = kK / (1.0f + 0.375f * u);
    const V s = t * (2.36781621f / kK) - 1.36781609f;
    V h = splat<V>(2.468675575e-06f);
    h = h * s - 3.408199336e-05f;
    h = h * s + 2.734671034e-05f;
    h = h * s + 2.310011332e-04f;
    h = h * s - 4.495927133e-04f;
    h = h * s - 8.226097561e-04f;
    h = h * s + 3.695034888e-03f;
    h = h * s + 1.561613404e-03f;
    h = h * s - 3.020224720e-02f;
    h = h * s + 1.340724557e-04f;
    h = h * s + 5.481773615e-01f;
    h = h * s - 1.069982769e-03f;
    // -u^2/2 exactly: uh (u's top 12 bits) squares exactly, and
    // u^2 = uh^2 + (u - uh)(u + uh).
    const V uh = reinterpret_cast<V>(reinterpret_cast<I>(u) & int32_t(0xfffff000));
    const V q = exp_times(-0.5f * (uh * uh), h - 0.5f * ((u - uh) * (u + uh)), f * t);
    return beyond ? V{} : q;
}

// GELU with erf: x * Phi(x) = x * 0.5 * (1 + erf(x / sqrt 2)). Near 0,
// Phi(x) = 1/2 + x P(x^2) (P fitted to 2.5e-9 on |x| < 0.75); beyond, x *
// Phi(-|x|) below 0 and x * (1 - Phi(-x)) above.
template <class V>
inline V gelu(V x) {
    const V y = x * x;
    V p = splat<V>(1.029289124e-04f);
    p = p * y - 1.181271859e-03f;
    p = p * y + 9.972344153e-03f;
    p = p * y - 6.649029255e-02f;
    p = p * y + 3.989422917e-01f;
    const V near = x * (0.5f + x * p);
    const V tail = normal_lower_tail_times(abs(x), x < 0.0f ? x : splat<V>(1.0f));
    return y < 0.5625f ? near : (x < 0.0f ? tail : x * (1.0f - tail));
}

// SiLU: x * sigmoid(x) = x / (1 + exp(-x)), through w = exp(-|x|) (times x
// below 0, rounded once), so exp never overflows: x / (1 + w) above 0,
// w / (1 + w / x) below.
template <class V>
inline V silu(V x) {
    const auto negative = x < 0.0f;
    const V w = exp_times(-abs(x), V{}, negative ? x : splat<V>(1.0f));
    return negative ? w / (1.0f + w / x) : x / (1.0f + w);
}

}  // namespace dcpu::vmath
