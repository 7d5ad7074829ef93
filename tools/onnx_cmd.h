// `mgn inspect` and `mgn run` (tools/onnx_cmd.cpp).
#pragma once

namespace mgn::tool {

int inspect_command(int argc, char** argv);  // mgn inspect model.onnx
int run_command(int argc, char** argv);      // mgn run model.onnx [--input NAME=random|zeros|FILE.npy]...

}  // namespace mgn::tool
