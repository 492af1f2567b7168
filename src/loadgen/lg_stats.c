// Summary statistics (numpy conventions), the RNG and arrival times for the load generator.
// Matches numpy's results to rounding, not bit for bit (numpy sums pairwise).
#include "loadgen/lg_stats.h"

#include <math.h>
#include <stdlib.h>

double td_lg_mean(const double *x, size_t n) {
    if (n == 0) return 0.0;
    long double s = 0;
    for (size_t i = 0; i < n; i++) s += x[i];
    return (double)(s / (long double)n);
}

double td_lg_std(const double *x, size_t n) {
    if (n == 0) return 0.0;
    double m = td_lg_mean(x, n);
    long double s = 0;
    for (size_t i = 0; i < n; i++) s += (long double)(x[i] - m) * (x[i] - m);
    return sqrt((double)(s / (long double)n));
}

double td_lg_percentile_sorted(const double *v, size_t n, double p) {
    if (n == 0) return 0.0;
    if (p <= 0) return v[0];
    if (p >= 100) return v[n - 1];
    double idx = p / 100.0 * (double)(n - 1);  // numpy 'linear': virtual index (n-1) q
    size_t lo = (size_t)floor(idx);
    if (lo >= n - 1) return v[n - 1];
    double t = idx - (double)lo, a = v[lo], b = v[lo + 1];
    // numpy's _lerp: a + (b-a) t, evaluated from the nearer end for t >= 0.5
    return t >= 0.5 ? b - (b - a) * (1.0 - t) : a + (b - a) * t;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void td_lg_sort(double *x, size_t n) {
    if (n > 1) qsort(x, n, sizeof *x, cmp_double);
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void td_lg_rng_seed(td_lg_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t td_lg_rng_next(td_lg_rng *r) {
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

double td_lg_rng_uniform(td_lg_rng *r) { return (double)(td_lg_rng_next(r) >> 11) * 0x1.0p-53; }

long td_lg_rng_int(td_lg_rng *r, long lo, long hi) {
    if (hi <= lo) return lo;
    uint64_t span = (uint64_t)(hi - lo) + 1, lim = UINT64_MAX - UINT64_MAX % span, x;
    do x = td_lg_rng_next(r);
    while (x >= lim);  // rejection keeps it exactly uniform
    return lo + (long)(x % span);
}

double td_lg_rng_exponential(td_lg_rng *r, double rate) {
    return -log1p(-td_lg_rng_uniform(r)) / rate;  // 1 - u is in (0, 1]
}

double td_lg_rng_normal(td_lg_rng *r) {
    double u1 = 1.0 - td_lg_rng_uniform(r), u2 = td_lg_rng_uniform(r);  // u1 in (0, 1]
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double td_lg_rng_gamma(td_lg_rng *r, double shape, double scale) {
    if (shape < 1.0) {  // boost: Gamma(a) = Gamma(a + 1) * U^(1/a)
        double u = 1.0 - td_lg_rng_uniform(r);
        return td_lg_rng_gamma(r, shape + 1.0, scale) * pow(u, 1.0 / shape);
    }
    // Marsaglia and Tsang (2000)
    double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x, v;
        do {
            x = td_lg_rng_normal(r);
            v = 1.0 + c * x;
        } while (v <= 0);
        v = v * v * v;
        double u = 1.0 - td_lg_rng_uniform(r);
        if (u < 1.0 - 0.0331 * x * x * x * x) return d * v * scale;
        if (log(u) < 0.5 * x * x + d * (1.0 - v + log(v))) return d * v * scale;
    }
}

void td_lg_arrivals(size_t n, double rate, double burstiness, td_lg_rng *rng, double *out) {
    if (n == 0) return;
    if (isinf(rate)) {
        for (size_t i = 0; i < n; i++) out[i] = 0.0;
        return;
    }
    double acc = 0;
    for (size_t i = 0; i < n; i++) {
        double gap = isinf(burstiness) ? 1.0 / rate : td_lg_rng_gamma(rng, burstiness, 1.0 / (rate * burstiness));
        acc += gap;
        out[i] = acc;
    }
    if (out[n - 1] > 0) {
        double f = ((double)n / rate) / out[n - 1];
        for (size_t i = 0; i < n; i++) out[i] *= f;
    }
}
