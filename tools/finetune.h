// `mgn finetune` (tools/finetune.cpp).
#pragma once

namespace mgn::tool {

int finetune_command(int argc, char** argv);  // mgn finetune MODEL_DIR --text FILE --out DIR [...]

}  // namespace mgn::tool
