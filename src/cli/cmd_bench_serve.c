// `tandem bench serve ...`: a thin entry over the load generator library (src/loadgen/), which
// holds the option parsing too so that tests can drive the command without the executable.
#include "cli/cmd_bench_serve.h"

#include "loadgen/loadgen.h"

int td_cmd_bench_serve(int argc, char **argv) { return td_lg_bench_main(argc, argv); }
