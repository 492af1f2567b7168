// `tandem convert` (model directory -> GGUF, GGUF -> model directory) and `tandem quantize`
// (GGUF -> GGUF at another type). See docs/convert.md.
#ifndef TD_CLI_CMD_CONVERT_H
#define TD_CLI_CMD_CONVERT_H

int td_cmd_convert(int argc, char **argv);
int td_cmd_quantize(int argc, char **argv);

#endif
