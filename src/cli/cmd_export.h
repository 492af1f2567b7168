// `tandem export`: a training checkpoint (ckpt-<step>.tdck, or a checkpoint directory -> its newest
// valid one) -> a Hugging Face model directory or a GGUF file. See docs/training.md.
#ifndef TD_CLI_CMD_EXPORT_H
#define TD_CLI_CMD_EXPORT_H

int td_cmd_export(int argc, char **argv);

#endif
