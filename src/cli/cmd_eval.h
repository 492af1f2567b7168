// `tandem eval` (perplexity of a model over token shards, src/train/eval.h) and `tandem plot`
// (training-log loss curves to PNG, src/train/plot.h). Each takes argv with argv[0] = the
// subcommand's name and returns 0 ok, 1 runtime error, 2 usage error.
#ifndef TD_CLI_CMD_EVAL_H
#define TD_CLI_CMD_EVAL_H

int td_cmd_eval(int argc, char **argv);
int td_cmd_plot(int argc, char **argv);

#endif
