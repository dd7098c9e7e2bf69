// kill -9 during checkpoint saves at random moments never leaves a state from which a resume
// fails or resumes a torn checkpoint. 20 times in a row a forked child resumes from the
// checkpoint directory (2 ranks, stage 3, optimizer states on NVMe), logs the step it resumed
// at with a hash of the parameters, then trains and saves after every step until the parent
// kills it with SIGKILL a random delay after that log line (most of a child's time is spent saving, so most
// kills land inside a save). Consecutive kills exercise the resume-then-crash-again sequence
// that once left no checkpoint. At the end (the parent may create threads only then) the
// uninterrupted run gives the reference hash of every step: every logged resume must equal
// it bit for bit, and the final checkpoint must load.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "io/crc32c.hpp"
#include "tests/core/checkpoint_runs.hpp"

using namespace zoe;
namespace fs = std::filesystem;

namespace {
constexpr int kTries = 20;
constexpr int kMaxSteps = 100000;

Config config(const std::string& dir) { return test::checkpoint_config(3, OffloadDevice::nvme, dir); }

std::uint32_t hash(const test::Params& p) {
  std::uint32_t h = 0;
  for (const auto& v : p) h = io::crc32c(v.data(), v.size() * sizeof(float), h);
  return h;
}

void append_line(const std::string& path, const std::string& line) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  [[maybe_unused]] ssize_t n = ::write(fd, line.data(), line.size());
  ::fsync(fd);
  ::close(fd);
}

// The child: resume (or start), log "<step> <hash>", then step and save forever.
[[noreturn]] void child(const std::string& dir, bool fresh) {
  int code = 0;
  try {
    const std::string ckpt = dir + "/ckpt";
    auto ranks = make_local_ranks(2, 60.0);
    run_ranks(ranks, [&](RankContext& ctx) {
      Engine e(config(dir), ctx);
      test::TestNet net(e, test::kCheckpointNet);
      if (!fresh) e.load_checkpoint(ckpt);
      test::Params p;
      for (ParamId id : net.params()) p.push_back(e.gather_parameter(id));
      if (ctx.rank == 0) append_line(dir + "/resumes", std::to_string(e.global_step()) + " " + std::to_string(hash(p)) + "\n");
      for (int s = static_cast<int>(e.global_step()); s < kMaxSteps; ++s) {
        net.micro_batch(s * 16 + ctx.rank * 8, 8);
        e.step();
        e.save_checkpoint(ckpt);
        if (fresh && s == 0) return;  // the first checkpoint exists
      }
    });
  } catch (const std::exception& err) {
    append_line(dir + "/failed", std::string(err.what()) + "\n");
    code = 3;
  }
  ::_exit(code);
}

int count_lines(const std::string& path) {
  std::ifstream f(path);
  return static_cast<int>(std::count(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>(), '\n'));
}

// Waits until the child has logged its resume (the log has `lines` lines) or has exited; the
// random delay before the kill starts only then, so a slow resume on a loaded machine is not
// killed before it logs (the kill is meant for the saves after it). False if the child exited.
bool wait_for_resume(pid_t pid, const std::string& log, int lines) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (count_lines(log) < lines) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return false;
    if (std::chrono::steady_clock::now() > deadline) return true;  // the count below reports it
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

int wait_child(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}
}  // namespace

TEST(CheckpointKill, KillNineDuringSavesNeverLosesOrTearsTheCheckpoint) {
  const std::string dir = test::temp_dir("ckpt-kill");
  {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) child(dir, true);
    const int status = wait_child(pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the first run failed";
  }
  std::mt19937 gen(12345);
  std::uniform_int_distribution<int> delay_ms(150, 900);
  int inside_save = 0;  // kills after which a .tmp or .old directory was left
  for (int t = 0; t < kTries; ++t) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) child(dir, false);
    if (!wait_for_resume(pid, dir + "/resumes", t + 2)) {
      std::ifstream f(dir + "/failed");
      std::string why((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      FAIL() << "try " << t << ": the resumed child exited before logging its resume: " << why;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(gen)));
    ::kill(pid, SIGKILL);
    const int status = wait_child(pid);
    if (WIFEXITED(status)) {
      std::ifstream f(dir + "/failed");
      std::string why((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      FAIL() << "try " << t << ": the resumed child exited with " << WEXITSTATUS(status) << ": " << why;
    }
    if (fs::exists(dir + "/ckpt.tmp") || fs::exists(dir + "/ckpt.old") || !fs::exists(dir + "/ckpt")) ++inside_save;
  }
  std::printf("%d of %d kills left an interrupted save behind (.tmp / .old)\n", inside_save, kTries);

  // Every resume, against the uninterrupted run.
  std::ifstream log(dir + "/resumes");
  int step = 0, count = 0;
  std::uint32_t h = 0;
  std::multimap<int, std::uint32_t> all;
  while (log >> step >> h) {
    all.emplace(step, h);
    ++count;
  }
  EXPECT_EQ(count, kTries + 1) << "every child (and the first run) logs its resume before the parent kills it";
  // The checkpoint the last kill left loads (the parent may create threads from here on).
  int final_step = -1;
  std::uint32_t final_hash = 0;
  {
    auto ranks = make_local_ranks(2, 60.0);
    run_ranks(ranks, [&](RankContext& ctx) {
      Engine e(config(dir), ctx);
      test::TestNet net(e, test::kCheckpointNet);
      e.load_checkpoint(dir + "/ckpt");
      test::Params p;
      for (ParamId id : net.params()) p.push_back(e.gather_parameter(id));
      if (ctx.rank == 0) {
        final_step = static_cast<int>(e.global_step());
        final_hash = hash(p);
      }
    });
  }
  all.emplace(final_step, final_hash);
  int last = 0;
  for (const auto& [s, v] : all) last = std::max(last, s);
  std::printf("resumed at steps");
  for (const auto& [s, v] : all) std::printf(" %d", s);
  std::printf(" (the last is the final checkpoint's)\n");
  // The uninterrupted run, hashing every step up to the last one resumed.
  std::map<int, std::uint32_t> reference;
  {
    auto ranks = make_local_ranks(2, 60.0);
    run_ranks(ranks, [&](RankContext& ctx) {
      Engine e(config(dir + "/ref"), ctx);
      test::TestNet net(e, test::kCheckpointNet);
      for (int s = 0; s <= last; ++s) {
        test::Params p;
        for (ParamId id : net.params()) p.push_back(e.gather_parameter(id));
        if (ctx.rank == 0) reference[s] = hash(p);
        if (s == last) break;
        net.micro_batch(s * 16 + ctx.rank * 8, 8);
        e.step();
      }
    });
  }
  for (const auto& [s, v] : all) EXPECT_EQ(v, reference[s]) << "resumed at step " << s << " is not the run's step " << s;
  fs::remove_all(dir);
}
