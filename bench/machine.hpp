// What a bench's figures depend on besides the code: the CPU model, the online CPU count and the
// load average (the build machine is shared; a figure taken at load 10 is not one taken at 0).
// Every bench's --json line carries them, so a file of results explains itself.
// Thread-safety: reads /proc on every call; safe from any thread.
#pragma once

#include <time.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace zoe::bench {

/// /proc/loadavg's first three fields ("0.80 1.58 2.63": 1, 5, 15 minutes), or "?" if unreadable.
inline std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  if (!(f >> a >> b >> c)) return "?";
  return a + " " + b + " " + c;
}

/// The first "model name" of /proc/cpuinfo ("Intel(R) Xeon(R) Processor"), or "?".
inline std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? "?" : line.substr(line.find_first_not_of(' ', colon + 1));
    }
  return "?";
}

/// CPU seconds of the calling thread spent in f: time the scheduler gave to other processes on
/// a shared machine is left out (one-thread measurements only).
template <class F>
double thread_cpu_seconds(F&& f) {
  auto now = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  const double t0 = now();
  f();
  return now() - t0;
}

/// Online CPUs (sysconf(_SC_NPROCESSORS_ONLN)).
inline int online_cpus() { return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)); }

}  // namespace zoe::bench
