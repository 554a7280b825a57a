// modelstatectl: the process around RunCli (client/cli.h): its streams,
// whether stderr is a terminal, and the defaults from the environment.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "client/cli.h"

int main(int argc, char** argv) {
  modelstate::cli::Environment env;
  env.out = &std::cout;
  env.err = &std::cerr;
  env.err_is_tty = isatty(STDERR_FILENO) == 1;
  if (const char* server = std::getenv("MODELSTATE_SERVER");
      server != nullptr && *server != '\0') {
    env.default_server = server;
  }
  if (const char* token = std::getenv("MODELSTATE_TOKEN"); token != nullptr) {
    env.default_token = token;
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  int rc = modelstate::cli::RunCli(args, env);
  std::cout.flush();
  std::cerr.flush();
  return rc;
}
