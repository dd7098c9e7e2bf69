// io_uring engine: round trips, many transfers in flight, fixed buffers, fault injection
// (EIO, ENOSPC, short transfers, EAGAIN), tmpfs and O_DIRECT handling.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <iostream>
#include <vector>

#include "io/direct_file.hpp"
#include "io/engine.hpp"
#include "tests/io/test_support.hpp"
#include "zoe/error.hpp"

using namespace zoe;
using namespace zoe::io;
using test::first_difference;
using test::pattern_buffer;

namespace {

struct Fixture {
  test::TempDir dir;
  DirectFile file;
  explicit Fixture(std::uint64_t bytes, const FileOptions& fo = {}, const std::string& parent = "/tmp")
      : dir(parent), file(DirectFile::create(dir.path() + "/data", bytes, fo)) {}
};

// Reads the file with plain pread: an independent view of what is on disk.
std::vector<unsigned char> pread_all(const std::string& path, std::uint64_t offset, std::size_t bytes) {
  std::vector<unsigned char> out(bytes);
  DirectFile f = DirectFile::open(path, FileOptions{.buffered = true});
  EXPECT_EQ(::pread(f.fd(), out.data(), bytes, static_cast<off_t>(offset)), static_cast<ssize_t>(bytes));
  return out;
}

}  // namespace

TEST(Engine, RoundTripsAcrossBlockBoundaries) {
  Fixture fx(64 << 20);
  EngineOptions eo;
  eo.block_size = 256 << 10;
  eo.queue_depth = 8;
  Engine engine(eo);
  FileRef ref = engine.register_file(fx.file);
  EXPECT_TRUE(fx.file.direct()) << "/tmp is ext4 here and should accept O_DIRECT";
  std::uint64_t offset = 0;
  std::uint64_t seed = 1;
  for (std::size_t bytes : {4096ul, 256ul << 10, (256ul << 10) + 4096, 3ul << 20, (17ul << 20) + 8192}) {
    auto src = pattern_buffer(bytes, seed);
    AlignedBuffer dst(bytes);
    std::memset(dst.data(), 0xA5, bytes);
    engine.write(ref, src.data(), offset, bytes).wait();
    engine.read(ref, dst.data(), offset, bytes).wait();
    EXPECT_EQ(first_difference(src.data(), dst.data(), bytes), -1) << bytes << " bytes";
    auto disk = pread_all(fx.file.path(), offset, bytes);
    EXPECT_EQ(first_difference(src.data(), disk.data(), bytes), -1) << bytes << " bytes on disk";
    offset += bytes;
    ++seed;
  }
  EngineStats s = engine.stats();
  EXPECT_EQ(s.resubmitted, 0u);
  EXPECT_EQ(s.bytes, 2 * offset);
  engine.unregister_file(ref);
}

TEST(Engine, ManyTransfersInFlightOnSeveralRings) {
  constexpr int kTransfers = 96;
  constexpr std::size_t kBytes = 192 << 10;
  Fixture fx(kTransfers * kBytes);
  EngineOptions eo;
  eo.block_size = 64 << 10;
  eo.queue_depth = 16;
  eo.threads = 2;
  Engine engine(eo);
  FileRef ref = engine.register_file(fx.file);
  std::vector<AlignedBuffer> src, dst;
  std::vector<Handle> handles;
  for (int i = 0; i < kTransfers; ++i) {
    src.push_back(pattern_buffer(kBytes, 100 + i));
    handles.push_back(engine.write(ref, src.back().data(), i * kBytes, kBytes));
  }
  for (auto& h : handles) h.wait();
  handles.clear();
  for (int i = 0; i < kTransfers; ++i) {
    dst.emplace_back(kBytes);
    handles.push_back(engine.read(ref, dst.back().data(), i * kBytes, kBytes));
  }
  for (int i = kTransfers - 1; i >= 0; --i) handles[i].wait();  // any order
  for (int i = 0; i < kTransfers; ++i)
    ASSERT_EQ(first_difference(src[i].data(), dst[i].data(), kBytes), -1) << "transfer " << i;
  EXPECT_EQ(engine.stats().requests, 2u * kTransfers * (kBytes / eo.block_size));
  engine.unregister_file(ref);
}

TEST(Engine, UsesRegisteredBuffersAndFallsBackWhenRefused) {
  Fixture fx(8 << 20);
  AlignedBuffer fixed(4 << 20);
  {
    Engine engine(EngineOptions{}, {{static_cast<std::byte*>(fixed.data()), fixed.size()}});
    FileRef ref = engine.register_file(fx.file);
    test::fill_pattern(fixed.data(), 4 << 20, 5);
    engine.write(ref, fixed.data(), 0, 4 << 20).wait();
    AlignedBuffer back(4 << 20);
    engine.read(ref, back.data(), 0, 4 << 20).wait();
    EXPECT_EQ(first_difference(fixed.data(), back.data(), 4 << 20), -1);
    if (engine.fixed_buffers_active()) {
      EXPECT_EQ(engine.stats().fixed_requests, 4u) << "the write's 4 requests lie in the fixed buffer";
    } else {
      std::printf("fixed buffers refused here (memlock limit), plain buffers used\n");
      EXPECT_EQ(engine.stats().fixed_requests, 0u);
    }
    engine.unregister_file(ref);
  }
  // A buffer the kernel cannot pin (PROT_NONE) makes registration fail: the engine must
  // fall back to plain buffers and still move data correctly.
  void* bad = ::mmap(nullptr, 1 << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(bad, MAP_FAILED);
  {
    Engine engine(EngineOptions{}, {{static_cast<std::byte*>(bad), 1u << 20}});
    EXPECT_FALSE(engine.fixed_buffers_active());
    FileRef ref = engine.register_file(fx.file);
    auto src = pattern_buffer(1 << 20, 9);
    AlignedBuffer back(1 << 20);
    engine.write(ref, src.data(), 4 << 20, 1 << 20).wait();
    engine.read(ref, back.data(), 4 << 20, 1 << 20).wait();
    EXPECT_EQ(first_difference(src.data(), back.data(), 1 << 20), -1);
    EXPECT_EQ(engine.stats().fixed_requests, 0u);
    engine.unregister_file(ref);
  }
  ::munmap(bad, 1 << 20);
}

namespace {
// Fault injector that turns the completion of the request at `offset` (op `op`) into
// `result`, once, while armed.
struct OneFault {
  std::atomic<bool> armed{false};
  Op op = Op::write;
  std::uint64_t offset = 0;
  int result = 0;
  std::atomic<int> fired{0};
  FaultInjector hook() {
    return [this](const Completion& c) {
      if (armed.load() && c.op == op && c.offset == offset) {
        armed = false;
        ++fired;
        return result;
      }
      return c.result;
    };
  }
};
}  // namespace

class EngineErrors : public ::testing::TestWithParam<int> {};

TEST_P(EngineErrors, ErrorNamesFileOffsetLengthErrnoAndKeepsEarlierData) {
  const int err = GetParam();
  Fixture fx(8 << 20);
  OneFault fault;
  EngineOptions eo;
  eo.block_size = 256 << 10;
  eo.fault_injector = fault.hook();
  Engine engine(eo);
  FileRef ref = engine.register_file(fx.file);

  auto first = pattern_buffer(2 << 20, 1);
  engine.write(ref, first.data(), 0, 2 << 20).wait();  // earlier data, must survive

  fault.op = Op::write;
  fault.offset = (2 << 20) + 3 * (256 << 10);  // the 4th request of the next write
  fault.result = -err;
  fault.armed = true;
  auto second = pattern_buffer(2 << 20, 2);
  Handle h = engine.write(ref, second.data(), 2 << 20, 2 << 20);
  try {
    h.wait();
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), err);
    EXPECT_EQ(e.path(), fx.file.path());
    EXPECT_EQ(e.offset(), static_cast<long long>(fault.offset));
    EXPECT_EQ(e.length(), 256 << 10);
    std::string what = e.what();
    EXPECT_NE(what.find("write of '" + fx.file.path() + "' at offset " + std::to_string(fault.offset)), std::string::npos) << what;
    EXPECT_NE(what.find("errno " + std::to_string(err)), std::string::npos) << what;
  }
  EXPECT_EQ(fault.fired.load(), 1);
  EXPECT_THROW(h.wait(), IoError) << "every wait reports the error";

  AlignedBuffer back(2 << 20);
  engine.read(ref, back.data(), 0, 2 << 20).wait();
  EXPECT_EQ(first_difference(first.data(), back.data(), 2 << 20), -1) << "earlier data damaged";

  // A failed read reports the same way.
  fault.op = Op::read;
  fault.offset = 256 << 10;
  fault.armed = true;
  try {
    engine.read(ref, back.data(), 0, 2 << 20).wait();
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), err);
    EXPECT_NE(std::string(e.what()).find("read of '"), std::string::npos) << e.what();
  }
  // And the engine keeps working afterwards.
  engine.write(ref, second.data(), 2 << 20, 2 << 20).wait();
  engine.read(ref, back.data(), 2 << 20, 2 << 20).wait();
  EXPECT_EQ(first_difference(second.data(), back.data(), 2 << 20), -1);
  engine.unregister_file(ref);
}

INSTANTIATE_TEST_SUITE_P(Errno, EngineErrors, ::testing::Values(EIO, ENOSPC),
                         [](const auto& info) { return info.param == EIO ? "EIO" : "ENOSPC"; });

TEST(Engine, ShortTransfersAndEagainAreResubmitted) {
  Fixture fx(32 << 20);
  std::atomic<int> shortened{0}, again{0};
  EngineOptions eo;
  eo.block_size = 512 << 10;
  eo.queue_depth = 4;
  eo.fault_injector = [&](const Completion& c) {
    if (c.result <= 0) return c.result;
    // Every full-size request first completes with only a quarter of its bytes (still
    // 4096-aligned, as the kernel's short direct transfers are); every 5th gets EAGAIN.
    if ((c.offset / eo.block_size) % 5 == 4 && c.bytes == eo.block_size && again++ % 2 == 0) return -EAGAIN;
    if (c.bytes == eo.block_size) {
      ++shortened;
      return static_cast<int>(c.bytes / 4);
    }
    return c.result;
  };
  Engine engine(eo);
  FileRef ref = engine.register_file(fx.file);
  const std::size_t bytes = (20 << 20) + 3 * 4096;  // tail request shorter than a block
  auto src = pattern_buffer(bytes, 11);
  AlignedBuffer back(bytes);
  engine.write(ref, src.data(), 4096, bytes).wait();
  engine.read(ref, back.data(), 4096, bytes).wait();
  EXPECT_EQ(first_difference(src.data(), back.data(), bytes), -1);
  auto disk = pread_all(fx.file.path(), 4096, bytes);
  EXPECT_EQ(first_difference(src.data(), disk.data(), bytes), -1);
  EXPECT_EQ(shortened.load(), 2 * 40) << "40 full-size requests per direction";
  EXPECT_GE(engine.stats().resubmitted, 2u * 40);
  engine.unregister_file(ref);
}

TEST(Engine, RejectsMisalignedDirectTransfers) {
  Fixture fx(1 << 20);
  Engine engine;
  FileRef ref = engine.register_file(fx.file);
  AlignedBuffer b(8192);
  EXPECT_THROW(engine.write(ref, static_cast<char*>(b.data()) + 512, 0, 4096), UsageError);
  EXPECT_THROW(engine.write(ref, b.data(), 100, 4096), UsageError);
  EXPECT_THROW(engine.write(ref, b.data(), 0, 1000), UsageError);
  engine.unregister_file(ref);
}

TEST(DirectFile, TmpfsWorksDirectOrBuffered) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm on this machine";
  Fixture fx(4 << 20, {}, "/dev/shm");
  std::printf("/dev/shm accepts O_DIRECT here: %s (Linux >= 6.6 does)\n", fx.file.direct() ? "yes" : "no");
  Engine engine;
  FileRef ref = engine.register_file(fx.file);
  auto src = pattern_buffer(3 << 20, 21);
  AlignedBuffer back(3 << 20);
  engine.write(ref, src.data(), 0, 3 << 20).wait();
  engine.read(ref, back.data(), 0, 3 << 20).wait();
  EXPECT_EQ(first_difference(src.data(), back.data(), 3 << 20), -1);
  engine.unregister_file(ref);
}

TEST(DirectFile, RefusedDirectIoFallsBackOrFailsWhenRequired) {
  test::TempDir dir("/dev/shm");
  FileOptions fo;
  fo.simulate_direct_refusal = true;  // what ramfs and tmpfs before Linux 6.6 do (EINVAL)
  {
    DirectFile f = DirectFile::create(dir.path() + "/buffered", 1 << 20, fo);
    EXPECT_FALSE(f.direct());
    Engine engine;
    FileRef ref = engine.register_file(f);
    auto src = pattern_buffer(1 << 20, 31);
    AlignedBuffer back(1 << 20);
    engine.write(ref, src.data(), 0, 1 << 20).wait();
    engine.read(ref, back.data(), 0, 1 << 20).wait();
    EXPECT_EQ(first_difference(src.data(), back.data(), 1 << 20), -1);
    engine.unregister_file(ref);
  }
  fo.require_direct = true;
  try {
    DirectFile::create(dir.path() + "/required", 1 << 20, fo);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "zoe.require_direct_io");
    EXPECT_NE(std::string(e.what()).find(dir.path() + "/required"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/required")) << "a refused file is not left behind";
}

TEST(DirectFile, NeverClobbersAndReportsMissingSpaceUpFront) {
  test::TempDir dir;
  DirectFile a = DirectFile::create(dir.path() + "/f", 8192);
  try {
    DirectFile::create(dir.path() + "/f", 8192);
    FAIL() << "an existing file was reopened";
  } catch (const SystemError& e) {
    EXPECT_EQ(e.error_code(), EEXIST);
  }
  EXPECT_EQ(std::filesystem::file_size(dir.path() + "/f"), 8192u);
  try {
    a.allocate(8192, 1ull << 50);  // 1 PiB: more than any test machine's free disk
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), ENOSPC);
    EXPECT_EQ(e.path(), dir.path() + "/f");
    EXPECT_NE(std::string(e.what()).find("bytes free"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.size(), 8192u);
}

// DeepSpeed's aio.single_submit and aio.overlap_events on the io_uring path: 64 requests of
// 4096 bytes, 8 in flight at most. Batched (default): the first 8 go to the kernel in one
// submission. single_submit: one submission per request. overlap_events false: batches of 8,
// the next only after every request of the last completed, so no refill is ever issued while
// requests are in flight, and exactly 64 / 8 submissions per transfer. (With overlap_events
// true, refills while in flight happen when completions trickle in: timing, not asserted.)
TEST(Engine, SingleSubmitAndOverlapEventsShapeTheSubmissions) {
  constexpr std::size_t kBytes = 64 * 4096;
  struct Mode {
    bool single_submit, overlap_events;
  };
  for (Mode m : {Mode{false, true}, Mode{true, true}, Mode{false, false}, Mode{true, false}}) {
    Fixture fx(kBytes);
    EngineOptions eo;
    eo.block_size = 4096;
    eo.queue_depth = 8;
    eo.single_submit = m.single_submit;
    eo.overlap_events = m.overlap_events;
    Engine engine(eo);
    FileRef ref = engine.register_file(fx.file);
    auto src = pattern_buffer(kBytes, 7);
    AlignedBuffer dst(kBytes);
    engine.write(ref, src.data(), 0, kBytes).wait();
    engine.read(ref, dst.data(), 0, kBytes).wait();
    EXPECT_EQ(first_difference(src.data(), dst.data(), kBytes), -1);
    const EngineStats st = engine.stats();
    const std::string mode = std::string("single_submit ") + (m.single_submit ? "true" : "false") +
                             ", overlap_events " + (m.overlap_events ? "true" : "false");
    std::cout << mode << ": " << st.requests << " requests, " << st.submit_calls << " submissions, "
              << st.overlapped_requests << " issued while others were in flight\n";
    ASSERT_EQ(st.resubmitted, 0u) << mode;  // tmpfs/ext4 transfer 4096 bytes whole
    EXPECT_EQ(st.requests, 128u) << mode;
    if (m.single_submit) {
      EXPECT_EQ(st.submit_calls, st.requests) << mode;
    } else if (!m.overlap_events) {
      EXPECT_EQ(st.submit_calls, 2u * 64 / 8) << mode;
    } else {
      EXPECT_LE(st.submit_calls, st.requests - 2 * 7) << mode;  // each transfer's first 8 in one
    }
    if (!m.overlap_events) EXPECT_EQ(st.overlapped_requests, 0u) << mode;
  }
}
