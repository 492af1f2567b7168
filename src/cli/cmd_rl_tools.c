// `tandem rl data` and `tandem rl eval`: the command-line front ends of rl/task.h and rl/eval.h.
// Not here: RL training (cmd_rl.c dispatches to it when it exists).
#include "cli/cmd_rl_tools.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "model/model.h"
#include "rl/eval.h"
#include "rl/task.h"
#include "tokenizer/tokenizer.h"

#define TASK_OPTS_HELP                                                                                \
    "  --task NAME          addition (default) or file\n"                                               \
    "  --min-digits N       addition: shortest operand (default 4)\n"                                   \
    "  --max-digits N       addition: longest operand (default 6, at most 11)\n"                        \
    "  --prompts FILE       file: JSON lines {\"prompt\": ..., \"answer\": ...} (every 10th held out)\n" \
    "  --scorer CMD         file: sh -c CMD reads JSON lines {prompt, answer, completion} on stdin,\n"   \
    "                       writes one reward in [0, 1] per line\n"                                     \
    "  --scorer-timeout MS  file: per scoring call (default 30000)\n"                                   \
    "  --seed S             problem generation (addition) and sampling (eval) seed (default 1)\n"

// Parses one task option at argv[*i]; returns 1 if it was one (and advances *i), 0 if not, -1 on a
// bad value.
static int task_opt(int argc, char **argv, int *i, td_rl_task_params *tp) {
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    long x;
    if (strcmp(a, "--task") && strcmp(a, "--min-digits") && strcmp(a, "--max-digits") && strcmp(a, "--prompts") &&
        strcmp(a, "--scorer") && strcmp(a, "--scorer-timeout") && strcmp(a, "--seed"))
        return 0;
    if (!v) {
        fprintf(stderr, "tandem: %s needs a value\n", a);
        return -1;
    }
    (*i)++;
    if (!strcmp(a, "--task")) tp->name = v;
    else if (!strcmp(a, "--prompts")) tp->prompts = v;
    else if (!strcmp(a, "--scorer")) tp->scorer = v;
    else if (!strcmp(a, "--min-digits")) {
        if (!td_arg_int(a, v, 1, TD_RL_ADDITION_MAX_DIGITS, &x)) return -1;
        tp->min_digits = (int)x;
    } else if (!strcmp(a, "--max-digits")) {
        if (!td_arg_int(a, v, 1, TD_RL_ADDITION_MAX_DIGITS, &x)) return -1;
        tp->max_digits = (int)x;
    } else if (!strcmp(a, "--scorer-timeout")) {
        if (!td_arg_int(a, v, 1, 1L << 30, &x)) return -1;
        tp->scorer_timeout_ms = (int)x;
    } else {
        if (!td_arg_int(a, v, 0, 0x7fffffffffffffffL, &x)) return -1;
        tp->seed = (uint64_t)x;
    }
    return 1;
}

static void data_usage(void) {
    fprintf(stderr,
            "usage: tandem rl data [options] -o FILE\n"
            "  Writes problems 0..N-1 of a task's split as SFT text, one `PROMPTANSWER` line each,\n"
            "  the newline being the task's stop string (e.g. `4821+90377=95198`).\n" TASK_OPTS_HELP
            "  --split train|eval   which split (default train)\n"
            "  --n N                problems (default 100000)\n"
            "  --group G            a blank line after every G problems: documents of G problems for\n"
            "                       `tandem data prepare --docs blank --sep bos`, so that the first\n"
            "                       problem of each follows BOS as an eval prompt does; all but the\n"
            "                       last end with the stop string (data prepare drops a document's\n"
            "                       final newline). Default 0: no blank lines\n"
            "  -o, --out FILE       output file (- for stdout)\n");
}

int td_cmd_rl_data(int argc, char **argv) {
    td_rl_task_params tp = td_rl_task_default_params();
    td_rl_split split = TD_RL_SPLIT_TRAIN;
    long n = 100000, group = 0;
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r = task_opt(argc, argv, &i, &tp);
        if (r < 0) {
            data_usage();
            return 2;
        }
        if (r) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            data_usage();
            return 0;
        } else if (!v && (!strcmp(a, "--split") || !strcmp(a, "--n") || !strcmp(a, "--group") || !strcmp(a, "-o") ||
                          !strcmp(a, "--out"))) {
            fprintf(stderr, "tandem: %s needs a value\n", a);
            data_usage();
            return 2;
        } else if (!strcmp(a, "--split")) {
            i++;
            if (!strcmp(v, "train")) split = TD_RL_SPLIT_TRAIN;
            else if (!strcmp(v, "eval")) split = TD_RL_SPLIT_EVAL;
            else {
                fprintf(stderr, "tandem: --split expects train or eval\n");
                data_usage();
                return 2;
            }
        } else if (!strcmp(a, "--n")) {
            i++;
            if (!td_arg_int(a, v, 1, 1L << 40, &n)) {
                data_usage();
                return 2;
            }
        } else if (!strcmp(a, "--group")) {
            i++;
            if (!td_arg_int(a, v, 0, 1L << 30, &group)) {
                data_usage();
                return 2;
            }
        } else if (!strcmp(a, "-o") || !strcmp(a, "--out")) {
            out = argv[++i];
        } else {
            fprintf(stderr, "tandem: rl data: unknown option %s\n", a);
            data_usage();
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "tandem: rl data needs -o FILE\n");
        data_usage();
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
    for (long i = 0; i < n; i++) {
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
    if (!rc) TD_LOGI("rl data: %ld %s problems of %s -> %s", n, split ? "eval" : "train", task.vt->name, out);
    td_rl_task_free(&task);
    return rc;
}

static void eval_usage(void) {
    fprintf(stderr,
            "usage: tandem rl eval MODEL [options]\n"
            "  Greedy pass@1 and pass@k (k samples at --temperature, one n = k request per problem)\n"
            "  on eval-split problems 0..N-1, through the serving engine.\n" TASK_OPTS_HELP
            "  --n N                problems (default 2000)\n"
            "  --k K                samples per problem (default 8; 0: greedy only)\n"
            "  --temperature T      of the samples (default 1)\n"
            "  --max-tokens N       per completion (default 16)\n"
            "  --inflight N         requests submitted at once (default 64)\n"
            "  --max-seqs N         the engine's running sequences (default 64)\n"
            "  --timeout S          the whole evaluation's deadline in seconds (default 600)\n"
            "  --threads T          forward threads (default: all CPUs)\n"
            "  --json FILE          also write the result as JSON\n");
}

int td_cmd_rl_eval(int argc, char **argv) {
    td_rl_task_params tp = td_rl_task_default_params();
    td_rl_eval_params ep = td_rl_eval_default_params();
    const char *model = NULL, *json = NULL;
    long threads = 0, max_seqs = 64;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r = task_opt(argc, argv, &i, &tp);
        if (r < 0) {
            eval_usage();
            return 2;
        }
        if (r) continue;
        long x;
        double d;
        int ok = 1;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            eval_usage();
            return 0;
        } else if (a[0] == '-' && a[1] && !v) {
            fprintf(stderr, "tandem: %s needs a value\n", a);
            ok = 0;
        } else if (!strcmp(a, "--n")) {
            ok = td_arg_int(a, argv[++i], 1, 1 << 24, &x);
            ep.n_problems = (int)x;
        } else if (!strcmp(a, "--k")) {
            ok = td_arg_int(a, argv[++i], 0, TD_ENG_MAX_N, &x);
            ep.k = (int)x;
        } else if (!strcmp(a, "--temperature")) {
            ok = td_arg_float(a, argv[++i], 0, 100, &d);
            ep.temperature = (float)d;
        } else if (!strcmp(a, "--max-tokens")) {
            ok = td_arg_int(a, argv[++i], 1, 1 << 20, &x);
            ep.max_tokens = (int)x;
        } else if (!strcmp(a, "--inflight")) {
            ok = td_arg_int(a, argv[++i], 1, 1 << 16, &x);
            ep.max_inflight = (int)x;
        } else if (!strcmp(a, "--max-seqs")) {
            ok = td_arg_int(a, argv[++i], 1, 1 << 16, &max_seqs);
        } else if (!strcmp(a, "--timeout")) {
            ok = td_arg_float(a, argv[++i], 0.001, 2e6, &d);
            ep.timeout_ms = (int)(d * 1000);
        } else if (!strcmp(a, "--threads")) {
            ok = td_arg_int(a, argv[++i], 0, 4096, &threads);
        } else if (!strcmp(a, "--json")) {
            json = argv[++i];
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "tandem: rl eval: unknown option %s\n", a);
            ok = 0;
        } else if (model) {
            fprintf(stderr, "tandem: rl eval: one MODEL only (%s, %s)\n", model, a);
            ok = 0;
        } else {
            model = a;
        }
        if (!ok) {
            eval_usage();
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "tandem: rl eval needs a MODEL (HF directory or .gguf)\n");
        eval_usage();
        return 2;
    }
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
