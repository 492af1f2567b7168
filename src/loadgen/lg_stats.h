// Numbers for the load generator: summary statistics with numpy's conventions, a seeded RNG,
// and request arrival times (Poisson / gamma as `vllm bench serve` draws them).
// Pure functions over caller-owned arrays; nothing here touches the network or the clock.
#ifndef TD_LOADGEN_LG_STATS_H
#define TD_LOADGEN_LG_STATS_H

#include <stddef.h>
#include <stdint.h>
#include "base/rng.h"

// Like np.mean(x or 0): 0 for an empty array.
double td_lg_mean(const double *x, size_t n);
// Like np.std(x or 0): population standard deviation (ddof = 0); 0 for an empty array.
double td_lg_std(const double *x, size_t n);
// Like np.percentile(x or 0, p) with the default 'linear' method, p in [0, 100], on an array
// already sorted ascending; 0 for an empty array.
double td_lg_percentile_sorted(const double *sorted, size_t n, double p);
// Sorts x ascending in place (doubles, no NaNs expected).
void td_lg_sort(double *x, size_t n);


// Arrival times (seconds after the start) for n requests, as `vllm bench serve` computes them:
// rate = INFINITY: all 0. Otherwise inter-arrival gaps ~ Gamma(burstiness, 1 / (rate*burstiness))
// (burstiness 1: exponential, a Poisson process; burstiness INFINITY: constant 1 / rate), summed,
// then rescaled so that the last arrival is exactly n / rate. out has n entries.
void td_lg_arrivals(size_t n, double rate, double burstiness, td_rng *rng, double *out);

#endif
