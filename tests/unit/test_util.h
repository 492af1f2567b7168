// Tiny test harness shared by the unit tests: CHECK counts failures and keeps going;
// TEST_DONE prints "N passed, N failed" and returns non-zero when anything failed; td_test_skip
// (exit status 77) for what a machine may lack, td_test_need / td_test_bin for what it may not.
#ifndef TD_TEST_UTIL_H
#define TD_TEST_UTIL_H

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int td_test_passed, td_test_failed;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (cond) {                                                        \
            td_test_passed++;                                              \
        } else {                                                           \
            td_test_failed++;                                              \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
        }                                                                  \
    } while (0)

#define CHECK_NEAR(a, b, tol, what)                                                         \
    CHECK(fabs((double)(a) - (double)(b)) <= (tol), "%s: %.9g vs %.9g (tol %.3g)", (what), \
          (double)(a), (double)(b), (double)(tol))

#define TEST_DONE()                                                        \
    do {                                                                   \
        printf("%d passed, %d failed\n", td_test_passed, td_test_failed); \
        return td_test_failed ? 1 : 0;                                     \
    } while (0)

// Directory of generated test data (reference models, oracle outputs): $TANDEM_TEST_DATA or
// .cache relative to the repository root (tests run from there).
static inline const char *td_test_data_dir(void) {
    const char *d = getenv("TANDEM_TEST_DATA");
    return d && *d ? d : ".cache";
}

// A test that cannot run here: prints "SKIP: <reason>" and returns 77, which ctest shows as
// skipped (every test is registered with SKIP_RETURN_CODE 77): `return td_test_skip(...)` from
// main. A failure counted before the skip still fails (1). Only for what a machine may lack by
// design: an optional part of the build (MPI, OpenCL, CUDA, oneDNN), a device, CPU instructions,
// privileges. What scripts/test.sh always provides (the tandem binary, the generated oracle data,
// the npm oracles, node) is a prerequisite instead: td_test_need, td_test_bin.
static inline int td_test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline int td_test_skip(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("SKIP: ", stdout);
    vprintf(fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    fflush(stdout);
    if (td_test_failed) printf("%d passed, %d failed (before the skip)\n", td_test_passed, td_test_failed);
    return td_test_failed ? 1 : 77;
}

// A prerequisite file or directory: true if it exists, else a failed CHECK naming it and `how`
// (the command that makes it).
static inline bool td_test_need(const char *path, const char *how) {
    const bool ok = access(path, F_OK) == 0;
    CHECK(ok, "missing %s (%s)", path, how);
    return ok;
}

// The tandem executable: $TANDEM_BIN (ctest sets it), else build/tandem; NULL and a failed CHECK
// when it is not executable.
static inline const char *td_test_bin(void) {
    const char *b = getenv("TANDEM_BIN");
    if (!b || !*b) b = "build/tandem";
    const bool ok = access(b, X_OK) == 0;
    CHECK(ok, "no tandem executable at %s (set TANDEM_BIN; ctest does)", b);
    return ok ? b : NULL;
}

#endif
