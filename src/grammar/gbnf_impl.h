// Shared by the GBNF writers (gbnf_json.c, gbnf_regex.c): a growable text buffer and literal
// quoting. Not a public interface.
#ifndef TD_GRAMMAR_GBNF_IMPL_H
#define TD_GRAMMAR_GBNF_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include "base/status.h"

typedef struct gb_buf {
    char *p;
    size_t n, cap;
    bool oom;
} gb_buf;

void gb_put(gb_buf *b, const char *s, size_t n);
void gb_puts(gb_buf *b, const char *s);
void gb_printf(gb_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Appends s (n bytes) as a GBNF string literal "..." (escapes ", \ and control bytes).
void gb_literal(gb_buf *b, const char *s, size_t n);
bool gb_prefix_ok(const char *prefix, td_err *err);

// The regex as a GBNF expression (no rule around it). json: the expression produces the text as it
// appears inside a JSON string (", \ and control characters escaped; classes drop them). search:
// JSON schema's unanchored semantics (a match anywhere, unless ^ / $ anchor it).
bool gb_regex_expr(gb_buf *out, const char *re, bool json, bool search, const char *prefix, td_err *err);

#endif
