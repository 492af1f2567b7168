// `tandem bench serve`: the load generator for OpenAI-compatible servers (src/loadgen/).
#ifndef TD_CLI_CMD_BENCH_SERVE_H
#define TD_CLI_CMD_BENCH_SERVE_H

// argv[0] = "serve"; returns the exit status (0 ok, 1 runtime error, 2 usage error).
int td_cmd_bench_serve(int argc, char **argv);

#endif
