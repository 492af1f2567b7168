// Chat templates: a model's Jinja template (jinja/jinja.h) applied to a conversation as
// transformers' apply_chat_template does: the variables a template expects (messages,
// add_generation_prompt, bos_token, eos_token, tools, documents, extra keyword arguments), and the
// choice among the templates of a tokenizer_config.json. The template language itself is jinja/.
#ifndef TD_TOKENIZER_CHAT_TEMPLATE_H
#define TD_TOKENIZER_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "base/status.h"
#include "jinja/jinja.h"

// One conversation to render. Everything is borrowed and only read.
typedef struct td_chat_params {
    const cJSON *messages;       // [{role, content, ...}]; a content given as a list of parts
                                 // ([{type: text, text}]) is joined into one string, as vLLM does
    bool add_generation_prompt;  // end with the assistant's header
    const char *bos_token;       // NULL: ""
    const char *eos_token;       // NULL: ""
    const cJSON *tools;          // NULL or JSON null: no `tools` variable
    const cJSON *documents;      // NULL or JSON null: no `documents` variable
    const cJSON *kwargs;         // an object of extra variables (chat_template_kwargs); never
                                 // replaces one of the above. NULL or not an object: none
} td_chat_params;

// Renders t (td_jinja_compile of the model's template) with p's variables and the default limits.
// On success *out is a malloc'd, NUL-terminated string the caller frees and *len (if non-NULL) its
// length; on failure *out is NULL and err says why (td_jinja_render's codes; TD_ERR_INVALID for
// NULL t, p or messages).
td_status td_chat_template_apply(const td_jinja_template *t, const td_chat_params *p, char **out, size_t *len,
                                 td_err *err);

// Picks the template source from a parsed tokenizer_config.json, as transformers.js does: its
// "chat_template" is a string, or a list of {"name", "template"} from which `name` is taken when given,
// else "tool_use" when want_tools and present, else "default". *src points into cfg (not copied).
// TD_ERR_NOT_FOUND (message says to pass a template explicitly, e.g. --chat-template) when the config
// has no template or the named one is missing; TD_ERR_FORMAT when chat_template has the wrong shape.
td_status td_chat_template_pick(const cJSON *tokenizer_config, const char *name, int want_tools, const char **src,
                                td_err *err);

#endif
