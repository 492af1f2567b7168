// `tandem train`: train a Llama-family model on token shards (from scratch or from a model
// directory), writing rotating checkpoints. argv[0] is "train"; returns 0 ok, 1 runtime error,
// 2 usage error.
#ifndef TD_CLI_CMD_TRAIN_H
#define TD_CLI_CMD_TRAIN_H

int td_cmd_train(int argc, char **argv);

#endif
