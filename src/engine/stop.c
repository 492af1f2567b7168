// Stop-string matcher (see stop.h). One allocation: the struct, the string table, the bytes of the
// strings and the held-back tail. Matching is naive (n strings x short text): stop lists are tiny.
#include "engine/stop.h"

#include <stdlib.h>
#include <string.h>

struct td_stop {
    int n;
    size_t max_len;      // longest stop string, bytes
    const char **str;    // [n], point into this allocation
    size_t *len;         // [n]
    char *held;          // [max_len] the tail that may still start a stop string
    size_t held_len;
    bool stopped;
};

td_stop *td_stop_create(const char *const *stops, const size_t *lens, int n, td_err *err) {
    if (n < 0 || n > TD_STOP_MAX_STRINGS) {
        td_err_set(err, TD_ERR_LIMIT, "stop: %d strings (at most %d)", n, TD_STOP_MAX_STRINGS);
        return NULL;
    }
    size_t bytes = 0, max_len = 0;
    int kept = 0;
    for (int i = 0; i < n; i++) {
        size_t l = lens ? lens[i] : (stops[i] ? strlen(stops[i]) : 0);
        if (l == 0) continue;
        if (l > TD_STOP_MAX_LEN) {
            td_err_set(err, TD_ERR_LIMIT, "stop: string %d is %zu bytes (at most %d)", i, l, TD_STOP_MAX_LEN);
            return NULL;
        }
        bytes += l;
        if (l > max_len) max_len = l;
        kept++;
    }
    size_t total = sizeof(td_stop) + (size_t)kept * (sizeof(char *) + sizeof(size_t)) + bytes + max_len + 1;
    char *mem = malloc(total);
    if (!mem) {
        td_err_set(err, TD_ERR_NOMEM, "stop: out of memory");
        return NULL;
    }
    td_stop *s = (td_stop *)mem;
    char *p = mem + sizeof(td_stop);
    s->str = (const char **)p;
    p += (size_t)kept * sizeof(char *);
    s->len = (size_t *)p;
    p += (size_t)kept * sizeof(size_t);
    s->n = 0;
    for (int i = 0; i < n; i++) {
        size_t l = lens ? lens[i] : (stops[i] ? strlen(stops[i]) : 0);
        if (l == 0) continue;
        memcpy(p, stops[i], l);
        s->str[s->n] = p;
        s->len[s->n] = l;
        s->n++;
        p += l;
    }
    s->held = p;
    s->max_len = max_len;
    s->held_len = 0;
    s->stopped = false;
    return s;
}

void td_stop_free(td_stop *s) { free(s); }

size_t td_stop_max_hold(const td_stop *s) { return s->max_len ? s->max_len - 1 : 0; }

void td_stop_reset(td_stop *s) {
    s->held_len = 0;
    s->stopped = false;
}

size_t td_stop_feed(td_stop *s, const char *piece, size_t len, char *out, size_t cap, bool *stopped,
                    int *which) {
    *stopped = false;
    if (which) *which = -1;
    if (s->stopped) {
        *stopped = true;
        return 0;
    }
    size_t total = s->held_len + len;
    if (cap < total) return (size_t)-1;
    memcpy(out, s->held, s->held_len);
    if (len) memcpy(out + s->held_len, piece, len);
    s->held_len = 0;
    // Earliest complete occurrence of any stop string (the held tail alone never holds one).
    size_t best = total;
    int best_i = -1;
    for (int i = 0; i < s->n; i++) {
        size_t l = s->len[i];
        if (l > total) continue;
        for (size_t at = 0; at + l <= total && at < best; at++) {
            if (out[at] == s->str[i][0] && memcmp(out + at, s->str[i], l) == 0) {
                best = at;
                best_i = i;
                break;
            }
        }
    }
    if (best_i >= 0) {
        s->stopped = true;
        *stopped = true;
        if (which) *which = best_i;
        return best;
    }
    // Longest proper suffix of out that is a prefix of some stop string: hold it back.
    size_t hold = 0;
    for (int i = 0; i < s->n; i++) {
        size_t l = s->len[i];
        size_t k = l - 1 < total ? l - 1 : total;
        for (; k > hold; k--) {
            if (memcmp(out + total - k, s->str[i], k) == 0) {
                hold = k;
                break;
            }
        }
    }
    memcpy(s->held, out + total - hold, hold);
    s->held_len = hold;
    return total - hold;
}

size_t td_stop_flush(td_stop *s, char *out, size_t cap) {
    size_t n = s->held_len <= cap ? s->held_len : cap;
    memcpy(out, s->held, n);
    s->held_len = 0;
    return n;
}
