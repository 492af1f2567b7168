// Seeded pseudo-random numbers shared by every module: splitmix64 (seeding, hashing small
// integers) and xoshiro256** (streams). Deterministic for a seed on every platform, so sampling
// seeds, data order and benchmark workloads reproduce exactly. Not for cryptography.
#ifndef TD_BASE_RNG_H
#define TD_BASE_RNG_H

#include <stdint.h>

// splitmix64: advances *state and returns the next output.
static inline uint64_t td_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Stateless mix of one value (one splitmix64 step from x): a cheap, well-spread hash.
static inline uint64_t td_mix64(uint64_t x) { return td_splitmix64(&x); }

// xoshiro256** seeded by splitmix64.
typedef struct td_rng {
    uint64_t s[4];
} td_rng;

void td_rng_seed(td_rng *r, uint64_t seed);
uint64_t td_rng_next(td_rng *r);
double td_rng_uniform(td_rng *r);                           // [0, 1), 53 bits
long td_rng_int(td_rng *r, long lo, long hi);               // uniform integer in [lo, hi]
double td_rng_exponential(td_rng *r, double rate);          // mean 1 / rate
double td_rng_normal(td_rng *r);                            // standard normal (Box-Muller)
double td_rng_gamma(td_rng *r, double shape, double scale); // mean shape * scale

#endif
