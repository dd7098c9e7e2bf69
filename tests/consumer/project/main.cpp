// A trainer-like consumer: uses only the installed public headers and library.
#include <zoe/config.hpp>
#include <zoe/error.hpp>

#include <iostream>

int main() {
  zoe::Config config;
  config.zero_optimization.stage = 3;
  try {
    throw zoe::Error("probe", __FILE__, __LINE__);
  } catch (const zoe::Error& e) {
    std::cout << "zoe consumer ok: stage " << config.zero_optimization.stage << " " << e.message() << "\n";
  }
  return 0;
}
