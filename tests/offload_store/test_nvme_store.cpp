// NVMe store: round trips of 1 B .. 64 MiB + 1, many swaps in flight, per-rank/per-engine
// files, corruption detection, fault injection, tmpfs, pinned-pool buffers.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <vector>

#include "io/crc32c.hpp"
#include "src/offload/nvme_store.hpp"
#include "src/offload/pinned_pool.hpp"
#include "src/offload/swap_file_owner.hpp"
#include "tests/io/scoped_mount.hpp"
#include "tests/io/test_support.hpp"
#include "zoe/error.hpp"

using namespace zoe;
using namespace zoe::offload;
using test::first_difference;
using test::pattern_buffer;

namespace {

NvmeStoreOptions options_in(const std::string& dir) {
  NvmeStoreOptions o;
  o.dir = dir;
  o.aio.block_size = 1 << 20;
  o.aio.queue_depth = 16;
  return o;
}

std::vector<unsigned char> read_file(const std::string& path, std::uint64_t offset, std::size_t bytes) {
  std::vector<unsigned char> out(bytes);
  int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::pread(fd, out.data(), bytes, static_cast<off_t>(offset)), static_cast<ssize_t>(bytes));
  ::close(fd);
  return out;
}

void write_file_byte(const std::string& path, std::uint64_t offset, unsigned char value) {
  int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, &value, 1, static_cast<off_t>(offset)), 1);
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

TEST(NvmeStore, RoundTripsFromOneByteTo64MiBPlusOne) {
  test::TempDir dir;
  NvmeStore store(options_in(dir.path()));
  EXPECT_TRUE(store.direct_io());
  // 4064 + 32-byte trailer is exactly one block; 28,824,000 is the trainer's odd-sized tensor.
  const std::vector<std::size_t> sizes = {1, 31, 4063, 4064, 4065, 4095, 4096, 4097, 1 << 20, (1 << 20) + 1,
                                          28'824'000, (64u << 20) + 1};
  std::vector<AlignedBuffer> src, dst;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    store.register_tensor("t" + std::to_string(i), sizes[i]);
    src.push_back(pattern_buffer(sizes[i], 1000 + i));
    dst.emplace_back(sizes[i]);
    std::memset(dst.back().data(), 0x5A, sizes[i]);
  }
  std::vector<SwapHandle> handles;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    handles.push_back(store.swap_out("t" + std::to_string(i), src[i].data(), sizes[i]));
  for (auto& h : handles) h.wait();
  handles.clear();
  for (std::size_t i = 0; i < sizes.size(); ++i)
    handles.push_back(store.swap_in("t" + std::to_string(i), dst[i].data(), sizes[i]));
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    handles[i].wait();
    EXPECT_EQ(first_difference(src[i].data(), dst[i].data(), sizes[i]), -1) << sizes[i] << " bytes";
  }
  // Independent check of the on-disk layout: data at the 4 KiB-aligned extent, and the
  // trailer's CRC equal to the table-path CRC32C of the data.
  std::uint64_t expected_offset = kSwapHeaderBytes;  // the owner's header block comes first
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    Extent e = store.extent("t" + std::to_string(i));
    EXPECT_EQ(e.offset, expected_offset);
    EXPECT_EQ(e.capacity, (sizes[i] + 32 + 4095) / 4096 * 4096);
    expected_offset += e.capacity;
    if (sizes[i] > (1 << 20) + 1) continue;  // keep the test fast
    auto disk = read_file(store.path(), e.offset, e.capacity);
    EXPECT_EQ(first_difference(src[i].data(), disk.data(), sizes[i]), -1);
    std::uint32_t crc;
    std::memcpy(&crc, disk.data() + e.capacity - 32 + 16, 4);
    EXPECT_EQ(crc, io::crc32c_portable(src[i].data(), sizes[i])) << sizes[i];
  }
  EXPECT_EQ(store.file_bytes(), expected_offset);
  EXPECT_EQ(std::filesystem::file_size(store.path()), expected_offset) << "preallocated";
}

TEST(NvmeStore, ManySwapsInFlightAndRewrites) {
  test::TempDir dir;
  auto o = options_in(dir.path());
  o.aio.block_size = 64 << 10;
  o.aio.queue_depth = 32;
  o.aio.threads = 2;
  NvmeStore store(o);
  constexpr int kTensors = 48;
  constexpr std::size_t kBytes = 300'000;
  std::vector<AlignedBuffer> src, dst;
  for (int i = 0; i < kTensors; ++i) {
    store.register_tensor("g" + std::to_string(i), kBytes);
    src.push_back(pattern_buffer(kBytes, i));
    dst.emplace_back(kBytes);
  }
  for (int round = 0; round < 2; ++round) {
    std::vector<SwapHandle> out, in;
    for (int i = 0; i < kTensors; ++i) {
      test::fill_pattern(src[i].data(), kBytes, 10'000 * round + i);
      out.push_back(store.swap_out("g" + std::to_string(i), src[i].data(), kBytes));
    }
    // swap_in right behind swap_out of the same tensor: the store orders them.
    for (int i = 0; i < kTensors; ++i) in.push_back(store.swap_in("g" + std::to_string(i), dst[i].data(), kBytes));
    for (int i = 0; i < kTensors; ++i) {
      out[i].wait();
      in[i].wait();
      ASSERT_EQ(first_difference(src[i].data(), dst[i].data(), kBytes), -1) << "round " << round << " tensor " << i;
    }
  }
}

TEST(NvmeStore, OneFilePerRankAndEngineRemovedAtDestruction) {
  test::TempDir dir;
  std::string path_a, path_b, path_c;
  {
    NvmeStore a(options_in(dir.path()));
    NvmeStore b(options_in(dir.path()));  // same rank, same directory: a second engine
    auto oc = options_in(dir.path());
    oc.rank = 3;
    NvmeStore c(oc);
    path_a = a.path();
    path_b = b.path();
    path_c = c.path();
    EXPECT_NE(path_a, path_b);
    EXPECT_NE(path_c.find("rank3"), std::string::npos) << path_c;
    auto x = pattern_buffer(10'000, 1), y = pattern_buffer(10'000, 2);
    AlignedBuffer back(10'000);
    a.register_tensor("exp_avg", 10'000);
    b.register_tensor("exp_avg", 10'000);
    a.swap_out("exp_avg", x.data(), 10'000).wait();
    b.swap_out("exp_avg", y.data(), 10'000).wait();
    a.swap_in("exp_avg", back.data(), 10'000).wait();
    EXPECT_EQ(first_difference(x.data(), back.data(), 10'000), -1);
    b.swap_in("exp_avg", back.data(), 10'000).wait();
    EXPECT_EQ(first_difference(y.data(), back.data(), 10'000), -1);
    EXPECT_TRUE(std::filesystem::exists(path_a));
  }
  EXPECT_FALSE(std::filesystem::exists(path_a));
  EXPECT_FALSE(std::filesystem::exists(path_b));
  EXPECT_FALSE(std::filesystem::exists(path_c));
}

TEST(NvmeStore, FlippedByteIsCorruptionNamingTheTensor) {
  test::TempDir dir;
  NvmeStore store(options_in(dir.path()));
  const std::size_t bytes = 28'824'000;
  auto src = pattern_buffer(bytes, 77);
  AlignedBuffer back(bytes);
  store.register_tensor("layer0.exp_avg_sq", bytes);
  store.register_tensor("layer1.master", 5000);
  store.swap_out("layer0.exp_avg_sq", src.data(), bytes).wait();
  auto small = pattern_buffer(5000, 78);
  store.swap_out("layer1.master", small.data(), 5000).wait();

  Extent e = store.extent("layer0.exp_avg_sq");
  for (std::uint64_t where : {e.offset + 12'345'678, e.offset + bytes - 1, e.offset + e.capacity - 20}) {
    auto original = read_file(store.path(), where, 1)[0];
    write_file_byte(store.path(), where, original ^ 0x10);
    try {
      store.swap_in("layer0.exp_avg_sq", back.data(), bytes).wait();
      FAIL() << "flip at " << where << " not detected";
    } catch (const CorruptionError& err) {
      EXPECT_NE(std::string(err.what()).find("'layer0.exp_avg_sq'"), std::string::npos) << err.what();
      EXPECT_NE(std::string(err.what()).find(store.path()), std::string::npos) << err.what();
    }
    write_file_byte(store.path(), where, original);
    store.swap_in("layer0.exp_avg_sq", back.data(), bytes).wait();  // repaired: clean again
    EXPECT_EQ(first_difference(src.data(), back.data(), bytes), -1);
  }
  // A neighbour's extent is untouched by all of this.
  AlignedBuffer small_back(5000);
  store.swap_in("layer1.master", small_back.data(), 5000).wait();
  EXPECT_EQ(first_difference(small.data(), small_back.data(), 5000), -1);
}

TEST(NvmeStore, InjectedErrorsSurfaceAndEarlierDataSurvives) {
  test::TempDir dir;
  std::atomic<int> mode{0};  // 0 none, 1 EIO on writes, 2 ENOSPC on writes, 3 EIO on reads
  std::atomic<std::uint64_t> target{0};
  auto o = options_in(dir.path());
  o.aio.fault_injector = [&](const io::Completion& c) {
    int m = mode.load();
    if (c.offset != target.load()) return c.result;
    if ((m == 1 || m == 2) && c.op == io::Op::write) return m == 1 ? -EIO : -ENOSPC;
    if (m == 3 && c.op == io::Op::read) return -EIO;
    return c.result;
  };
  NvmeStore store(o);
  const std::size_t bytes = (3 << 20) + 100;
  auto a = pattern_buffer(bytes, 1), b = pattern_buffer(bytes, 2);
  AlignedBuffer back(bytes);
  store.register_tensor("a", bytes);
  store.register_tensor("b", bytes);
  store.swap_out("a", a.data(), bytes).wait();

  Extent eb = store.extent("b");
  target = eb.offset + (1 << 20);  // the second request of b's write
  for (int m : {1, 2}) {
    mode = m;
    try {
      store.swap_out("b", b.data(), bytes).wait();
      FAIL() << "no error";
    } catch (const IoError& err) {
      EXPECT_EQ(err.error_code(), m == 1 ? EIO : ENOSPC);
      EXPECT_EQ(err.path(), store.path());
      EXPECT_EQ(err.offset(), static_cast<long long>(eb.offset + (1 << 20)));
      EXPECT_EQ(err.length(), 1 << 20);
    }
    mode = 0;
    store.swap_in("a", back.data(), bytes).wait();
    EXPECT_EQ(first_difference(a.data(), back.data(), bytes), -1) << "earlier tensor damaged";
  }
  store.swap_out("b", b.data(), bytes).wait();  // a retry after the fault succeeds
  mode = 3;
  EXPECT_THROW(store.swap_in("b", back.data(), bytes).wait(), IoError);
  mode = 0;
  store.swap_in("b", back.data(), bytes).wait();
  EXPECT_EQ(first_difference(b.data(), back.data(), bytes), -1);
}

TEST(NvmeStore, ShortTransfersAreCompleted) {
  test::TempDir dir;
  std::atomic<int> shortened{0};
  auto o = options_in(dir.path());
  o.aio.fault_injector = [&](const io::Completion& c) {
    if (c.result > 8192 && c.bytes == (1u << 20)) {
      ++shortened;
      return 8192;  // the kernel moved only two blocks
    }
    return c.result;
  };
  NvmeStore store(o);
  const std::size_t bytes = 28'824'000;
  auto src = pattern_buffer(bytes, 5);
  AlignedBuffer back(bytes);
  store.register_tensor("w", bytes);
  store.swap_out("w", src.data(), bytes).wait();
  store.swap_in("w", back.data(), bytes).wait();
  EXPECT_EQ(first_difference(src.data(), back.data(), bytes), -1);
  EXPECT_EQ(shortened.load(), 2 * 27) << "27 full 1 MiB requests each way";
}

TEST(NvmeStore, TmpfsDirectoryAndRefusedDirectIo) {
  test::TempDir dir("/dev/shm");
  for (bool refuse : {false, true}) {
    auto o = options_in(dir.path());
    o.simulate_direct_refusal = refuse;
    NvmeStore store(o);
    if (refuse) EXPECT_FALSE(store.direct_io());
    auto src = pattern_buffer(1'000'001, 9);
    AlignedBuffer back(1'000'001);
    store.register_tensor("p", 1'000'001);
    store.swap_out("p", src.data(), 1'000'001).wait();
    store.swap_in("p", back.data(), 1'000'001).wait();
    EXPECT_EQ(first_difference(src.data(), back.data(), 1'000'001), -1) << "refused " << refuse;
  }
  auto o = options_in(dir.path());
  o.simulate_direct_refusal = true;
  o.require_direct_io = true;
  EXPECT_THROW(NvmeStore store(o), ConfigError);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "no file left behind";
}

// ramfs refuses O_DIRECT at open (EINVAL, after O_CREAT made the file) and has no fallocate.
TEST(NvmeStore, RamfsFallsBackToBufferedAndLeavesNoFiles) {
  test::ScopedMount ramfs("ramfs");
  if (!ramfs.mounted()) GTEST_SKIP() << ramfs.why();
  {
    NvmeStore store(options_in(ramfs.path()));
    EXPECT_FALSE(store.direct_io());
    auto src = pattern_buffer(1'000'001, 12);
    AlignedBuffer back(1'000'001);
    store.register_tensor("p", 1'000'001);
    store.swap_out("p", src.data(), 1'000'001).wait();
    store.swap_in("p", back.data(), 1'000'001).wait();
    EXPECT_EQ(first_difference(src.data(), back.data(), 1'000'001), -1);
    std::size_t files = 0;
    for (const auto& e : std::filesystem::directory_iterator(ramfs.path())) {
      ++files;
      EXPECT_EQ(e.path().string(), store.path());
    }
    EXPECT_EQ(files, 1u) << "one swap file, no empty leftovers of refused opens";
  }
  EXPECT_TRUE(std::filesystem::is_empty(ramfs.path())) << "the file is removed with the store";
  auto o = options_in(ramfs.path());
  o.require_direct_io = true;
  EXPECT_THROW(NvmeStore store(o), ConfigError);
  EXPECT_TRUE(std::filesystem::is_empty(ramfs.path())) << "no file left behind by the refusal";
}

TEST(NvmeStore, PinnedPoolBuffersAsFixedBuffersAndMemlockFallback) {
  test::TempDir dir;
  for (bool fail_mlock : {false, true}) {
    PinnedPool pool({.buffer_count = 3, .buffer_bytes = 3 << 20, .simulate_mlock_failure = fail_mlock});
    auto o = options_in(dir.path());
    o.fixed_buffers = pool.buffers();
    NvmeStore store(o);
    const std::size_t bytes = (3 << 20) - 5;
    PinnedBuffer out = pool.acquire(), in = pool.acquire();
    test::fill_pattern(out.data(), bytes, 40 + fail_mlock);
    store.register_tensor("m", bytes);
    store.swap_out("m", out.data(), bytes).wait();
    store.swap_in("m", in.data(), bytes).wait();
    EXPECT_EQ(first_difference(out.data(), in.data(), bytes), -1) << "mlock failed: " << fail_mlock;
    if (store.engine().fixed_buffers_active())
      EXPECT_EQ(store.engine().stats().fixed_requests, 6u) << "3 body requests each way";
  }
}

TEST(NvmeStore, MisuseIsAUsageErrorAndMissingDiskAnIoError) {
  test::TempDir dir;
  NvmeStore store(options_in(dir.path()));
  AlignedBuffer buf(8192);
  store.register_tensor("x", 8000);
  EXPECT_THROW(store.register_tensor("x", 8000), UsageError);
  EXPECT_THROW(store.register_tensor("empty", 0), UsageError);
  EXPECT_THROW(store.swap_out("nope", buf.data(), 8000), UsageError);
  EXPECT_THROW(store.swap_in("x", buf.data(), 8000), UsageError) << "never swapped out";
  EXPECT_THROW(store.swap_out("x", buf.data(), 7999), UsageError);
  EXPECT_THROW(store.swap_out("x", static_cast<char*>(buf.data()) + 8, 8000), UsageError);
  try {
    store.register_tensor("huge", std::size_t{1} << 50);
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), ENOSPC);
    EXPECT_NE(std::string(e.what()).find("tensor 'huge'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(store.contains("huge"));
  store.register_tensor("after", 100);  // the store is still usable
  EXPECT_EQ(store.extent("after").offset, kSwapHeaderBytes + 8192u);
}

TEST(NvmeStore, OptionsFromTheEngineConfig) {
  Config config;
  config.aio.block_size = 512 << 10;
  config.aio.queue_depth = 8;
  config.aio.intra_op_parallelism = 2;
  config.zoe.require_direct_io = true;
  NvmeStoreOptions o = NvmeStoreOptions::from_config(config, "/tmp/somewhere", 5);
  EXPECT_EQ(o.dir, "/tmp/somewhere");
  EXPECT_EQ(o.rank, 5);
  EXPECT_EQ(o.aio.block_size, 512u << 10);
  EXPECT_EQ(o.aio.queue_depth, 8u);
  EXPECT_EQ(o.aio.threads, 2u);
  EXPECT_TRUE(o.require_direct_io);
  config.aio.block_size = 4097;
  try {
    NvmeStoreOptions::from_config(config, "/tmp/x", 0);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "aio.block_size");
  }
}
