// The accuracy scan of the CPU epilogue's vectorized math (cpu/vec_math.hpp)
// for tests/test_activations.py: built with one ISA's flags and VEC_BYTES
// (its vector width), it evaluates exp, gelu and silu on every float32 with
// |x| in [2^-24, 2^8) and on every 61st float32 elsewhere (598 million
// inputs, NaN and infinities included), against float64 libm, on all
// OpenMP threads. Prints one line per function:
//
//   <function> <max relative error> <x where it is largest> <wrong NaN or infinity count>
//
// The relative error is |y - ref| / max(|ref|, FLT_MIN) (subnormal results are
// measured against the smallest normal float); at +-inf the reference is the
// limit, NaN must give NaN.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>

#include "cpu/vec_math.hpp"

namespace {

typedef float Vec __attribute__((vector_size(VEC_BYTES)));
constexpr int kLanes = VEC_BYTES / sizeof(float);

enum Function { kExp, kGelu, kSilu };
const char* const kNames[] = {"exp", "gelu", "silu"};

Vec evaluate(Function f, Vec x) {
    switch (f) {
        case kExp: return dcpu::vmath::exp(x);
        case kGelu: return dcpu::vmath::gelu(x);
        default: return dcpu::vmath::silu(x);
    }
}

double reference(Function f, double x) {
    if (std::isinf(x)) return x > 0 ? INFINITY : 0.0;  // the limits
    switch (f) {
        case kExp: return std::exp(x);
        case kGelu: return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
        default: return x / (1.0 + std::exp(-x));
    }
}

bool scanned(uint32_t bits) {
    const uint32_t exponent = (bits >> 23) & 0xff;
    return (exponent >= 127 - 24 && exponent < 127 + 8) || bits % 61 == 0 ||
           (bits & 0x7fffffff) == 0x7f800000;  // +-inf
}

}  // namespace

int main() {
    for (Function f : {kExp, kGelu, kSilu}) {
        double worst = 0;
        float worst_x = 0;
        long wrong_specials = 0;
#pragma omp parallel
        {
            double my_worst = 0;
            float my_x = 0;
            long my_wrong = 0;
            // Blocks of 2^16 consecutive bit patterns; each block's scanned
            // inputs are packed into vectors (the last one padded with 0).
#pragma omp for schedule(dynamic, 64)
            for (int64_t block = 0; block < (int64_t(1) << 16); ++block) {
                float xs[kLanes], ys[kLanes];
                int lanes = 0;
                auto flush = [&] {
                    for (int i = lanes; i < kLanes; ++i) xs[i] = 0;
                    Vec x, y;
                    std::memcpy(&x, xs, sizeof x);
                    y = evaluate(f, x);
                    std::memcpy(ys, &y, sizeof y);
                    for (int i = 0; i < lanes; ++i) {
                        if (std::isnan(xs[i])) {
                            my_wrong += !std::isnan(ys[i]);
                            continue;
                        }
                        const double ref = reference(f, xs[i]);
                        if (std::isinf(float(ref))) {
                            my_wrong += !(std::isinf(ys[i]) && (ys[i] > 0) == (ref > 0));
                            continue;
                        }
                        const double error = std::fabs(ys[i] - ref) / std::fmax(std::fabs(ref), FLT_MIN);
                        if (!(error <= my_worst)) my_worst = error, my_x = xs[i];
                    }
                    lanes = 0;
                };
                for (uint32_t low = 0; low < (1u << 16); ++low) {
                    const uint32_t bits = uint32_t(block) << 16 | low;
                    if (!scanned(bits)) continue;
                    std::memcpy(&xs[lanes++], &bits, sizeof(float));
                    if (lanes == kLanes) flush();
                }
                if (lanes) flush();
            }
#pragma omp critical
            {
                if (my_worst > worst) worst = my_worst, worst_x = my_x;
                wrong_specials += my_wrong;
            }
        }
        std::printf("%s %.6g %a %ld\n", kNames[f], worst, worst_x, wrong_specials);
    }
    return 0;
}
