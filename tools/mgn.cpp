// The `mgn` command line: entry point for the main job, inspection and benchmarks.
#include <cstdio>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help")) {
    std::printf("usage: mgn <command> [args]\n");
    return argc < 2 ? 1 : 0;
  }
  std::fprintf(stderr, "mgn: unknown command '%s'\n", argv[1]);
  return 2;
}
