// `tandem rl data` (SFT text from an RL task's problems) and `tandem rl eval` (pass@k of a model on
// a task's held-out problems through the engine). Registered under `tandem rl` by cmd_rl.c.
#ifndef TD_CLI_CMD_RL_TOOLS_H
#define TD_CLI_CMD_RL_TOOLS_H

// argv[0] is the subcommand's name ("data", "eval"); exit status 0 ok, 1 runtime error, 2 usage.
int td_cmd_rl_data(int argc, char **argv);
int td_cmd_rl_eval(int argc, char **argv);
// `tandem rl`: dispatches its subcommands (cmd_rl.c).
int td_cmd_rl(int argc, char **argv);

#endif
