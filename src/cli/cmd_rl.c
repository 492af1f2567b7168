// `tandem rl`: the GRPO loop (`tandem rl --config rl.json`, cmd_rl_run.c) and its tools (`tandem
// rl data`, `tandem rl eval`, cmd_rl_tools.c). Not here: the subcommands themselves.
#include <stdio.h>
#include <string.h>

#include "cli/cmd_rl_tools.h"

static void rl_usage(FILE *f) {
    fprintf(f,
            "usage: tandem rl --config rl.json [--resume] [options]   GRPO post-training (docs/rl.md)\n"
            "       tandem rl <subcommand> [options]\n"
            "  data   SFT text (one `prompt answer` line per problem) from a task's problems\n"
            "  eval MODEL   greedy pass@1 and sampled pass@k on a task's held-out problems\n"
            "`tandem rl --config X --help` and `tandem rl <subcommand> --help` describe the options.\n");
}

int td_cmd_rl_run(int argc, char **argv);  // cmd_rl_run.c: the loop

int td_cmd_rl(int argc, char **argv) {
    if (argc >= 2 && !strncmp(argv[1], "--", 2) && strcmp(argv[1], "--help")) return td_cmd_rl_run(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "data")) return td_cmd_rl_data(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "eval")) return td_cmd_rl_eval(argc - 1, argv + 1);
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"))) {
        rl_usage(stdout);
        return 0;
    }
    if (argc >= 2) fprintf(stderr, "tandem rl: unknown subcommand '%s'\n", argv[1]);
    rl_usage(stderr);
    return 2;
}
