// `tandem tokenizer train` and `tandem data prepare`: the data half of the trainer's command line.
// Each takes argv with argv[0] = the subcommand's name and returns 0 ok, 1 runtime error, 2 usage.
#ifndef TD_CLI_CMD_TRAIN_DATA_H
#define TD_CLI_CMD_TRAIN_DATA_H

int td_cmd_tokenizer_train(int argc, char **argv);
int td_cmd_data_prepare(int argc, char **argv);

#endif
