// A trainer-like consumer of zoe: trains the two-module model of two_modules.hpp, checks that
// the loss falls, and writes the losses and final fp32 parameters to OUT (raw bytes), which
// ctest compares with the same run built elsewhere (tests/consumer/CMakeLists.txt).
// Usage: consumer OUT NVME_DIR
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "two_modules.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " OUT NVME_DIR\n";
    return 2;
  }
  try {
    std::filesystem::create_directories(argv[2]);
    const consumer::Result r = consumer::train(argv[2]);
    std::ofstream out(argv[1], std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(r.losses.data()),
              static_cast<std::streamsize>(r.losses.size() * sizeof(double)));
    for (const auto& p : r.params)
      out.write(reinterpret_cast<const char*>(p.data()), static_cast<std::streamsize>(p.size() * sizeof(float)));
    if (!out.flush()) {
      std::cerr << "consumer: cannot write " << argv[1] << "\n";
      return 1;
    }
    // Each step sees new samples, so compare the means of the first and last 5 steps.
    double first = 0, last = 0;
    for (int s = 0; s < 5; ++s) {
      first += r.losses[s] / 5;
      last += r.losses[r.losses.size() - 1 - s] / 5;
    }
    std::printf("zoe consumer: %zu steps, loss %.6f -> %.6f (mean of the first and last 5 steps)\n",
                r.losses.size(), first, last);
    if (!(last < 0.5 * first)) {
      std::cerr << "consumer: the loss did not fall to half (" << first << " -> " << last << ")\n";
      return 1;
    }
    std::printf("zoe consumer ok\n");
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "consumer: " << e.what() << "\n";
    return 1;
  }
}
