// `tandem rl --config rl.json [--resume] ...`: the RL loop (rl/rl.h) from a JSON config, with a
// few overrides on the command line. SIGINT/SIGTERM end the process (the last checkpoint stands).
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "rl/rl.h"

int td_cmd_rl_run(int argc, char **argv);

static void usage(FILE *f) {
    fprintf(f,
            "usage: tandem rl --config rl.json [options]\n"
            "  GRPO post-training: rollouts through the serving engine, rewards from a task, a GRPO step\n"
            "  in the trainer, the new weights synced back with a version number (docs/rl.md).\n"
            "  --config FILE   the run (docs/rl.md lists every key)\n"
            "  --resume        continue from the newest checkpoint in out_dir (synchronous runs\n"
            "                  reproduce the uninterrupted run)\n"
            "  --steps N       override \"steps\"\n"
            "  --out DIR       override \"out_dir\"\n"
            "  --threads N     override \"threads\"\n"
            "other subcommands:\n"
            "  tandem rl data  ...   SFT text of a task's problems\n"
            "  tandem rl eval  ...   pass@1 / pass@k of a model on held-out problems\n");
}

int td_cmd_rl_run(int argc, char **argv) {
    const char *cfg_path = NULL, *out = NULL;
    long steps = -1, threads = -1;
    bool resume = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--resume")) {
            resume = true;
        } else if (!strcmp(a, "--config") && v) {
            cfg_path = v, i++;
        } else if (!strcmp(a, "--out") && v) {
            out = v, i++;
        } else if (!strcmp(a, "--steps") && v) {
            if (!td_arg_int("--steps", v, 1, 1000000000L, &steps)) return 2;
            i++;
        } else if (!strcmp(a, "--threads") && v) {
            if (!td_arg_int("--threads", v, 0, 1024, &threads)) return 2;
            i++;
        } else {
            fprintf(stderr, "tandem rl: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!cfg_path) {
        fprintf(stderr, "tandem rl: --config is required\n");
        usage(stderr);
        return 2;
    }
    td_rl_config c;
    td_rl_config_store store;
    td_err err = {0};
    if (td_rl_config_load(cfg_path, &c, &store, &err)) {
        fprintf(stderr, "tandem rl: %s\n", err.msg);
        return 2;
    }
    if (out) c.out_dir = out;
    if (steps > 0) c.steps = steps;
    if (threads >= 0) c.threads = (int)threads;
    c.resume = resume;
    signal(SIGPIPE, SIG_IGN);
    td_rl_result res;
    td_status st = td_rl_run(&c, stdout, &res, &err);
    td_rl_config_release(&store);
    if (st) {
        fprintf(stderr, "tandem rl: %s\n", err.msg);
        return 1;
    }
    printf("rl: %ld steps | reward %.4f -> %.4f", res.steps_done, res.first_reward, res.last_reward);
    if (res.last_pass1 == res.last_pass1) printf(" | pass@1 %.4f | pass@k %.4f", res.last_pass1, res.last_pass_k);
    printf("\n");
    return 0;
}
