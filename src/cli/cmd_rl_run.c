// `tandem rl --config rl.json [--resume] ...`: the RL loop (rl/rl.h) from a JSON config, with a
// few overrides on the command line. SIGINT/SIGTERM end the process (the last checkpoint stands).
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/opts.h"
#include "cli/cli.h"
#include "rl/rl.h"

int td_cmd_rl_run(int argc, char **argv);

int td_cmd_rl_run(int argc, char **argv) {
    const char *cfg_path = NULL, *out = NULL;
    long steps = -1, threads = -1;
    bool resume = false;
    const td_opt opts[] = {
        {TD_OPT_S("config", &cfg_path, "FILE", "the run (docs/rl.md lists every key)")},
        {TD_OPT_B("resume", &resume,
                  "continue from the newest checkpoint in out_dir (synchronous runs\n"
                  "reproduce the uninterrupted run)")},
        {TD_OPT_I("steps", &steps, 1, 1000000000L, "N", "override \"steps\"")},
        {TD_OPT_S("out", &out, "DIR", "override \"out_dir\"")},
        {TD_OPT_I("threads", &threads, 0, 1024, "N", "override \"threads\"")},
    };
    const td_opts ot = {.prog = "tandem rl",
                        .usage = "usage: tandem rl --config rl.json [options]\n"
                                 "  GRPO post-training: rollouts through the serving engine, rewards from a task, a GRPO step\n"
                                 "  in the trainer, the new weights synced back with a version number (docs/rl.md).\n",
                        .opts = opts,
                        .n = (int)(sizeof opts / sizeof opts[0]),
                        .epilog = "other subcommands:\n"
                                  "  tandem rl data  ...   SFT text of a task's problems\n"
                                  "  tandem rl eval  ...   pass@1 / pass@k of a model on held-out problems\n",
                        .max_pos = 0};
    int n_pos = 0, pr = td_opts_parse(&ot, argc, argv, &n_pos);
    if (pr < 0) td_opts_help(&ot, stderr);
    if (pr <= 0) return pr == 0 ? 0 : 2;
    if (!cfg_path) {
        fprintf(stderr, "tandem rl: --config is required\n");
        td_opts_help(&ot, stderr);
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
