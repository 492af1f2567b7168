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

void td_lg_arrivals(size_t n, double rate, double burstiness, td_rng *rng, double *out) {
    if (n == 0) return;
    if (isinf(rate)) {
        for (size_t i = 0; i < n; i++) out[i] = 0.0;
        return;
    }
    double acc = 0;
    for (size_t i = 0; i < n; i++) {
        double gap = isinf(burstiness) ? 1.0 / rate : td_rng_gamma(rng, burstiness, 1.0 / (rate * burstiness));
        acc += gap;
        out[i] = acc;
    }
    if (out[n - 1] > 0) {
        double f = ((double)n / rate) / out[n - 1];
        for (size_t i = 0; i < n; i++) out[i] *= f;
    }
}
