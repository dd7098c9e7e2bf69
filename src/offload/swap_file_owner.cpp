#include "src/offload/swap_file_owner.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>
#include <system_error>

#include "io/crc32c.hpp"
#include "src/common/check.hpp"
#include "src/common/log.hpp"

namespace zoe::offload {
namespace {

constexpr char kHeaderMagic[8] = {'Z', 'O', 'E', 'S', 'W', 'P', 'H', '1'};
constexpr std::uint32_t kHeaderVersion = 1;

// The first bytes of the header block; the rest of the block is zero.
struct RawHeader {
  char magic[8];
  std::uint32_t version;
  std::int32_t rank;
  std::int64_t pid;
  std::uint64_t start_ticks;
  std::uint64_t pid_namespace;
  char boot_id[48];  // NUL-terminated
  char host[72];     // NUL-terminated (HOST_NAME_MAX is 64)
  std::uint32_t crc;  // CRC32C of the bytes before it
};
static_assert(sizeof(RawHeader) <= kSwapHeaderBytes);

std::string read_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Field 22 (starttime) of /proc/<pid>/stat; 0 if the process or the file is gone.
std::uint64_t start_ticks_of(std::int64_t pid) {
  const std::string stat = read_line(("/proc/" + std::to_string(pid) + "/stat").c_str());
  const auto paren = stat.rfind(')');  // the command name may hold spaces and ')'
  if (paren == std::string::npos) return 0;
  const char* p = stat.data() + paren + 1;
  const char* end = stat.data() + stat.size();
  for (int field = 3; field < 22; ++field) {  // skip fields 3..21
    while (p < end && *p == ' ') ++p;
    while (p < end && *p != ' ') ++p;
  }
  while (p < end && *p == ' ') ++p;
  std::uint64_t ticks = 0;
  std::from_chars(p, end, ticks);
  return ticks;
}

std::uint64_t pid_namespace_of_self() {
  char link[64] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", link, sizeof link - 1);  // "pid:[4026531836]"
  if (n <= 0) return 0;
  const char* open = std::strchr(link, '[');
  std::uint64_t inode = 0;
  if (open) std::from_chars(open + 1, link + n, inode);
  return inode;
}

// "zoe-rank<R>-<pid>-<n>.swap" -> rank and pid; false for any other name.
bool parse_name(const std::string& name, std::int32_t& rank, std::int64_t& pid) {
  constexpr std::string_view prefix = "zoe-rank", suffix = ".swap";
  if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) || !name.ends_with(suffix))
    return false;
  const char* p = name.data() + prefix.size();
  const char* end = name.data() + name.size() - suffix.size();
  std::uint64_t serial = 0;
  auto r = std::from_chars(p, end, rank);
  if (r.ec != std::errc() || r.ptr == p || rank < 0 || r.ptr == end || *r.ptr != '-') return false;
  p = r.ptr + 1;
  r = std::from_chars(p, end, pid);
  if (r.ec != std::errc() || r.ptr == p || pid <= 0 || r.ptr == end || *r.ptr != '-') return false;
  p = r.ptr + 1;
  r = std::from_chars(p, end, serial);
  return r.ec == std::errc() && r.ptr != p && r.ptr == end;
}

bool process_absent(std::int64_t pid) { return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

// Why the owner is gone ("" if it may be alive or we cannot tell).
std::string owner_gone(const SwapFileOwner& owner, const SwapFileOwner& self) {
  if (owner.host != self.host || self.boot_id.empty()) return "";
  if (owner.boot_id != self.boot_id) return "written before the last reboot";
  if (owner.pid_namespace != self.pid_namespace || self.pid_namespace == 0) return "";
  if (process_absent(owner.pid)) return "its process no longer exists";
  const std::uint64_t now = start_ticks_of(owner.pid);
  if (now != 0 && owner.start_ticks != 0 && now != owner.start_ticks)
    return "its pid now belongs to a process started later";
  return "";
}

// True the first time this process reports `path` (every store scans the directory).
bool first_report(const std::string& path) {
  static std::mutex mutex;
  static std::set<std::string> reported;
  std::lock_guard lock(mutex);
  return reported.insert(path).second;
}

}  // namespace

SwapFileOwner SwapFileOwner::self(int rank) {
  SwapFileOwner o;
  o.pid = ::getpid();
  o.rank = rank;
  o.start_ticks = start_ticks_of(o.pid);
  o.pid_namespace = pid_namespace_of_self();
  o.boot_id = read_line("/proc/sys/kernel/random/boot_id");
  char host[HOST_NAME_MAX + 1] = {};
  if (::gethostname(host, sizeof host - 1) == 0) o.host = host;
  return o;
}

std::string swap_file_name(int rank, std::int64_t pid, unsigned serial) {
  return "zoe-rank" + std::to_string(rank) + "-" + std::to_string(pid) + "-" + std::to_string(serial) + ".swap";
}

void encode_swap_header(const SwapFileOwner& owner, void* block) {
  RawHeader h;
  std::memset(&h, 0, sizeof h);
  ZOE_CHECK_USAGE(owner.boot_id.size() < sizeof h.boot_id, "swap header: boot id '", owner.boot_id,
                  "' is longer than ", sizeof h.boot_id - 1, " bytes");
  ZOE_CHECK_USAGE(owner.host.size() < sizeof h.host, "swap header: host name '", owner.host, "' is longer than ",
                  sizeof h.host - 1, " bytes");
  std::memcpy(h.magic, kHeaderMagic, sizeof h.magic);
  h.version = kHeaderVersion;
  h.rank = owner.rank;
  h.pid = owner.pid;
  h.start_ticks = owner.start_ticks;
  h.pid_namespace = owner.pid_namespace;
  std::memcpy(h.boot_id, owner.boot_id.data(), owner.boot_id.size());
  std::memcpy(h.host, owner.host.data(), owner.host.size());
  h.crc = io::crc32c(&h, offsetof(RawHeader, crc));
  std::memset(block, 0, kSwapHeaderBytes);
  std::memcpy(block, &h, sizeof h);
}

std::optional<SwapFileOwner> decode_swap_header(const void* block, std::size_t bytes) {
  if (bytes < sizeof(RawHeader)) return std::nullopt;
  RawHeader h;
  std::memcpy(&h, block, sizeof h);
  if (std::memcmp(h.magic, kHeaderMagic, sizeof h.magic) != 0 || h.version != kHeaderVersion ||
      h.crc != io::crc32c(&h, offsetof(RawHeader, crc)))
    return std::nullopt;
  SwapFileOwner o;
  o.pid = h.pid;
  o.rank = h.rank;
  o.start_ticks = h.start_ticks;
  o.pid_namespace = h.pid_namespace;
  o.boot_id.assign(h.boot_id, strnlen(h.boot_id, sizeof h.boot_id));
  o.host.assign(h.host, strnlen(h.host, sizeof h.host));
  return o;
}

std::vector<std::string> remove_stale_swap_files(const std::string& dir) {
  std::vector<std::string> removed;
  const SwapFileOwner self = SwapFileOwner::self(0);
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec), end;
  if (ec) {
    ZOE_LOG_WARN("cannot look for stale swap files in '{}': {}", dir, ec.message());
    return removed;
  }
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    std::int32_t rank = 0;
    std::int64_t pid = 0;
    if (!parse_name(name, rank, pid) || pid == self.pid) continue;
    const std::string path = it->path().string();
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;  // gone meanwhile, a link, or unreadable: not ours to judge
    struct stat st {};
    char block[kSwapHeaderBytes];
    ssize_t got = -1;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) got = ::pread(fd, block, sizeof block, 0);
    ::close(fd);
    if (got < 0) continue;

    std::string reason;
    if (st.st_size == 0) {
      if (process_absent(pid)) reason = "empty, and its process no longer exists";
    } else if (auto owner = decode_swap_header(block, static_cast<std::size_t>(got))) {
      if (owner->pid == pid && owner->rank == rank) reason = owner_gone(*owner, self);
    } else {
      if (first_report(path))
        ZOE_LOG_WARN("'{}' is named like a zoe swap file but has no zoe header; not a zoe swap file, left in place",
                     path);
      continue;
    }
    if (reason.empty()) continue;
    if (::unlink(path.c_str()) != 0) {
      if (errno != ENOENT)  // ENOENT: another store removed it first
        ZOE_LOG_WARN("cannot remove the stale swap file '{}' of process {}: {}", path, pid, std::strerror(errno));
      continue;
    }
    ZOE_LOG_INFO("removed the stale swap file '{}' (process {}, rank {}, {} MiB): {}", path, pid, rank,
                 st.st_size >> 20, reason);
    removed.push_back(path);
  }
  if (ec) ZOE_LOG_WARN("cannot list '{}' for stale swap files: {}", dir, ec.message());
  return removed;
}

}  // namespace zoe::offload
