// xoshiro256** streams and the distributions drawn from them.
#include "base/rng.h"

#include <math.h>

void td_rng_seed(td_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = td_splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t td_rng_next(td_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double td_rng_uniform(td_rng *r) { return (double)(td_rng_next(r) >> 11) * 0x1.0p-53; }

long td_rng_int(td_rng *r, long lo, long hi) {
    if (hi <= lo) return lo;
    uint64_t span = (uint64_t)(hi - lo) + 1, lim = UINT64_MAX - UINT64_MAX % span, x;
    do x = td_rng_next(r);
    while (x >= lim);  // rejection keeps it exactly uniform
    return lo + (long)(x % span);
}

double td_rng_exponential(td_rng *r, double rate) {
    return -log1p(-td_rng_uniform(r)) / rate;  // 1 - u is in (0, 1]
}

double td_rng_normal(td_rng *r) {
    double u1 = 1.0 - td_rng_uniform(r), u2 = td_rng_uniform(r);  // u1 in (0, 1]
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double td_rng_gamma(td_rng *r, double shape, double scale) {
    if (shape < 1.0) {  // boost: Gamma(a) = Gamma(a + 1) * U^(1/a)
        double u = 1.0 - td_rng_uniform(r);
        return td_rng_gamma(r, shape + 1.0, scale) * pow(u, 1.0 / shape);
    }
    // Marsaglia and Tsang (2000)
    double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x, v;
        do {
            x = td_rng_normal(r);
            v = 1.0 + c * x;
        } while (v <= 0);
        v = v * v * v;
        double u = 1.0 - td_rng_uniform(r);
        if (u < 1.0 - 0.0331 * x * x * x * x) return d * v * scale;
        if (log(u) < 0.5 * x * x + d * (1.0 - v + log(v))) return d * v * scale;
    }
}

