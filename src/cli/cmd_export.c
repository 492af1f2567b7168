// `tandem export CKPT_OR_DIR --to hf|gguf -o OUT`: argument parsing over train_run.h's checkpoint
// readers (td_train_ckpt_config / td_train_ckpt_get) and model/export.h's writers. Exit status 0 on
// success, 1 on a runtime error (message on stderr), 2 on a usage error.
// Not here: any format logic (export.c), checkpoint verification (ckpt.c).
#include "cli/cmd_export.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "base/log.h"
#include "base/opts.h"
#include "model/export.h"
#include "tokenizer/tokenizer.h"
#include "train/ckpt.h"
#include "train/tok_record.h"
#include "train/train_run.h"

// The tokenizer recorded in a checkpoint's metadata, into buf: {"tokenizer": {"file":
// "tokenizer.json", "xxh3": HEX}} names the copy `tandem train` put beside the checkpoint (in
// ckpt_dir; its hash is checked), a string a path as given. NULL when none is recorded, or with
// *bad set (and the reason printed) when the recorded one cannot be used.
static const char *meta_tokenizer(const td_ckpt *ck, const char *ckpt_dir, char *buf, size_t cap, int *bad) {
    cJSON *j = cJSON_Parse(td_ckpt_meta(ck));
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "tokenizer");
    const cJSON *h = cJSON_IsObject(t) ? cJSON_GetObjectItemCaseSensitive(t, "xxh3") : NULL;
    const char *r = NULL;
    *bad = 0;
    if (cJSON_IsString(t) && t->valuestring[0] && strlen(t->valuestring) < cap) {
        snprintf(buf, cap, "%s", t->valuestring);
        r = buf;
    } else if (cJSON_IsString(h)) {
        td_err err = {0};
        if (td_tok_record_check(ckpt_dir, h->valuestring, &err)) {
            fprintf(stderr, "tandem export: %s (give --tokenizer DIR)\n", err.msg);
            *bad = 1;
        } else {
            snprintf(buf, cap, "%s", ckpt_dir);
            r = buf;
        }
    }
    cJSON_Delete(j);
    return r;
}

// Creates the parent directories of path (as mkdir -p of its dirname); errors surface on write.
static void make_parents(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *q = buf + 1; *q; q++) {
        if (*q != '/') continue;
        *q = 0;
        mkdir(buf, 0777);
        *q = '/';
    }
}

int td_cmd_export(int argc, char **argv) {
    const char *src = NULL, *out = NULL, *to = "hf", *type_s = NULL, *tok = NULL, *name = NULL;
    char all[160], hf_types[64], type_help[400];  // the type lists from export.c's table
    td_export_type_list(all, sizeof all, false);
    td_export_type_list(hf_types, sizeof hf_types, true);
    snprintf(type_help, sizeof type_help,
             "hf: %s (default f32);\ngguf: %s\n(default f16; matrices in T, norms stay f32)", hf_types, all);
    const td_opt opts[] = {
        {TD_OPT_S("to", &to, "hf|gguf", "output format (default hf)")},
        {TD_OPT_S("out", &out, "PATH", "output directory (hf) or .gguf file"), .shorts = "o"},
        {TD_OPT_S("type", &type_s, "T", type_help)},
        {TD_OPT_S("tokenizer", &tok, "PATH",
                  "tokenizer directory or tokenizer.json to copy / embed (default: the\n"
                  "one the checkpoint records; refused when none is known)")},
        {TD_OPT_S("name", &name, "NAME", "GGUF general.name (default: tandem)")},
    };
    const td_opts ot = {.prog = "tandem export",
                        .usage = "usage: tandem export CKPT --to hf|gguf -o OUT [--type T] [--tokenizer DIR] [--name NAME]\n"
                                 "  CKPT                      a checkpoint file (ckpt-<step>.tdck), a sharded checkpoint (the\n"
                                 "                            ckpt-<step> directory a data-parallel run writes), or a\n"
                                 "                            checkpoint directory (its newest checkpoint that verifies)\n",
                        .opts = opts,
                        .n = (int)(sizeof opts / sizeof opts[0]),
                        .max_pos = 1};
    int n_pos = 0, pr = td_opts_parse(&ot, argc, argv, &n_pos);
    if (pr <= 0) return pr == 0 ? 0 : 2;
    if (n_pos) src = argv[1];
    if (!src || !out) {
        fprintf(stderr, "tandem export: %s\n", !src ? "no checkpoint given" : "no output given (-o PATH)");
        td_opts_help(&ot, stderr);
        return 2;
    }
    bool hf = !strcmp(to, "hf");
    if (!hf && strcmp(to, "gguf")) {
        fprintf(stderr, "tandem export: --to must be hf or gguf, not '%s'\n", to);
        return 2;
    }
    int t = type_s ? td_export_parse_type(type_s) : (hf ? TD_F32 : TD_F16);
    if (t < 0) {
        fprintf(stderr, "tandem export: unknown type '%s' (%s)\n", type_s, all);
        return 2;
    }
    if (hf && !td_export_type_hf(t)) {
        fprintf(stderr, "tandem export: a model directory holds %s, not %s\n", hf_types, type_s);
        return 2;
    }

    td_err err = {0};
    td_ckpt *ck = NULL;
    td_status st;
    int64_t step = -1;
    char manifest[1100];
    snprintf(manifest, sizeof manifest, "%s/manifest.json", src);
    if (td_is_dir(src) && td_file_exists(manifest)) {  // one sharded checkpoint (data parallel)
        st = td_ckpt_open(src, &ck, &err);
    } else if (td_is_dir(src)) {
        st = td_ckpt_dir_load_latest(src, &ck, &step, &err);
    } else if (td_file_exists(src)) {
        st = td_ckpt_open(src, &ck, &err);
    } else {
        fprintf(stderr, "tandem export: %s: no such file or directory\n", src);
        return 1;
    }
    if (st) {
        fprintf(stderr, "tandem export: %s\n", err.msg);
        return 1;
    }
    td_model_config cfg;
    st = td_train_ckpt_config(ck, &cfg, &err);
    if (st) {
        fprintf(stderr, "tandem export: %s: %s\n", src, err.msg);
        td_ckpt_close(ck);
        return 1;
    }

    td_export_params p = td_export_default_params();
    p.type = (td_dtype)t;
    p.name = name ? name : "tandem";
    char tbuf[4096], ckdir[4096];
    // The directory `tandem train` wrote into: src itself, else the file's (or the sharded
    // checkpoint directory's) parent.
    size_t sn = strlen(src);
    while (sn > 1 && src[sn - 1] == '/') sn--;
    const char *sl = NULL;
    for (size_t k = 0; k < sn; k++)
        if (src[k] == '/') sl = src + k;
    if (td_is_dir(src) && !td_file_exists(manifest)) snprintf(ckdir, sizeof ckdir, "%.*s", (int)sn, src);
    else snprintf(ckdir, sizeof ckdir, "%.*s", sl ? (int)(sl - src) : 1, sl ? src : ".");
    int bad_tok = 0;
    p.tokenizer = tok ? tok : meta_tokenizer(ck, ckdir, tbuf, sizeof tbuf, &bad_tok);
    if (!p.tokenizer) {  // a model without its tokenizer cannot be served or used: refuse
        if (!bad_tok)
            fprintf(stderr,
                    "tandem export: no tokenizer known: %s records none (its shards had no tokenizer.json beside "
                    "them); give --tokenizer DIR\n",
                    src);
        td_ckpt_close(ck);
        return 1;
    }
    if (p.tokenizer && !td_is_dir(p.tokenizer) && !td_file_exists(p.tokenizer)) {
        fprintf(stderr, "tandem export: tokenizer %s: no such file or directory\n", p.tokenizer);
        td_ckpt_close(ck);
        return tok ? 2 : 1;
    }
    {
        // A model trained from scratch knows no special-token ids: take them from the tokenizer
        // (config.json / generation_config.json then carry bos_token_id and eos_token_id), and
        // check the tokenizer fits the embedding.
        td_tokenizer *tk = NULL;
        if (td_tokenizer_load(p.tokenizer, &tk, &err)) {
            fprintf(stderr, "tandem export: %s\n", err.msg);
            td_ckpt_close(ck);
            return 1;
        }
        int tv = td_tokenizer_vocab_size(tk), bos = td_tokenizer_bos_id(tk), eos = td_tokenizer_eos_id(tk);
        td_tokenizer_free(tk);
        if (tv > cfg.vocab_size) {
            fprintf(stderr, "tandem export: tokenizer %s has %d tokens, the model's vocabulary only %d\n",
                    p.tokenizer, tv, cfg.vocab_size);
            td_ckpt_close(ck);
            return 1;
        }
        if (cfg.bos_id < 0 && bos >= 0) cfg.bos_id = bos;
        if (cfg.n_eos == 0 && eos >= 0) cfg.eos_ids[0] = eos, cfg.n_eos = 1;
    }

    make_parents(out);
    double t0 = td_now();
    st = hf ? td_export_hf(out, &cfg, &p, td_train_ckpt_get, ck, &err)
            : td_export_gguf(out, &cfg, &p, td_train_ckpt_get, ck, &err);
    td_ckpt_close(ck);
    if (st) {
        fprintf(stderr, "tandem export: %s\n", err.msg);
        return 1;
    }
    if (step >= 0)
        fprintf(stderr, "tandem export: %s: newest valid checkpoint is step %lld\n", src, (long long)step);
    fprintf(stderr, "tandem export: wrote %s (%s, %s) in %.2f s\n", out, hf ? "model directory" : "GGUF",
            (int)p.type == TD_EXPORT_Q4_K_M ? "Q4_K_M" : td_dtype_name(p.type), td_now() - t0);
    return 0;
}
