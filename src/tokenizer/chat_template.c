// The chat-template glue on jinja/: a conversation's variables, built as transformers' (and vLLM's)
// apply_chat_template builds them, and the choice of template in a tokenizer_config.json. The
// template language is jinja/; nothing here parses or evaluates templates.
#include "tokenizer/chat_template.h"

#include <stdlib.h>
#include <string.h>

// Joins text parts ([{type: text, text}]) into one string, as vLLM does for string templates.
static cJSON *normalize_messages(const cJSON *messages) {
    cJSON *m = cJSON_Duplicate(messages, 1);
    if (!m) return NULL;
    for (cJSON *msg = m->child; msg; msg = msg->next) {
        cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content");
        if (!cJSON_IsArray(c)) continue;
        size_t n = 0;
        for (cJSON *p = c->child; p; p = p->next) {
            cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
            if (cJSON_IsString(t)) n += strlen(t->valuestring);
        }
        char *s = malloc(n + 1);
        if (!s) {
            cJSON_Delete(m);
            return NULL;
        }
        n = 0;
        for (cJSON *p = c->child; p; p = p->next) {
            cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
            if (cJSON_IsString(t)) {
                size_t k = strlen(t->valuestring);
                memcpy(s + n, t->valuestring, k);
                n += k;
            }
        }
        s[n] = 0;
        cJSON_ReplaceItemInObjectCaseSensitive(msg, "content", cJSON_CreateString(s));
        free(s);
    }
    return m;
}

td_status td_chat_template_apply(const td_jinja_template *t, const td_chat_params *p, char **out, size_t *len,
                                 td_err *err) {
    if (!out) return td_err_set(err, TD_ERR_INVALID, "chat template: NULL output");
    *out = NULL;
    if (!t || !p || !p->messages) return td_err_set(err, TD_ERR_INVALID, "chat template: NULL template or messages");
    cJSON *c = cJSON_CreateObject();
    cJSON *msgs = normalize_messages(p->messages);
    if (!c || !msgs) {
        cJSON_Delete(c);
        cJSON_Delete(msgs);
        return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    }
    cJSON_AddItemToObject(c, "messages", msgs);
    cJSON_AddBoolToObject(c, "add_generation_prompt", p->add_generation_prompt);
    cJSON_AddStringToObject(c, "bos_token", p->bos_token ? p->bos_token : "");
    cJSON_AddStringToObject(c, "eos_token", p->eos_token ? p->eos_token : "");
    const char *extra_name[] = {"tools", "documents"};
    const cJSON *extra[] = {p->tools, p->documents};
    for (int i = 0; i < 2; i++)
        if (extra[i] && !cJSON_IsNull(extra[i])) cJSON_AddItemToObject(c, extra_name[i], cJSON_Duplicate(extra[i], 1));
    if (cJSON_IsObject(p->kwargs))
        for (const cJSON *x = p->kwargs->child; x; x = x->next)
            if (x->string && !cJSON_GetObjectItemCaseSensitive(c, x->string))
                cJSON_AddItemToObject(c, x->string, cJSON_Duplicate(x, 1));
    td_status st = td_jinja_render(t, c, out, len, err);
    cJSON_Delete(c);
    return st;
}

td_status td_chat_template_pick(const cJSON *cfg, const char *name, int want_tools, const char **src, td_err *err) {
    if (!src) return td_err_set(err, TD_ERR_INVALID, "chat template: NULL output");
    *src = NULL;
    const cJSON *ct = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "chat_template") : NULL;
    if (!ct || cJSON_IsNull(ct))
        return td_err_set(err, TD_ERR_NOT_FOUND,
                          "the tokenizer config has no chat_template; pass a template explicitly (--chat-template FILE)");
    if (cJSON_IsString(ct)) {
        if (name && strcmp(name, "default") != 0)
            return td_err_set(err, TD_ERR_NOT_FOUND, "the tokenizer config has a single chat_template, not one named '%s'", name);
        *src = ct->valuestring;
        return TD_OK;
    }
    if (!cJSON_IsArray(ct)) return td_err_set(err, TD_ERR_FORMAT, "chat_template is neither a string nor a list");
    const char *want = name ? name : NULL;
    const cJSON *item, *found = NULL, *dflt = NULL, *tool = NULL;
    cJSON_ArrayForEach(item, ct) {
        const char *n = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(item, "name"));
        const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(item, "template"));
        if (!n || !t) return td_err_set(err, TD_ERR_FORMAT, "chat_template list entries need string name and template");
        if (want && strcmp(n, want) == 0) found = item;
        if (strcmp(n, "default") == 0) dflt = item;
        if (strcmp(n, "tool_use") == 0) tool = item;
    }
    if (want && !found) return td_err_set(err, TD_ERR_NOT_FOUND, "the tokenizer config has no chat template named '%s'", want);
    if (!found) found = want_tools && tool ? tool : dflt;
    if (!found)
        return td_err_set(err, TD_ERR_NOT_FOUND,
                          "the tokenizer config has several chat templates and no 'default'; name one or pass --chat-template FILE");
    *src = cJSON_GetObjectItemCaseSensitive(found, "template")->valuestring;
    return TD_OK;
}
