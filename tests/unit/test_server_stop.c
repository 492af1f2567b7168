// Stop-string matcher (src/engine/stop.c) against a brute-force oracle over the whole text: random
// texts over a tiny alphabet (so stops occur and straddle pieces), random piece splits.
#include <string.h>
#include "engine/stop.h"
#include "test_util.h"

static unsigned rng_state = 12345;
static unsigned rnd(void) {
    rng_state = rng_state * 1103515245u + 12345u;
    return (rng_state >> 16) & 0x7fff;
}

// Oracle: the earliest position where any stop string starts a full match; total length if none.
static size_t oracle_cut(const char *t, size_t n, const char **stops, int ns, int *hit) {
    *hit = 0;
    for (size_t at = 0; at < n; at++)
        for (int i = 0; i < ns; i++) {
            size_t l = strlen(stops[i]);
            if (l && at + l <= n && memcmp(t + at, stops[i], l) == 0) {
                *hit = 1;
                return at;
            }
        }
    return n;
}

// Oracle of the held-back length after a prefix of n bytes (no stop yet).
static size_t oracle_hold(const char *t, size_t n, const char **stops, int ns) {
    size_t hold = 0;
    for (int i = 0; i < ns; i++) {
        size_t l = strlen(stops[i]);
        for (size_t k = 1; k < l && k <= n; k++)
            if (memcmp(t + n - k, stops[i], k) == 0 && k > hold) hold = k;
    }
    return hold;
}

int main(void) {
    td_err err;
    // Simple cases.
    {
        const char *stops[] = {"\n\n", "END"};
        td_stop *s = td_stop_create(stops, NULL, 2, &err);
        CHECK(s != NULL, "create: %s", err.msg);
        char out[64];
        bool st;
        int which;
        size_t n = td_stop_feed(s, "Hello E", 7, out, sizeof out, &st, &which);
        CHECK(n == 6 && !st && memcmp(out, "Hello ", 6) == 0, "held 'E' (got %zu)", n);
        n = td_stop_feed(s, "N", 1, out, sizeof out, &st, &which);
        CHECK(n == 0 && !st, "held 'EN'");
        n = td_stop_feed(s, "Dx", 2, out, sizeof out, &st, &which);
        CHECK(n == 0 && st && which == 1, "stop END across 3 pieces (n=%zu st=%d which=%d)", n, st, which);
        n = td_stop_feed(s, "more", 4, out, sizeof out, &st, &which);
        CHECK(n == 0 && st, "after stop nothing is emitted");
        td_stop_reset(s);
        n = td_stop_feed(s, "a\n", 2, out, sizeof out, &st, &which);
        CHECK(n == 1 && !st, "hold newline");
        n = td_stop_flush(s, out, sizeof out);
        CHECK(n == 1 && out[0] == '\n', "flush releases held newline");
        n = td_stop_feed(s, "abc", 3, out, 2, &st, &which);
        CHECK(n == (size_t)-1, "too-small out buffer is reported");
        td_stop_free(s);
    }
    {
        // Limits.
        const char *many[TD_STOP_MAX_STRINGS + 1];
        for (int i = 0; i <= TD_STOP_MAX_STRINGS; i++) many[i] = "x";
        CHECK(td_stop_create(many, NULL, TD_STOP_MAX_STRINGS + 1, &err) == NULL && err.status == TD_ERR_LIMIT,
              "too many stop strings rejected");
        td_stop *s = td_stop_create(NULL, NULL, 0, &err);
        char out[16];
        bool st;
        CHECK(s && td_stop_max_hold(s) == 0, "no stops: nothing held");
        CHECK(td_stop_feed(s, "abc", 3, out, sizeof out, &st, NULL) == 3 && !st, "no stops: passthrough");
        td_stop_free(s);
    }
    // Random texts against the oracle.
    const char *sets[][3] = {{"ab", "aab", "b b"}, {"aaa", "ba", ""}, {"abab", "bb", "a a"}};
    int fails = 0;
    for (int trial = 0; trial < 3000; trial++) {
        const char **stops = sets[trial % 3];
        int ns = 3;
        char text[64];
        size_t n = 1 + rnd() % 40;
        for (size_t i = 0; i < n; i++) text[i] = "ab "[rnd() % 3];
        int hit;
        size_t cut = oracle_cut(text, n, stops, ns, &hit);
        td_stop *s = td_stop_create(stops, NULL, ns, &err);
        char got[128], out[128];
        size_t got_n = 0, pos = 0;
        bool st = false;
        while (pos < n && !st) {
            size_t len = 1 + rnd() % 5;
            if (pos + len > n) len = n - pos;
            size_t e = td_stop_feed(s, text + pos, len, out, sizeof out, &st, NULL);
            memcpy(got + got_n, out, e);
            got_n += e;
            pos += len;
            if (!st && got_n != pos - oracle_hold(text, pos, stops, ns)) fails++;  // holds minimally
        }
        if (!st) got_n += td_stop_flush(s, got + got_n, sizeof got - got_n);
        if (st != (hit != 0) || got_n != cut || memcmp(got, text, cut) != 0) {
            if (fails < 5)
                fprintf(stderr, "trial %d: text '%.*s' want %zu (hit %d) got %zu (st %d)\n", trial, (int)n, text,
                        cut, hit, got_n, st);
            fails++;
        }
        td_stop_free(s);
    }
    CHECK(fails == 0, "%d random trials disagree with the oracle", fails);
    TEST_DONE();
}
