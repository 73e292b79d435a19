// sluice: the command-line entry point (the project's only main()).
#include <fmt/core.h>
#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  CLI::App app{"sluice: admission control for shared backends"};
  app.require_subcommand(1);
  app.add_subcommand("version", "print the version")->callback([] {
    fmt::print("sluice 0.1.0\n");
  });
  CLI11_PARSE(app, argc, argv);
  return 0;
}
