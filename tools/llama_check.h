// `mgn llama-check`: a Llama-family model directory written by bench/pytorch/llama_ref.py (config.json,
// model.safetensors, inputs.safetensors with the reference outputs) checked and timed on one backend.
#pragma once

// argv[1] is "llama-check"; the directory and flags follow. Returns 0 when every gate passes, 1 when one
// fails; throws mgn::Error for bad arguments or files.
int llama_check_command(int argc, char** argv);
