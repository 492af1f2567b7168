// Tiny test harness shared by the unit tests: CHECK counts failures and keeps going;
// TEST_DONE prints "N passed, N failed" and returns non-zero when anything failed.
#ifndef TD_TEST_UTIL_H
#define TD_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

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

#endif
