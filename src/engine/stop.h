// Stop-string matcher for streamed text: text arrives in pieces (one detokenized token at a time) and a
// stop string may straddle pieces. The matcher holds back the longest tail that could still start a stop
// string, emits everything before it, and reports a stop (excluding the stop string, as OpenAI does).
// It is not a detokenizer: partial UTF-8 sequences are the caller's business. Stop *token ids* are the
// sampler loop's business, not this file's.
#ifndef TD_ENGINE_STOP_H
#define TD_ENGINE_STOP_H

#include <stdbool.h>
#include <stddef.h>
#include "base/status.h"

#define TD_STOP_MAX_STRINGS 16    // OpenAI allows 4; vLLM more. Requests beyond are rejected upstream.
#define TD_STOP_MAX_LEN     1024  // bytes per stop string

typedef struct td_stop td_stop;

// Copies the n stop strings (lens[i] bytes each; lens may be NULL for NUL-terminated strings) into one
// allocation that also holds the held-back tail. Empty strings are ignored. n == 0 gives a matcher that
// never stops and holds nothing. Returns NULL with err set on a limit violation or out of memory.
// The caller owns the result and frees it with td_stop_free.
td_stop *td_stop_create(const char *const *stops, const size_t *lens, int n, td_err *err);
void td_stop_free(td_stop *s);

// Most bytes td_stop_feed can hold back (longest stop string - 1). An out buffer of
// piece_len + td_stop_max_hold(s) bytes is always large enough for td_stop_feed.
size_t td_stop_max_hold(const td_stop *s);

// Feeds one piece. Writes the text that may be emitted now into out (cap bytes, must be at least
// len + td_stop_max_hold(s)) and returns its length. *stopped becomes true when a stop string
// completed: out then holds the text before it, and the matcher must not be fed again (later calls
// return 0). *which (if non-NULL) receives the index of the stop string that matched, else -1.
// Returns (size_t)-1 if cap is too small (nothing consumed).
size_t td_stop_feed(td_stop *s, const char *piece, size_t len, char *out, size_t cap, bool *stopped,
                    int *which);

// Releases the held-back tail at the end of generation (length or EOS finish): copies it into out
// (cap >= td_stop_max_hold(s)) and returns its length; the matcher is then empty.
size_t td_stop_flush(td_stop *s, char *out, size_t cap);

// Resets to the initial state (no held text, not stopped) keeping the stop strings.
void td_stop_reset(td_stop *s);

#endif
