// Numbers for the load generator: summary statistics with numpy's conventions, a seeded RNG,
// and request arrival times (Poisson / gamma as `vllm bench serve` draws them).
// Pure functions over caller-owned arrays; nothing here touches the network or the clock.
#ifndef TD_LOADGEN_LG_STATS_H
#define TD_LOADGEN_LG_STATS_H

#include <stddef.h>
#include <stdint.h>

// Like np.mean(x or 0): 0 for an empty array.
double td_lg_mean(const double *x, size_t n);
// Like np.std(x or 0): population standard deviation (ddof = 0); 0 for an empty array.
double td_lg_std(const double *x, size_t n);
// Like np.percentile(x or 0, p) with the default 'linear' method, p in [0, 100], on an array
// already sorted ascending; 0 for an empty array.
double td_lg_percentile_sorted(const double *sorted, size_t n, double p);
// Sorts x ascending in place (doubles, no NaNs expected).
void td_lg_sort(double *x, size_t n);

// xoshiro256** seeded by splitmix64: the same seed gives the same stream on every machine.
typedef struct td_lg_rng {
    uint64_t s[4];
} td_lg_rng;

void td_lg_rng_seed(td_lg_rng *r, uint64_t seed);
uint64_t td_lg_rng_next(td_lg_rng *r);
double td_lg_rng_uniform(td_lg_rng *r);                  // [0, 1)
long td_lg_rng_int(td_lg_rng *r, long lo, long hi);       // uniform integer in [lo, hi]
double td_lg_rng_exponential(td_lg_rng *r, double rate);  // mean 1 / rate
double td_lg_rng_normal(td_lg_rng *r);                    // standard normal
double td_lg_rng_gamma(td_lg_rng *r, double shape, double scale);  // mean shape * scale

// Arrival times (seconds after the start) for n requests, as `vllm bench serve` computes them:
// rate = INFINITY: all 0. Otherwise inter-arrival gaps ~ Gamma(burstiness, 1 / (rate*burstiness))
// (burstiness 1: exponential, a Poisson process; burstiness INFINITY: constant 1 / rate), summed,
// then rescaled so that the last arrival is exactly n / rate. out has n entries.
void td_lg_arrivals(size_t n, double rate, double burstiness, td_lg_rng *rng, double *out);

#endif
