#include "bench/nvme/fio_runner.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <vector>

namespace zoe::bench {
namespace {

// fork + exec (no shell, so any path works); returns stdout, or nullopt on failure.
std::optional<std::string> run_capture(const std::vector<std::string>& args, std::string& error) {
  int out[2];
  if (::pipe(out) != 0) {
    error = "pipe() failed";
    return std::nullopt;
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    error = "fork() failed";
    return std::nullopt;
  }
  if (pid == 0) {
    ::dup2(out[1], 1);
    int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) ::dup2(null, 2);  // keep fio's warnings off the progress bar
    ::close(out[0]);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  std::string text;
  char buf[65536];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    error = WIFEXITED(status) && WEXITSTATUS(status) == 127 ? "fio not found" : "fio failed";
    return std::nullopt;
  }
  return text;
}

}  // namespace

std::optional<double> run_fio(const FioJob& job, std::string& error) {
  std::vector<std::string> args = {"fio",
                                   "--name=zoe-nvme-bench",
                                   "--filename=" + job.path,
                                   "--size=" + std::to_string(job.size),
                                   "--bs=" + std::to_string(job.block_size),
                                   "--iodepth=" + std::to_string(job.queue_depth),
                                   "--ioengine=io_uring",
                                   "--direct=1",
                                   std::string("--rw=") + (job.write ? "write" : "read"),
                                   "--output-format=json"};
  if (job.fixed_buffers) {
    args.push_back("--fixedbufs");
    args.push_back("--registerfiles");
  }
  auto text = run_capture(args, error);
  if (!text) return std::nullopt;
  // fio may print notes before the JSON object.
  auto start = text->find('{');
  if (start == std::string::npos) {
    error = "fio printed no JSON";
    return std::nullopt;
  }
  try {
    auto report = nlohmann::json::parse(text->substr(start));
    double bytes_per_s = report.at("jobs").at(0).at(job.write ? "write" : "read").at("bw_bytes").get<double>();
    return bytes_per_s / 1e9;
  } catch (const std::exception& e) {
    error = std::string("cannot read fio's JSON: ") + e.what();
    return std::nullopt;
  }
}

}  // namespace zoe::bench
