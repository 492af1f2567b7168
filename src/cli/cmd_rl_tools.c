// `tandem rl data` and `tandem rl eval`: the command-line front ends of rl/task.h and rl/eval.h.
// Not here: RL training (cmd_rl.c dispatches to it when it exists).
#include "cli/cmd_rl_tools.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/opts.h"
#include "engine/engine.h"
#include "model/model.h"
#include "rl/eval.h"
#include "rl/task.h"
#include "tokenizer/tokenizer.h"

// The task's options, shared by `rl data` and `rl eval` (the first entries of each table).
#define TASK_OPTS(tp, seed)                                                                                    \
    {TD_OPT_SEC("task:")},                                                                                     \
        {TD_OPT_S("task", &(tp).name, "NAME", "addition (default) or file")},                                  \
        {TD_OPT_I("min-digits", &(tp).min_digits, 1, TD_RL_ADDITION_MAX_DIGITS, "N",                           \
                  "addition: shortest operand (default 4)")},                                                  \
        {TD_OPT_I("max-digits", &(tp).max_digits, 1, TD_RL_ADDITION_MAX_DIGITS, "N",                           \
                  "addition: longest operand (default 6, at most 11)")},                                       \
        {TD_OPT_S("prompts", &(tp).prompts, "FILE",                                                            \
                  "file: JSON lines {\"prompt\": ..., \"answer\": ...} (every 10th held out)")},               \
        {TD_OPT_S("scorer", &(tp).scorer, "CMD",                                                               \
                  "file: sh -c CMD reads JSON lines {prompt, answer, completion} on stdin,\n"                  \
                  "writes one reward in [0, 1] per line")},                                                    \
        {TD_OPT_I("scorer-timeout", &(tp).scorer_timeout_ms, 1, 1 << 30, "MS",                                 \
                  "file: per scoring call (default 30000)")},                                                  \
    {                                                                                                          \
        TD_OPT_I("seed", &(seed), 0, 9.2e18, "S", "problem generation (addition) and sampling (eval) seed (default 1)") \
    }

int td_cmd_rl_data(int argc, char **argv) {
    td_rl_task_params tp = td_rl_task_default_params();
    long long seed = (long long)tp.seed, n = 100000, group = 0;
    int split_i = 0;
    const char *out = NULL;
    const td_opt opts[] = {
        TASK_OPTS(tp, seed),
        {TD_OPT_SEC("output:")},
        {TD_OPT_C("split", &split_i, "train eval", "train|eval", "which split (default train)")},
        {TD_OPT_I("n", &n, 1, 1LL << 40, "N", "problems (default 100000)")},
        {TD_OPT_I("group", &group, 0, 1 << 30, "G",
                  "a blank line after every G problems: documents of G problems for\n"
                  "`tandem data prepare --docs blank --sep bos`, so that the first\n"
                  "problem of each follows BOS as an eval prompt does; all but the\n"
                  "last end with the stop string (data prepare drops a document's\n"
                  "final newline). Default 0: no blank lines")},
        {TD_OPT_S("out", &out, "FILE", "output file (- for stdout)"), .shorts = "o"},
    };
    const td_opts ot = {.prog = "tandem rl data",
                        .usage = "usage: tandem rl data [options] -o FILE\n"
                                 "  Writes problems 0..N-1 of a task's split as SFT text, one `PROMPTANSWER` line each,\n"
                                 "  the newline being the task's stop string (e.g. `4821+90377=95198`).\n",
                        .opts = opts,
                        .n = (int)(sizeof opts / sizeof opts[0]),
                        .max_pos = 0};
    int n_pos = 0, parsed = td_opts_parse(&ot, argc, argv, &n_pos);
    if (parsed <= 0) return parsed == 0 ? 0 : 2;
    tp.seed = (uint64_t)seed;
    td_rl_split split = split_i ? TD_RL_SPLIT_EVAL : TD_RL_SPLIT_TRAIN;
    if (!out) {
        fprintf(stderr, "tandem rl data: needs -o FILE (see --help)\n");
        return 2;
    }
    td_err err = {0};
    td_rl_task task;
    if (td_rl_task_create(&tp, &task, &err)) {
        fprintf(stderr, "tandem: rl data: %s\n", err.msg);
        return 1;
    }
    FILE *f = strcmp(out, "-") ? fopen(out, "w") : stdout;
    if (!f) {
        perror(out);
        td_rl_task_free(&task);
        return 1;
    }
    int rc = 0;
    td_rl_problem pr;
    for (long long i = 0; i < n; i++) {
        if (task.vt->problem(task.ctx, split, (uint64_t)i, &pr, &err)) {
            fprintf(stderr, "tandem: rl data: %s\n", err.msg);
            rc = 1;
            break;
        }
        const char *sep = group > 0 && (i + 1) % group == 0 ? "\n" : "";
        if (fprintf(f, "%s%s%s%s", pr.prompt, pr.answer, task.stop ? task.stop : "\n", sep) < 0) {
            perror(out);
            rc = 1;
            break;
        }
    }
    if (f != stdout ? fclose(f) : fflush(f)) {
        perror(out);
        rc = 1;
    }
    if (!rc) TD_LOGI("rl data: %lld %s problems of %s -> %s", n, split ? "eval" : "train", task.vt->name, out);
    td_rl_task_free(&task);
    return rc;
}

int td_cmd_rl_eval(int argc, char **argv) {
    td_rl_task_params tp = td_rl_task_default_params();
    td_rl_eval_params ep = td_rl_eval_default_params();
    const char *model = NULL, *json = NULL;
    long long seed = (long long)tp.seed;
    int threads = 0, max_seqs = 64;
    double timeout_s = ep.timeout_ms / 1000.0;
    const td_opt opts[] = {
        TASK_OPTS(tp, seed),
        {TD_OPT_SEC("evaluation:")},
        {TD_OPT_I("n", &ep.n_problems, 1, 1 << 24, "N", "problems (default 2000)")},
        {TD_OPT_I("k", &ep.k, 0, TD_ENG_MAX_N, "K", "samples per problem (default 8; 0: greedy only)")},
        {TD_OPT_F("temperature", &ep.temperature, 0, 100, "T", "of the samples (default 1)")},
        {TD_OPT_I("max-tokens", &ep.max_tokens, 1, 1 << 20, "N", "per completion (default 16)")},
        {TD_OPT_I("inflight", &ep.max_inflight, 1, 1 << 16, "N", "requests submitted at once (default 64)")},
        {TD_OPT_I("max-seqs", &max_seqs, 1, 1 << 16, "N", "the engine's running sequences (default 64)")},
        {TD_OPT_F("timeout", &timeout_s, 0.001, 2e6, "S", "the whole evaluation's deadline in seconds (default 600)")},
        {TD_OPT_I("threads", &threads, 0, 4096, "T", "forward threads (default: all CPUs)")},
        {TD_OPT_S("json", &json, "FILE", "also write the result as JSON")},
    };
    const td_opts ot = {.prog = "tandem rl eval",
                        .usage = "usage: tandem rl eval MODEL [options]\n"
                                 "  Greedy pass@1 and pass@k (k samples at --temperature, one n = k request per problem)\n"
                                 "  on eval-split problems 0..N-1, through the serving engine.\n",
                        .opts = opts,
                        .n = (int)(sizeof opts / sizeof opts[0]),
                        .max_pos = 1};
    int n_pos = 0, pr = td_opts_parse(&ot, argc, argv, &n_pos);
    if (pr <= 0) return pr == 0 ? 0 : 2;
    if (n_pos) model = argv[1];
    if (!model) {
        fprintf(stderr, "tandem rl eval: needs a MODEL (HF directory or .gguf; see --help)\n");
        return 2;
    }
    tp.seed = (uint64_t)seed;
    ep.timeout_ms = (int)(timeout_s * 1000);
    ep.seed = tp.seed;
    td_err err = {0};
    td_rl_task task = {0};
    td_model *m = NULL;
    td_tokenizer *tok = NULL;
    td_eng *eng = NULL;
    int rc = 1;
    if (td_rl_task_create(&tp, &task, &err)) {
        fprintf(stderr, "tandem: rl eval: %s\n", err.msg);
        return 1;
    }
    if (td_model_load(model, &m, &err) != TD_OK ||
        td_tokenizer_load(m->tokenizer_path ? m->tokenizer_path : model, &tok, &err) != TD_OK) {
        fprintf(stderr, "tandem: rl eval: %s\n", err.msg);
        goto done;
    }
    td_eng_params pe = td_eng_default_params();
    pe.n_threads = (int)threads;
    pe.max_seqs = (int)max_seqs;
    int waiting = ep.max_inflight * (ep.k > 1 ? ep.k : 1);  // sequences (choices) queued at most
    if (pe.max_waiting < waiting) pe.max_waiting = waiting;
    if (td_eng_create(m, tok, &pe, &eng, &err) != TD_OK) {
        fprintf(stderr, "tandem: rl eval: %s\n", err.msg);
        goto done;
    }
    td_rl_eval_result res;
    if (td_rl_eval(eng, tok, &task, &ep, &res, &err) != TD_OK) {
        fprintf(stderr, "tandem: rl eval: %s\n", err.msg);
        goto done;
    }
    printf("task %s, %d eval problems, k %d at temperature %g, max_tokens %d, seed %llu\n", task.vt->name,
           res.n_problems, ep.k, (double)ep.temperature, ep.max_tokens, (unsigned long long)ep.seed);
    printf("pass@1 (greedy) %.4f  pass@%d %.4f  sample_solve %.4f  greedy_reward %.4f  %.1f s\n", res.pass1, ep.k,
           res.pass_k, res.sample_solve, res.greedy_reward, res.seconds);
    rc = 0;
    if (json) {
        // NAN (k = 0) is written as null: JSON has no NaN.
        char pk[32] = "null", ss[32] = "null";
        if (!isnan(res.pass_k)) snprintf(pk, sizeof pk, "%.6f", res.pass_k);
        if (!isnan(res.sample_solve)) snprintf(ss, sizeof ss, "%.6f", res.sample_solve);
        FILE *f = fopen(json, "w");
        int bad = !f;
        if (f && fprintf(f,
                          "{\"task\": \"%s\", \"n_problems\": %d, \"k\": %d, \"temperature\": %g, \"max_tokens\": %d, "
                          "\"seed\": %llu, \"pass1\": %.6f, \"pass_k\": %s, \"sample_solve\": %s, "
                          "\"greedy_reward\": %.6f, \"seconds\": %.3f}\n",
                          task.vt->name, res.n_problems, ep.k, (double)ep.temperature, ep.max_tokens,
                          (unsigned long long)ep.seed, res.pass1, pk, ss, res.greedy_reward, res.seconds) < 0)
            bad = 1;
        if (f && fclose(f)) bad = 1;
        if (bad) {
            perror(json);
            rc = 1;
        }
    }
done:
    td_eng_free(eng);
    td_tokenizer_free(tok);
    td_model_free(m);
    td_rl_task_free(&task);
    return rc;
}
