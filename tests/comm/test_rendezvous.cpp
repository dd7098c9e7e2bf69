// Launcher environment parsing (torchrun, mpirun, srun variables; errors list what was
// found) and the TCP rendezvous store (server + clients, unreachable server times out).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "src/comm/host_communicator.hpp"
#include "src/comm/launch_env.hpp"
#include "src/comm/tcp_store.hpp"
#include "src/device/host_device.hpp"
#include "zoe/error.hpp"
#include "zoe/ranks.hpp"

using namespace zoe;
using ::testing::HasSubstr;

namespace {
EnvLookup env(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}
std::string parse_error(std::map<std::string, std::string> vars) {
  try {
    parse_launch_env(env(std::move(vars)));
  } catch (const Error& e) {
    return e.message();
  }
  return "(no error)";
}
}  // namespace

TEST(LaunchEnv, Torchrun) {
  LaunchEnv e = parse_launch_env(
      env({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}}));
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_EQ(e.launcher, "torchrun");
}

TEST(LaunchEnv, MpirunAndSrun) {
  LaunchEnv m = parse_launch_env(env({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}));
  EXPECT_EQ(m.launcher, "mpirun");
  EXPECT_EQ(m.rank, 1);
  EXPECT_EQ(m.local_rank, 1);
  LaunchEnv s = parse_launch_env(env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "2"},
                                      {"MASTER_ADDR", "h"}, {"MASTER_PORT", "7"}}));
  EXPECT_EQ(s.launcher, "srun");
  EXPECT_EQ(s.rank, 5);
  EXPECT_EQ(s.world_size, 6);
  EXPECT_EQ(s.local_rank, 2);
  // srun exporting SLURM_* around a torchrun-style launch: consistent sets are fine.
  LaunchEnv both = parse_launch_env(env({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"SLURM_PROCID", "0"},
                                         {"SLURM_NTASKS", "1"}}));
  EXPECT_EQ(both.launcher, "torchrun");
  EXPECT_EQ(both.world_size, 1);
  EXPECT_EQ(both.master_addr, "");  // not needed for one rank
}

// The ranks on this host (what zoe.host_memory_budget "auto" shares the machine's memory by):
// each launcher's variable, else every rank counted as local.
TEST(LaunchEnv, LocalWorldSize) {
  EXPECT_EQ(parse_launch_env(env({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "a"},
                                  {"MASTER_PORT", "1"}}))
                .local_world_size,
            4);
  EXPECT_EQ(parse_launch_env(env({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}))
                .local_world_size,
            1);
  EXPECT_EQ(parse_launch_env(env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}, {"SLURM_NTASKS_PER_NODE", "3"},
                                  {"MASTER_ADDR", "h"}, {"MASTER_PORT", "7"}}))
                .local_world_size,
            3);
  EXPECT_EQ(parse_launch_env(env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "7"}}))
                .local_world_size,
            6);
  EXPECT_THAT(parse_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "3"}, {"MASTER_ADDR", "a"},
                           {"MASTER_PORT", "1"}}),
              HasSubstr("LOCAL_WORLD_SIZE must be in [1, WORLD_SIZE]"));
  EXPECT_EQ(make_local_ranks(3)[2].local_world_size, 3);
}

TEST(LaunchEnv, ErrorsListWhatWasFound) {
  std::string none = parse_error({});
  EXPECT_THAT(none, HasSubstr("no launcher variables are set"));
  EXPECT_THAT(none, HasSubstr("RANK=(unset)"));
  EXPECT_THAT(none, HasSubstr("SLURM_PROCID=(unset)"));
  EXPECT_THAT(parse_error({{"RANK", "0"}}), HasSubstr("torchrun's set is incomplete: WORLD_SIZE is unset"));
  std::string range = parse_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}});
  EXPECT_THAT(range, HasSubstr("RANK=4 is not in [0, WORLD_SIZE=4)"));
  EXPECT_THAT(range, HasSubstr("RANK='4', WORLD_SIZE='4'"));
  EXPECT_THAT(parse_error({{"RANK", "x"}, {"WORLD_SIZE", "2"}}), HasSubstr("RANK='x' is not an integer"));
  std::string master = parse_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  EXPECT_THAT(master, HasSubstr("MASTER_ADDR and MASTER_PORT"));
  EXPECT_THAT(master, HasSubstr("MASTER_ADDR=(unset)"));
  EXPECT_THAT(parse_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"},
                           {"OMPI_COMM_WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}}),
              HasSubstr("torchrun and mpirun variables disagree"));
  EXPECT_THAT(parse_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "70000"}}),
              HasSubstr("MASTER_PORT must be in [1, 65535]"));
}

TEST(TcpStore, ServerAndClientsShareKeys) {
  // Find a free port by letting the kernel pick one for a throwaway socket.
  int port = 0;
  for (int attempt = 0; attempt < 20 && port == 0; ++attempt) {
    int candidate = 20000 + (std::rand() % 30000);
    try {
      auto server = std::make_shared<TcpStore>("127.0.0.1", candidate, true, std::chrono::seconds(5));
      port = candidate;
      TcpStore client1("127.0.0.1", port, false, std::chrono::seconds(5));
      TcpStore client2("localhost", port, false, std::chrono::seconds(5));
      client1.set("a", {'x', 'y'});
      server->set("b", std::vector<char>(100000, 'z'));
      EXPECT_EQ(client2.get("a", std::chrono::seconds(1), "test"), (std::vector<char>{'x', 'y'}));
      EXPECT_EQ(client1.get("b", std::chrono::seconds(1), "test").size(), 100000u);
      EXPECT_EQ(server->try_get("a"), (std::vector<char>{'x', 'y'}));
      EXPECT_FALSE(client2.try_get("missing").has_value());
      // A key set later by another thread is seen by a blocked get.
      std::thread late([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        client1.set("late", {'1'});
      });
      EXPECT_EQ(client2.get("late", std::chrono::seconds(5), "test"), (std::vector<char>{'1'}));
      late.join();
      try {
        client2.get("never", std::chrono::milliseconds(100), "waiting for the test key");
        ADD_FAILURE() << "no timeout";
      } catch (const TimeoutError& e) {
        EXPECT_THAT(std::string(e.what()), HasSubstr("waiting for the test key: key 'never' was not set"));
      }
    } catch (const SystemError&) {
      // port in use: try another
    }
  }
  EXPECT_NE(port, 0) << "no free port found";
}

TEST(TcpStore, UnreachableServerTimesOutNamingTheAddress) {
  try {
    TcpStore client("127.0.0.1", 1, false, std::chrono::milliseconds(200));  // nothing listens on port 1
    ADD_FAILURE() << "connected to port 1";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("127.0.0.1:1 (MASTER_ADDR:MASTER_PORT)"));
  }
}
