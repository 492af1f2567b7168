// Jinja templates: an engine written to render byte-identically to @huggingface/jinja (the engine of
// transformers.js), quirks included, for the `chat_template` of tokenizer_config.json; the chat glue
// (messages, bos/eos, the generation prompt) is tokenizer/chat_template.h. Depends on base/ only.
// It is not full Jinja2: no autoescape, no inheritance/include, no user-supplied filters or tests.
// Known differences from the original: `**` with non-integer or huge results may differ in the last
// digit (V8 uses fdlibm's pow, we use libm's); tojson(sort_keys=true) orders keys by UTF-16 code units
// where JS uses localeCompare; strftime_now() uses the C library's local time; a lone UTF-16
// surrogate (e.g. from indexing into an emoji) is emitted as its 3-byte encoding.
#ifndef TD_JINJA_JINJA_H
#define TD_JINJA_JINJA_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "base/status.h"

// A compiled template: immutable after compile, so any number of threads may render it at once.
typedef struct td_jinja_template td_jinja_template;

// Caps that keep a hostile or buggy template from running away. Exceeding one is TD_ERR_LIMIT.
typedef struct td_jinja_limits {
    size_t max_output;  // bytes of rendered text
    size_t max_memory;  // bytes of scratch memory (strings, lists, scopes) per render
    size_t max_steps;   // evaluated nodes per render (bounds loops)
    int max_depth;      // nested evaluation depth (macro recursion, deep expressions); the default
                        // (400) needs about 256 KiB of thread stack in an optimised build
} td_jinja_limits;

// Defaults: 64 MiB output, 512 MiB scratch, 50M steps, depth 400.
td_jinja_limits td_jinja_default_limits(void);

// Compiles src[0..len) (UTF-8; need not be NUL-terminated). Syntax errors return TD_ERR_INVALID with
// "line L, column C" (1-based, counted in the original source) in err. On success *out is owned by the
// caller (td_jinja_free). Preprocessing matches @huggingface/jinja's Template: one trailing newline
// dropped, lstrip_blocks and trim_blocks on, {% generation %} tags removed.
td_status td_jinja_compile(const char *src, size_t len, td_jinja_template **out, td_err *err);

// Renders with the variables of ctx, a cJSON object (for a chat template: messages,
// add_generation_prompt, bos_token, eos_token, tools, ... anything; ctx may be NULL). ctx is only
// read. On success *out is a malloc'd, NUL-terminated string the caller frees and *len (if non-NULL)
// its length. On failure *out is NULL and err says why: TD_ERR_INVALID for template errors,
// including raise_exception('msg') (message "raise_exception: msg"), TD_ERR_LIMIT for a cap,
// TD_ERR_NOMEM for allocation failure.
td_status td_jinja_render(const td_jinja_template *t, const cJSON *ctx, char **out, size_t *len, td_err *err);
td_status td_jinja_render_limits(const td_jinja_template *t, const cJSON *ctx, const td_jinja_limits *limits,
                                 char **out, size_t *len, td_err *err);

void td_jinja_free(td_jinja_template *t);

#endif
