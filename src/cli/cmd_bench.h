// `tandem bench pp|tg|batched|ceilings`: single-stream and batched inference speed in the
// llama-bench convention (docs/bench.md), each result also given as a fraction of the measured
// hardware ceiling. `tandem bench serve` is a different command (cmd_bench_serve.h).
#ifndef TD_CLI_CMD_BENCH_H
#define TD_CLI_CMD_BENCH_H

// argv[0] = "bench", argv[1] = "pp", "tg", "batched" or "ceilings"; returns the exit status
// (0 ok, 1 runtime error, 2 usage error).
int td_cmd_bench(int argc, char **argv);

#endif
