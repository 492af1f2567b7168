// Test helper: the inputs and the serial oracle of the communicator tests (test_comm for the
// in-process implementation, test_comm_mpi for MPI): element j of rank k's input for operation
// `salt`, the reduction over ranks folded in rank order in the element type, and checks of
// reduced and gathered buffers against them.
#ifndef TD_TEST_COMM_ORACLE_H
#define TD_TEST_COMM_ORACLE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "dist/comm.h"

static inline uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static const size_t ES[TD_COMM_DTYPE_N] = {4, 8, 4, 8, 1};

// Element j of rank k's input for operation salt. Floats span 2^-8..2^8 in magnitude; `wide`
// (the adversarial data) keeps them within 2^-3..2^3 of each other, with both signs, so that
// partial sums cancel and round differently in every order (most elements of a sum over three or
// more ranks change bits when the order does). Integers span their whole range so that sums wrap.
static inline void gen_w(td_comm_dtype t, int k, size_t j, uint64_t salt, bool wide, void *out) {
    uint64_t h = mix(salt * 0x100000001b3ull ^ ((uint64_t)k << 48) ^ j);
    double u = (double)(h >> 11) / 9007199254740992.0 * 2 - 1;  // [-1, 1)
    double v = wide ? ldexp(u, (int)((h >> 3) % 7) - 3) : ldexp(u, (int)((h >> 3) % 17) - 8);
    switch (t) {
    case TD_COMM_F32: *(float *)out = (float)v; break;
    case TD_COMM_F64: *(double *)out = v; break;
    case TD_COMM_I32: *(int32_t *)out = (int32_t)(uint32_t)h; break;
    case TD_COMM_I64: *(int64_t *)out = (int64_t)h; break;
    case TD_COMM_U8: *(uint8_t *)out = (uint8_t)(h >> 17); break;
    default: break;
    }
}

static inline void gen(td_comm_dtype t, int k, size_t j, uint64_t salt, void *out) { gen_w(t, k, j, salt, false, out); }

static inline void fill_w(td_comm_dtype t, void *buf, size_t n, int k, size_t j0, uint64_t salt, bool wide) {
    for (size_t j = 0; j < n; j++) gen_w(t, k, j0 + j, salt, wide, (char *)buf + j * ES[t]);
}

static inline void fill(td_comm_dtype t, void *buf, size_t n, int k, size_t j0, uint64_t salt) {
    fill_w(t, buf, n, k, j0, salt, false);
}

// The reduction over ranks 0..size-1 of element j, folded in rank order in the element type.
static inline void oracle(td_comm_dtype t, td_comm_op op, int size, size_t j, uint64_t salt, void *out) {
    union { float f; double d; int32_t i; int64_t l; uint8_t b; } acc, x;
    gen(t, 0, j, salt, &acc);
    for (int k = 1; k < size; k++) {
        gen(t, k, j, salt, &x);
        switch (t) {
        case TD_COMM_F32:
            acc.f = op == TD_COMM_SUM ? acc.f + x.f : op == TD_COMM_MAX ? fmaxf(acc.f, x.f) : fminf(acc.f, x.f);
            break;
        case TD_COMM_F64:
            acc.d = op == TD_COMM_SUM ? acc.d + x.d : op == TD_COMM_MAX ? fmax(acc.d, x.d) : fmin(acc.d, x.d);
            break;
        case TD_COMM_I32:
            acc.i = op == TD_COMM_SUM ? (int32_t)((uint32_t)acc.i + (uint32_t)x.i)
                    : op == TD_COMM_MAX ? (acc.i > x.i ? acc.i : x.i) : (acc.i < x.i ? acc.i : x.i);
            break;
        case TD_COMM_I64:
            acc.l = op == TD_COMM_SUM ? (int64_t)((uint64_t)acc.l + (uint64_t)x.l)
                    : op == TD_COMM_MAX ? (acc.l > x.l ? acc.l : x.l) : (acc.l < x.l ? acc.l : x.l);
            break;
        case TD_COMM_U8:
            acc.b = op == TD_COMM_SUM ? (uint8_t)(acc.b + x.b) : op == TD_COMM_MAX ? (acc.b > x.b ? acc.b : x.b)
                                                                                   : (acc.b < x.b ? acc.b : x.b);
            break;
        default: break;
        }
    }
    memcpy(out, &acc, ES[t]);
}

// Checks n reduced elements (global indices j0..) bit for bit against the oracle, and float sums
// against the double-precision sum.
static inline int check_reduced(td_comm_dtype t, td_comm_op op, int size, const void *got, size_t n, size_t j0,
                         uint64_t salt) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char want[8];
        oracle(t, op, size, j0 + i, salt, want);
        const char *g = (const char *)got + i * ES[t];
        if (memcmp(g, want, ES[t])) bad++;
        if (op == TD_COMM_SUM && (t == TD_COMM_F32 || t == TD_COMM_F64)) {
            double sum = 0, mag = 0;
            for (int k = 0; k < size; k++) {
                union { float f; double d; } x;
                gen(t, k, j0 + i, salt, &x);
                double v = t == TD_COMM_F32 ? x.f : x.d;
                sum += v;
                mag += fabs(v);
            }
            double gv = t == TD_COMM_F32 ? *(const float *)g : *(const double *)g;
            if (fabs(gv - sum) > mag * size * (t == TD_COMM_F32 ? 1.2e-7 : 2.3e-16)) bad++;
        }
    }
    return bad;
}

static inline int check_gen(td_comm_dtype t, const void *got, size_t n, int k, size_t j0, uint64_t salt) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char want[8];
        gen(t, k, j0 + i, salt, want);
        bad += memcmp((const char *)got + i * ES[t], want, ES[t]) != 0;
    }
    return bad;
}

#endif
