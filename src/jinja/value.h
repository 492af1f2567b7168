// JavaScript-compatible string and number helpers for the Jinja engine (internal header; value.c).
#ifndef TD_JINJA_VALUE_H
#define TD_JINJA_VALUE_H

#include "jinja/jinja_impl.h"

size_t td_jinja_num_str(double x, char *out);    // Number#toString; out >= 32 bytes
size_t td_jinja_float_str(double x, char *out);  // jinja FloatValue#toString ("1.0", "-0.0")
size_t td_jinja_utf16_len(const char *s, size_t n);
size_t td_jinja_utf16_at(const char *s, size_t n, size_t idx, char *out);  // out >= 4 bytes
int td_jinja_utf16_cmp(const char *a, size_t na, const char *b, size_t nb);
char *td_jinja_case_map(const char *s, size_t n, int upper, size_t *outlen);  // malloc'd
void td_jinja_trim(const char *s, size_t n, int left, int right, size_t *start, size_t *end);
double td_jinja_parse_int(const char *s, size_t n);    // parseInt(s, 10), NAN if none
double td_jinja_parse_float(const char *s, size_t n);  // parseFloat(s), NAN if none

#endif
