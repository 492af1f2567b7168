// Command-line front ends for `tandem eval` (perplexity over token shards) and `tandem plot`
// (loss curves of JSON-lines training logs into a PNG). Argument handling and printing only; the
// work is in src/train/eval.c, src/train/plot.c and src/base/png.c.
#include "cli/cmd_eval.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/png.h"
#include "base/opts.h"
#include "cli/cli.h"
#include "model/model.h"
#include "train/eval.h"
#include "train/plot.h"

// ---- eval ----

typedef struct {
    const char **paths;
    int n_paths;
} eval_ctx;

static bool opt_data(void *ctx, const td_opt *opt, const char *v) {
    eval_ctx *c = ctx;
    if (!*v) return fprintf(stderr, "tandem eval: --%s needs a value\n", opt->name), false;
    c->paths[c->n_paths++] = v;
    return true;
}

int td_cmd_eval(int argc, char **argv) {
    const char *model_path = NULL;
    const char **paths = calloc((size_t)argc + 1, sizeof *paths);
    int n_paths = 0;
    bool json = false;
    long seq_len = 0, batch = 4, threads = 0, max_tokens = 0;
    if (!paths) return 1;
    eval_ctx ec = {.paths = paths};
    const td_opt opts[] = {
        {TD_OPT_CB("data", opt_data, true, "SHARD...", "shard files (several after one --data, or --data repeated)"),
         .multi = true},
        {TD_OPT_I("seq-len", &seq_len, 1, 1L << 20, "T", "predictions per window (default min(256, model context))")},
        {TD_OPT_I("batch", &batch, 1, 4096, "B", "windows per forward batch (default 4)")},
        {TD_OPT_I("max-tokens", &max_tokens, 1, 1L << 62, "N", "stop after floor(N / T) windows (default: all)")},
        {TD_OPT_I("threads", &threads, 1, 1024, "N", "forward threads (default: all CPUs)")},
        {TD_OPT_B("json", &json, "print one JSON object instead of text")},
    };
    const td_opts ot = {.prog = "tandem eval",
                        .usage = "usage: tandem eval MODEL --data SHARD... [options]\n"
                                 "  Mean negative log-likelihood and perplexity of MODEL (directory or .gguf) over token\n"
                                 "  shards (`tandem data prepare`). Each shard is cut into non-overlapping windows of\n"
                                 "  T+1 tokens starting at 0, T, 2T, ...; each window gives T predictions from an empty\n"
                                 "  context (the trainer's validation loss).\n",
                        .opts = opts,
                        .n = (int)(sizeof opts / sizeof opts[0]),
                        .ctx = &ec,
                        .max_pos = -1};
    int n_pos = 0, pr = td_opts_parse(&ot, argc, argv, &n_pos);
    if (pr <= 0 || n_pos > 1) {
        if (n_pos > 1) fprintf(stderr, "tandem: unexpected argument '%s' (shards go after --data)\n", argv[2]);
        if (pr != 0) td_opts_help(&ot, stderr);
        free(paths);
        return pr == 0 ? 0 : 2;
    }
    if (n_pos) model_path = argv[1];
    n_paths = ec.n_paths;
    if (!model_path || !n_paths) {
        fprintf(stderr, "tandem: eval needs a MODEL and --data SHARD...\n");
        td_opts_help(&ot, stderr);
        free(paths);
        return 2;
    }
    td_err err = {0};
    td_model *m = NULL;
    td_eval *e = NULL;
    td_eval_result r;
    td_status st = td_model_load(model_path, &m, &err);
    if (!st) {
        td_eval_params p = td_eval_default_params();
        p.seq_len = seq_len > 0 ? (int)seq_len : (m->cfg.max_pos < 256 ? m->cfg.max_pos : 256);
        p.batch = (int)batch;
        p.n_threads = (int)threads;
        st = td_eval_create_for_model(m, &p, &e, &err);
        if (!st) st = td_eval_shards(e, paths, n_paths, (uint64_t)max_tokens, &r, &err);
        if (!st) {
            if (json) {
                // cJSON escapes the path; numbers keep full precision.
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "model", model_path);
                cJSON_AddNumberToObject(o, "shards", n_paths);
                cJSON_AddNumberToObject(o, "seq_len", p.seq_len);
                cJSON_AddNumberToObject(o, "batch", p.batch);
                cJSON_AddNumberToObject(o, "windows", (double)r.windows);
                cJSON_AddNumberToObject(o, "tokens", (double)r.tokens);
                cJSON_AddNumberToObject(o, "nll", r.nll);
                cJSON_AddNumberToObject(o, "ppl", r.ppl);
                cJSON_AddNumberToObject(o, "seconds", r.seconds);
                cJSON_AddNumberToObject(o, "tokens_per_s", r.tokens_per_s);
                char *txt = cJSON_PrintUnformatted(o);
                if (txt) printf("%s\n", txt);
                free(txt);
                cJSON_Delete(o);
            }
            else
                printf("model       %s\n"
                       "shards      %d\n"
                       "windows     %llu x %d predictions (batch %d)\n"
                       "tokens      %llu\n"
                       "nll         %.6f nats/token\n"
                       "perplexity  %.4f\n"
                       "time        %.3f s (%.1f tokens/s)\n",
                       model_path, n_paths, (unsigned long long)r.windows, p.seq_len, p.batch,
                       (unsigned long long)r.tokens, r.nll, r.ppl, r.seconds, r.tokens_per_s);
        }
    }
    td_eval_free(e);
    td_model_free(m);
    free(paths);
    if (st) {
        fprintf(stderr, "tandem eval: %s\n", err.msg);
        return 1;
    }
    return 0;
}

// ---- plot ----

// The legend name of a log: its file name without directory and extension, or the whole path
// when two logs share a file name.
static void log_name(const char *const *logs, int n, int i, char *buf, size_t cap) {
    const char *b = strrchr(logs[i], '/');
    b = b ? b + 1 : logs[i];
    for (int j = 0; j < n; j++) {
        const char *o = strrchr(logs[j], '/');
        o = o ? o + 1 : logs[j];
        if (j != i && !strcmp(o, b)) {
            snprintf(buf, cap, "%s", logs[i]);
            return;
        }
    }
    snprintf(buf, cap, "%s", b);
    char *dot = strrchr(buf, '.');
    if (dot && dot != buf) *dot = 0;
}

int td_cmd_plot(int argc, char **argv) {
    const char *out = NULL, *title = NULL;
    char metric_buf[256] = "loss,val_loss";
    const char **logs = calloc((size_t)argc + 1, sizeof *logs);
    int n_logs = 0;
    td_plot_params pp = td_plot_default_params();
    if (!logs) return 1;
    const char *metric = NULL;
    const td_opt opts[] = {
        {TD_OPT_S("out", &out, "OUT.png", "output file (required)"), .shorts = "o"},
        {TD_OPT_S("metric", &metric, "A,B", "metrics to draw (default loss,val_loss)")},
        {TD_OPT_S("title", &title, "TEXT", "title above the plot")},
        {TD_OPT_B("log-y", &pp.log_y, "logarithmic y axis")},
        {TD_OPT_I("width", &pp.width, 200, 8192, "W", "image width in pixels (default 900)")},
        {TD_OPT_I("height", &pp.height, 150, 8192, "H", "image height in pixels (default 560)")},
    };
    const td_opts ot = {.prog = "tandem plot",
                        .usage = "usage: tandem plot LOG... -o OUT.png [options]\n"
                                 "  Draws training curves from JSON-lines logs (one object per line with \"step\" and\n"
                                 "  metrics such as \"loss\", \"val_loss\"). Each log gets a colour; metrics named val_*\n"
                                 "  are drawn with markers. Malformed lines are skipped and counted.\n",
                        .opts = opts,
                        .n = (int)(sizeof opts / sizeof opts[0]),
                        .max_pos = -1};
    int pr = td_opts_parse(&ot, argc, argv, &n_logs);
    const char *empty = pr > 0 ? (out && !*out) ? "-o" : (title && !*title) ? "--title" : (metric && !*metric) ? "--metric" : NULL : NULL;
    if (empty) fprintf(stderr, "tandem: %s needs a value\n", empty);
    if (pr > 0 && !empty && metric && strlen(metric) >= sizeof metric_buf) {
        fprintf(stderr, "tandem: --metric list too long\n");
        empty = "--metric";
    }
    if (pr <= 0 || empty) {
        if (pr != 0) td_opts_help(&ot, stderr);
        free(logs);
        return pr == 0 ? 0 : 2;
    }
    for (int i = 0; i < n_logs; i++) logs[i] = argv[1 + i];
    if (metric) snprintf(metric_buf, sizeof metric_buf, "%s", metric);
    const char *metrics[TD_PLOT_MAX_METRICS];
    int n_metrics = 0, bad_metrics = 0;
    for (char *tok = strtok(metric_buf, ", "); tok; tok = strtok(NULL, ", ")) {
        if (n_metrics == TD_PLOT_MAX_METRICS) {
            bad_metrics = 1;
            break;
        }
        metrics[n_metrics++] = tok;
    }
    if (!out || !n_logs || !n_metrics || bad_metrics) {
        fprintf(stderr, "tandem: plot needs LOG..., -o OUT.png and 1..%d metrics\n",
                TD_PLOT_MAX_METRICS);
        td_opts_help(&ot, stderr);
        free(logs);
        return 2;
    }

    td_err err = {0};
    td_status st = TD_OK;
    td_plot_log **L = calloc((size_t)n_logs, sizeof *L);
    td_plot_series *s = calloc((size_t)n_logs * (size_t)n_metrics, sizeof *s);
    char (*labels)[192] = calloc((size_t)n_logs * (size_t)n_metrics, sizeof *labels);
    int ns = 0;
    if (!L || !s || !labels) st = td_err_set(&err, TD_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n_logs && !st; i++) {
        st = td_plot_log_read(logs[i], metrics, n_metrics, &L[i], &err);
        if (st) break;
        if (L[i]->malformed)
            fprintf(stderr, "tandem plot: warning: %s: skipped %zu malformed line%s of %zu\n",
                    logs[i], L[i]->malformed, L[i]->malformed == 1 ? "" : "s", L[i]->lines);
        char name[160];
        log_name(logs, n_logs, i, name, sizeof name);
        for (int k = 0; k < n_metrics; k++) {
            if (!L[i]->n[k]) continue;
            if (n_logs > 1)
                snprintf(labels[ns], sizeof labels[ns], "%s %s", name, metrics[k]);
            else
                snprintf(labels[ns], sizeof labels[ns], "%s", metrics[k]);
            s[ns] = (td_plot_series){.label = labels[ns], .x = L[i]->x[k], .y = L[i]->y[k],
                                     .n = L[i]->n[k], .rgb = td_plot_color(n_logs > 1 ? i : k),
                                     .style = !strncmp(metrics[k], "val", 3) ? TD_PLOT_MARKERS
                                                                             : TD_PLOT_LINE};
            ns++;
        }
    }
    uint8_t *rgb = NULL;
    char ylabel[256];
    if (!st) {
        // y label: the metrics, comma-separated (reads "loss, val_loss").
        ylabel[0] = 0;
        for (int k = 0; k < n_metrics; k++)
            snprintf(ylabel + strlen(ylabel), sizeof ylabel - strlen(ylabel), "%s%s",
                     k ? ", " : "", metrics[k]);
        pp.title = title;
        pp.y_label = ylabel;
        if (!ns)
            st = td_err_set(&err, TD_ERR_INVALID, "no values of %s (with a numeric \"step\") in the log%s",
                            ylabel, n_logs > 1 ? "s" : "");
        else
            st = td_plot_render(&pp, s, ns, &rgb, NULL, &err);
    }
    if (!st) st = td_png_write(out, rgb, pp.width, pp.height, &err);
    if (!st) fprintf(stderr, "tandem plot: wrote %s (%dx%d, %d series)\n", out, pp.width, pp.height, ns);
    free(rgb);
    for (int i = 0; i < n_logs && L; i++) td_plot_log_free(L[i]);
    free(L);
    free(s);
    free(labels);
    free(logs);
    if (st) {
        fprintf(stderr, "tandem plot: %s\n", err.msg);
        return 1;
    }
    return 0;
}
