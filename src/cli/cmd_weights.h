// `tandem weights push URL SOURCE` / `tandem weights get URL`: the weight-sync client (rl/push.h)
// on the command line. See docs/cli.md and docs/server.md ("Weight sync").
#ifndef TD_CLI_CMD_WEIGHTS_H
#define TD_CLI_CMD_WEIGHTS_H

int td_cmd_weights(int argc, char **argv);  // argv[0] = "weights"

#endif
