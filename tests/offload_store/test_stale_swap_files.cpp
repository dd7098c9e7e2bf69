// Swap files of killed runs: a new store removes exactly the files of dead zoe processes
// (a SIGKILLed child's, an empty leftover, a reused pid's) and leaves a live process's, this
// process's and every file that is not provably zoe's.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <spdlog/sinks/ostream_sink.h>
#include <sstream>

#include "src/common/log.hpp"
#include "src/offload/nvme_store.hpp"
#include "src/offload/swap_file_owner.hpp"
#include "tests/io/test_support.hpp"

using namespace zoe;
using namespace zoe::offload;

namespace {

NvmeStoreOptions options_in(const std::string& dir, int rank = 0) {
  NvmeStoreOptions o;
  o.dir = dir;
  o.rank = rank;
  o.aio.block_size = 1 << 20;
  o.aio.queue_depth = 4;
  return o;
}

// A child process holding a store with one written tensor in `dir`; alive until kill().
// Forks from the single test thread (the tests before it joined their I/O threads).
class StoreChild {
 public:
  StoreChild(const std::string& dir, int rank) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::close(fds[0]);
      ::alarm(60);  // never outlives a broken test
      try {
        NvmeStore store(options_in(dir, rank));
        AlignedBuffer data = test::pattern_buffer(100'000, 7);
        store.register_tensor("exp_avg", 100'000);
        store.swap_out("exp_avg", data.data(), 100'000).wait();
        const std::string path = store.path();
        if (::write(fds[1], path.data(), path.size()) != static_cast<ssize_t>(path.size())) ::_exit(2);
        ::close(fds[1]);
        for (;;) ::pause();  // killed by the parent
      } catch (...) {
        ::_exit(3);
      }
    }
    ::close(fds[1]);
    char buf[4096];
    ssize_t n = 0, got;
    while ((got = ::read(fds[0], buf + n, sizeof buf - n)) > 0) n += got;
    ::close(fds[0]);
    path_.assign(buf, static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
  }
  ~StoreChild() { kill(); }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }
  pid_t pid() const { return pid_; }
  const std::string& path() const { return path_; }

 private:
  pid_t pid_ = -1;
  std::string path_;
};

// A pid that was just in use and no longer is (a child that exited and was reaped).
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string header_of(const SwapFileOwner& owner) {
  std::string block(kSwapHeaderBytes, '\0');
  encode_swap_header(owner, block.data());
  return block + std::string(8192, 'x');  // and two blocks of "extents"
}

// Captures the zoe logger's lines while it lives.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    zoe::log::get().sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = zoe::log::get().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

}  // namespace

TEST(StaleSwapFiles, HeaderRoundTripsAndRejectsDamage) {
  SwapFileOwner self = SwapFileOwner::self(3);
  EXPECT_EQ(self.pid, ::getpid());
  EXPECT_EQ(self.rank, 3);
  EXPECT_GT(self.start_ticks, 0u) << "/proc/self/stat";
  EXPECT_GT(self.pid_namespace, 0u) << "/proc/self/ns/pid";
  EXPECT_EQ(self.boot_id.size(), 36u) << self.boot_id;
  std::string block(kSwapHeaderBytes, '\0');
  encode_swap_header(self, block.data());
  auto back = decode_swap_header(block.data(), block.size());
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, self);
  block[20] ^= 1;  // inside the pid
  EXPECT_FALSE(decode_swap_header(block.data(), block.size()).has_value()) << "CRC catches a flipped bit";
  EXPECT_FALSE(decode_swap_header(block.data(), 100).has_value()) << "too short";
  EXPECT_EQ(swap_file_name(2, 1234, 5), "zoe-rank2-1234-5.swap");
}

TEST(StaleSwapFiles, ANewStoreRemovesExactlyTheDeadProcessesFiles) {
  test::TempDir dir;
  const std::string d = dir.path();
  StoreChild live(d, 0);     // a run still going on: its file stays
  StoreChild killed(d, 1);   // a run killed with SIGKILL: its store never ran its destructor
  ASSERT_FALSE(live.path().empty());
  ASSERT_FALSE(killed.path().empty());
  const pid_t killed_pid = killed.pid();
  killed.kill();
  ASSERT_TRUE(std::filesystem::exists(killed.path())) << "SIGKILL leaves the file behind";

  const pid_t gone = dead_pid();
  const std::string empty_dead = d + "/" + swap_file_name(0, gone, 0);  // a refused open's leftover
  write_file(empty_dead, "");
  SwapFileOwner reused = SwapFileOwner::self(0);  // a live pid whose process started at another time
  reused.pid = live.pid();
  reused.start_ticks = 1;
  const std::string reused_pid = d + "/" + swap_file_name(0, live.pid(), 7);
  write_file(reused_pid, header_of(reused));

  // Never removed: not provably a dead zoe process's.
  const std::string not_zoe = d + "/" + swap_file_name(0, gone, 1);  // zoe's name, no header
  write_file(not_zoe, std::string(8192, 'u'));
  SwapFileOwner elsewhere = SwapFileOwner::self(0);
  elsewhere.pid = gone;
  elsewhere.host = "another-host";
  const std::string other_host = d + "/" + swap_file_name(0, gone, 2);
  write_file(other_host, header_of(elsewhere));
  SwapFileOwner other_ns = SwapFileOwner::self(0);
  other_ns.pid = gone;
  other_ns.pid_namespace += 1;
  const std::string other_namespace = d + "/" + swap_file_name(0, gone, 3);
  write_file(other_namespace, header_of(other_ns));
  SwapFileOwner mismatch = SwapFileOwner::self(0);
  mismatch.pid = gone + 1;  // header and name disagree
  const std::string wrong_pid = d + "/" + swap_file_name(0, gone, 4);
  write_file(wrong_pid, header_of(mismatch));
  SwapFileOwner me = SwapFileOwner::self(0);
  const std::string mine = d + "/" + swap_file_name(0, ::getpid(), 999);
  write_file(mine, header_of(me));
  const std::string other_name = d + "/zoe-rank0-" + std::to_string(gone) + "-5.swap.bak";
  write_file(other_name, "");
  const std::string notes = d + "/notes.txt";
  write_file(notes, "keep me");
  std::filesystem::create_symlink(killed.path(), d + "/" + swap_file_name(0, gone, 6));

  LogCapture log;
  {
    NvmeStore store(options_in(d));
    for (const std::string& p : {killed.path(), empty_dead, reused_pid})
      EXPECT_FALSE(std::filesystem::exists(p)) << p << " should have been removed";
    for (const std::string& p :
         {live.path(), not_zoe, other_host, other_namespace, wrong_pid, mine, other_name, notes})
      EXPECT_TRUE(std::filesystem::exists(p)) << p << " must stay";
    EXPECT_TRUE(std::filesystem::exists(store.path()));
    EXPECT_TRUE(std::filesystem::is_symlink(d + "/" + swap_file_name(0, gone, 6))) << "a link is not followed";
  }
  const std::string text = log.text();
  EXPECT_NE(text.find("removed the stale swap file '" + killed.path() + "' (process " + std::to_string(killed_pid) +
                      ", rank 1, 0 MiB): its process no longer exists"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("'" + not_zoe + "' is named like a zoe swap file but has no zoe header"), std::string::npos)
      << text;
  EXPECT_EQ(remove_stale_swap_files(d), std::vector<std::string>{}) << "nothing more to remove";
  live.kill();
  EXPECT_EQ(remove_stale_swap_files(d), std::vector<std::string>{live.path()}) << "once it is gone";
}
