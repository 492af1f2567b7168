// `tandem convert` and `tandem quantize`: thin argument parsing over model/export.h. Exit status 0
// on success, 1 on a runtime error (message on stderr), 2 on a usage error.
// Not here: any format logic (model/export.c, format/gguf_write.c, format/safetensors_write.c).
#include "cli/cmd_convert.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/opts.h"
#include "base/log.h"
#include "format/gguf.h"
#include "model/export.h"
#include "model/model.h"

// Parses "123", "64K", "500M", "5G", "5GB" (powers of 1000, as transformers does) into bytes.
static int parse_size(const char *s, unsigned long long *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v > 0)) return 0;
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1e3, end++;
    else if (*end == 'M' || *end == 'm') mul = 1e6, end++;
    else if (*end == 'G' || *end == 'g') mul = 1e9, end++;
    if ((*end == 'B' || *end == 'b') && end[1] == 0) end++;
    if (*end) return 0;
    *out = (unsigned long long)(v * mul);
    return 1;
}

static const char *base_name(const char *p, char *buf, size_t cap) {
    snprintf(buf, cap, "%s", p);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = 0;
    const char *s = strrchr(buf, '/');
    return s ? s + 1 : buf;
}

int td_cmd_convert(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *to = "gguf", *type_s = NULL, *tok = NULL, *name = NULL, *shard = NULL;
    char all[160], hf_types[64], type_help[400], usage[800];  // the type lists from export.c's table
    td_export_type_list(all, sizeof all, false);
    td_export_type_list(hf_types, sizeof hf_types, true);
    snprintf(type_help, sizeof type_help,
             "tensor type: GGUF %s\n(default f16; matrices in T, norms and biases stay f32; q4_k_m:\n"
             "llama.cpp's mix); hf %s (default f32)",
             all, hf_types);
    snprintf(usage, sizeof usage,
             "usage: tandem convert MODEL -o OUT.gguf [--type T] [options]\n"
             "       tandem convert MODEL --to hf -o DIR [--type T] [options]\n"
             "  MODEL                     model directory (config.json + safetensors) or .gguf file\n"
             "  T                         gguf: %s; hf: %s\n",
             all, hf_types);
    const td_opt opts[] = {
        {TD_OPT_S("out", &out, "PATH", "output GGUF file, or directory with --to hf"), .aliases = "outfile", .shorts = "o"},
        {TD_OPT_S("to", &to, "gguf|hf", "output format (default gguf)")},
        {TD_OPT_S("type", &type_s, "T", type_help), .aliases = "outtype"},
        {TD_OPT_S("tokenizer", &tok, "PATH",
                  "tokenizer directory or tokenizer.json (default: MODEL's own, when\n"
                  "MODEL is a directory)")},
        {TD_OPT_S("name", &name, "NAME", "GGUF general.name (default: the model directory's name)")},
        {TD_OPT_S("max-shard-size", &shard, "N", "hf: split safetensors beyond N bytes (suffixes K, M, G; e.g. 5G)")},
    };
    const td_opts ot = {.prog = "tandem convert",
                        .usage = usage,
                        .opts = opts,
                        .n = (int)(sizeof opts / sizeof opts[0]),
                        .max_pos = 1};
    int n_pos = 0, pr = td_opts_parse(&ot, argc, argv, &n_pos);
    if (pr <= 0) return pr == 0 ? 0 : 2;
    if (n_pos) model = argv[1];
    if (!model || !out) {
        fprintf(stderr, "tandem convert: %s\n", !model ? "no MODEL given" : "no output given (-o PATH)");
        td_opts_help(&ot, stderr);
        return 2;
    }
    bool hf = !strcmp(to, "hf");
    if (!hf && strcmp(to, "gguf")) {
        fprintf(stderr, "tandem convert: --to must be gguf or hf, not '%s'\n", to);
        return 2;
    }
    td_export_params p = td_export_default_params();
    int t = type_s ? td_export_parse_type(type_s) : (hf ? TD_F32 : TD_F16);
    if (t < 0) {
        fprintf(stderr, "tandem convert: unknown type '%s' (%s)\n", type_s, all);
        return 2;
    }
    if (hf && !td_export_type_hf(t)) {
        fprintf(stderr, "tandem convert: a model directory holds %s, not %s\n", hf_types, type_s);
        return 2;
    }
    p.type = (td_dtype)t;
    if (shard) {
        unsigned long long b;
        if (!hf || !parse_size(shard, &b)) {
            fprintf(stderr, "tandem convert: --max-shard-size %s: %s\n", shard,
                    hf ? "expected a size such as 500M or 5G" : "only applies to --to hf");
            return 2;
        }
        p.max_shard_bytes = b;
    }
    if (!td_is_dir(model) && !td_file_exists(model)) {
        fprintf(stderr, "tandem convert: %s: no such file or directory\n", model);
        return 1;
    }
    char nbuf[1024];
    p.name = name ? name : base_name(model, nbuf, sizeof nbuf);
    char tjson[4096];
    if (tok) p.tokenizer = tok;
    else if (td_is_dir(model) && td_path_join(tjson, sizeof tjson, model, "tokenizer.json") && td_file_exists(tjson))
        p.tokenizer = model;

    td_err err = {0};
    td_model *m = NULL;
    td_status st = td_model_load(model, &m, &err);
    if (st) {
        fprintf(stderr, "tandem convert: %s\n", err.msg);
        return 1;
    }
    double t0 = td_now();
    if (hf) {
        if (td_tensor_present(&m->rope_freqs)) {
            fprintf(stderr, "tandem convert: %s: rope_freqs.weight (llama3 rope scaling) has no config.json form that "
                    "tandem can recover; convert from the original model directory instead\n", model);
            td_model_free(m);
            return 1;
        }
        st = td_export_hf(out, &m->cfg, &p, td_export_model_get, m, &err);
        if (!st && !p.tokenizer && !td_is_dir(model)) {
            // No tokenizer.json to copy: rebuild one from the GGUF vocabulary when it is byte-level.
            td_gguf *g = NULL;
            td_err terr = {0};
            td_status ts = td_gguf_open(model, &g, &terr);
            if (!ts) ts = td_export_tokenizer_json(g, out, m->cfg.max_pos, &terr);
            td_gguf_close(g);
            if (ts)
                fprintf(stderr, "tandem convert: note: no tokenizer files written (%s); give --tokenizer DIR to copy "
                        "them\n", terr.msg);
        } else if (!st && !p.tokenizer) {
            fprintf(stderr, "tandem convert: note: no tokenizer files written (give --tokenizer DIR to copy them)\n");
        }
    } else {
        if (!p.tokenizer)
            fprintf(stderr, "tandem convert: warning: no tokenizer (give --tokenizer); the GGUF will have no "
                    "vocabulary and llama.cpp will not load it\n");
        st = td_export_gguf(out, &m->cfg, &p, td_export_model_get, m, &err);
    }
    td_model_free(m);
    if (st) {
        fprintf(stderr, "tandem convert: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "tandem convert: wrote %s (%s, %s) in %.2f s\n", out, hf ? "model directory" : "GGUF",
            (int)p.type == TD_EXPORT_Q4_K_M ? "Q4_K_M" : td_dtype_name(p.type), td_now() - t0);
    return 0;
}

int td_cmd_quantize(int argc, char **argv) {
    bool requant = false;  // accepted for llama.cpp compatibility
    char all[160], usage[600];  // the type list from export.c's table
    td_export_type_list(all, sizeof all, false);
    snprintf(usage, sizeof usage,
             "usage: tandem quantize IN.gguf OUT.gguf TYPE\n"
             "  TYPE: %s (q4_k_m: llama.cpp's mix).\n"
             "  Every tensor is dequantized to f32 and re-encoded: matrices in TYPE, vectors (norms, biases,\n"
             "  rope_freqs) in f32. Metadata is copied.\n",
             all);
    const td_opt opts[] = {
        {TD_OPT_B("allow-requantize", &requant, "accepted for llama.cpp compatibility (quantized inputs always are)")},
    };
    const td_opts ot = {.prog = "tandem quantize",
                        .usage = usage,
                        .opts = opts,
                        .n = (int)(sizeof opts / sizeof opts[0]),
                        .max_pos = 3};
    int np = 0, pr = td_opts_parse(&ot, argc, argv, &np);
    if (pr <= 0) return pr == 0 ? 0 : 2;
    const char *pos[3] = {0};
    for (int i = 0; i < np; i++) pos[i] = argv[1 + i];
    if (np != 3) {
        fprintf(stderr, "usage: tandem quantize IN.gguf OUT.gguf TYPE\n");
        return 2;
    }
    int t = td_export_parse_type(pos[2]);
    if (t < 0) {
        fprintf(stderr, "tandem quantize: unknown type '%s' (%s)\n", pos[2], all);
        return 2;
    }
    if (!strcmp(pos[0], pos[1])) {
        fprintf(stderr, "tandem quantize: input and output are the same file\n");
        return 2;
    }
    td_err err = {0};
    bool was_q = false;
    double t0 = td_now();
    td_status st = td_export_requantize(pos[0], pos[1], (td_dtype)t, &was_q, &err);
    if (st) {
        fprintf(stderr, "tandem quantize: %s\n", err.msg);
        return 1;
    }
    if (was_q)
        fprintf(stderr, "tandem quantize: warning: %s was already quantized; its values were quantized twice "
                "(quantize from an F32/F16/BF16 file for the best quality)\n", pos[0]);
    fprintf(stderr, "tandem quantize: wrote %s (%s) in %.2f s\n", pos[1], t == TD_EXPORT_Q4_K_M ? "Q4_K_M" : td_dtype_name((td_dtype)t), td_now() - t0);
    return 0;
}
