// TorchStoreClient against fakes of torch's TCPStore servers (both dialects, both ways a new
// server treats an unvalidated first query, and a server that is not a store), the launcher
// environment's choice of rendezvous, and zoe's store on an abstract Unix socket.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <thread>

#include "fake_torch_store.hpp"
#include "src/comm/launch_env.hpp"
#include "src/comm/tcp_store.hpp"
#include "src/comm/torch_store_client.hpp"
#include "zoe/error.hpp"

using namespace zoe;
using ::testing::HasSubstr;
using Flavor = test::FakeTorchStore::Flavor;
using std::chrono::milliseconds;

namespace {
std::vector<char> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// Two clients share keys through the fake; returns the dialect the first one detected.
TorchStoreDialect share_keys(test::FakeTorchStore& server) {
  TorchStoreClient a("127.0.0.1", server.port(), "zoe/attempt_0/", milliseconds(5000), milliseconds(300));
  TorchStoreClient b("localhost", server.port(), "zoe/attempt_0/", milliseconds(5000), milliseconds(300));
  EXPECT_EQ(a.dialect(), b.dialect());
  EXPECT_FALSE(b.try_get("k").has_value());
  a.set("k", bytes("value of k"));
  EXPECT_EQ(b.get("k", milliseconds(1000), "test"), bytes("value of k"));
  b.set("big", std::vector<char>(100000, 'z'));
  EXPECT_EQ(a.get("big", milliseconds(1000), "test").size(), 100000u);
  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(50));
    a.set("late", bytes("1"));
  });
  EXPECT_EQ(b.get("late", milliseconds(5000), "test"), bytes("1"));
  late.join();
  // Stored as torch's own client stores them: "/" + prefix + key.
  auto keys = server.keys();
  EXPECT_EQ(keys.count("/zoe/attempt_0/k"), 1u);
  EXPECT_EQ(keys["/zoe/attempt_0/k"], "value of k");
  EXPECT_EQ(keys.size(), 3u);
  return a.dialect();
}
}  // namespace

TEST(TorchStoreClient, SpeaksTheUnvalidatedDialectOfTorchBefore2_1) {
  test::FakeTorchStore server(Flavor::unvalidated);
  EXPECT_EQ(share_keys(server), TorchStoreDialect::unvalidated);
  EXPECT_EQ(server.connections(), 2);   // the probe's connection is kept
  EXPECT_FALSE(server.saw_huge_key());  // never sent VALIDATE, which this server reads as a ~1 GB key
}

TEST(TorchStoreClient, SpeaksTheValidatedDialectWhenTheServerClosesOnTheProbe) {
  test::FakeTorchStore server(Flavor::validated_closes);
  EXPECT_EQ(share_keys(server), TorchStoreDialect::validated);
  EXPECT_EQ(server.connections(), 4);  // probe + validated connection per client
  EXPECT_FALSE(server.saw_validated_empty_check());
}

TEST(TorchStoreClient, SpeaksTheValidatedDialectWhenTheServerIgnoresTheProbe) {
  test::FakeTorchStore server(Flavor::validated_ignores);  // torch's libuv backend
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(share_keys(server), TorchStoreDialect::validated);
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(600));  // each client waited out its 300 ms probe
  EXPECT_EQ(server.connections(), 4);
  EXPECT_FALSE(server.saw_validated_empty_check());
}

TEST(TorchStoreClient, RefusesAServerThatIsNotATorchStore) {
  test::FakeTorchStore server(Flavor::not_a_store);
  try {
    TorchStoreClient c("127.0.0.1", server.port(), "zoe/", milliseconds(2000), milliseconds(300));
    ADD_FAILURE() << "accepted a server answering 0x7f";
  } catch (const CommError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("answered byte 127 to a TCPStore CHECK"));
    EXPECT_THAT(std::string(e.what()), HasSubstr("Unset TORCHELASTIC_USE_AGENT_STORE"));
  }
}

TEST(TorchStoreClient, UnreachableStoreTimesOutNamingTheAddress) {
  try {
    TorchStoreClient c("127.0.0.1", 1, "zoe/", milliseconds(200));  // nothing listens on port 1
    ADD_FAILURE() << "connected to port 1";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("torchrun's rendezvous store"));
    EXPECT_THAT(std::string(e.what()), HasSubstr("127.0.0.1:1 (MASTER_ADDR:MASTER_PORT)"));
  }
}

TEST(TorchStoreClient, RefusesValuesOverTorchsLimit) {
  test::FakeTorchStore server(Flavor::unvalidated);
  TorchStoreClient c("127.0.0.1", server.port(), "zoe/", milliseconds(2000));
  try {
    c.set("huge", std::vector<char>(8 * 1024 * 1024 + 1));
    ADD_FAILURE() << "sent a value over 8 MiB";
  } catch (const UsageError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("'/zoe/huge' is 8388609 bytes; torch's TCPStore takes at most 8388608"));
  }
  EXPECT_TRUE(server.keys().empty());
}

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

TEST(LaunchEnvRendezvous, TorchrunAgentStoreOrRankZerosStore) {
  // What torch 1.13's torchrun (static rendezvous) gives its workers.
  std::map<std::string, std::string> torchrun{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"},
                                              {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"},
                                              {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                              {"TORCHELASTIC_RESTART_COUNT", "2"}};
  LaunchEnv e = parse_launch_env(env(torchrun));
  EXPECT_EQ(e.rendezvous, RendezvousKind::torch_agent_store);
  EXPECT_EQ(e.restart_count, 2);
  EXPECT_EQ(agent_store_key_prefix(e), "zoe/attempt_2/");
  // --standalone / c10d rendezvous in torch 1.13: False, MASTER_PORT is free for rank 0.
  torchrun["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_EQ(parse_launch_env(env(torchrun)).rendezvous, RendezvousKind::zoe_store_tcp);
  torchrun.erase("TORCHELASTIC_USE_AGENT_STORE");
  EXPECT_EQ(parse_launch_env(env(torchrun)).rendezvous, RendezvousKind::zoe_store_tcp);
  torchrun["TORCHELASTIC_USE_AGENT_STORE"] = "yes";
  EXPECT_THAT(parse_error(torchrun), HasSubstr("TORCHELASTIC_USE_AGENT_STORE='yes' is neither True nor False"));
  EXPECT_EQ(parse_launch_env(env({{"RANK", "0"}, {"WORLD_SIZE", "1"}})).rendezvous, RendezvousKind::none);
}

TEST(LaunchEnvRendezvous, MpirunOnOneHostNeedsNoAddress) {
  // What Open MPI 4.1's mpirun -np 2 gives its ranks (no MASTER_*).
  std::map<std::string, std::string> mpi{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                         {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                         {"PMIX_NAMESPACE", "1589116929"}, {"OMPI_MCA_ess_base_jobid", "77"}};
  LaunchEnv e = parse_launch_env(env(mpi));
  EXPECT_EQ(e.rendezvous, RendezvousKind::zoe_store_local);
  EXPECT_EQ(e.job_id, "1589116929");
  EXPECT_EQ(local_socket_name(e, 1000), "zoe-rdzv-1000-1589116929");
  mpi.erase("PMIX_NAMESPACE");
  EXPECT_EQ(parse_launch_env(env(mpi)).job_id, "77");
  e.job_id = std::string(200, 'j');
  EXPECT_EQ(local_socket_name(e, 0).size(), std::string("zoe-rdzv-0-").size() + 16);
  // Given an address, the ranks use it (a job across hosts).
  mpi["MASTER_ADDR"] = "node0";
  mpi["MASTER_PORT"] = "29500";
  EXPECT_EQ(parse_launch_env(env(mpi)).rendezvous, RendezvousKind::zoe_store_tcp);
}

TEST(LaunchEnvRendezvous, MpirunAcrossHostsSaysWhatToPass) {
  std::string across = parse_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"PMIX_NAMESPACE", "9"}});
  EXPECT_THAT(across, HasSubstr("mpirun started ranks on several hosts"));
  EXPECT_THAT(across, HasSubstr("pass -x MASTER_ADDR=<rank 0's host name or IP> -x MASTER_PORT=<a free TCP port there>"));
  EXPECT_THAT(across, HasSubstr("OMPI_COMM_WORLD_LOCAL_SIZE='2'"));
  std::string no_job = parse_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_THAT(no_job, HasSubstr("pass -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=<a free TCP port>"));
  // Half an address is refused, not ignored.
  EXPECT_THAT(parse_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"PMIX_NAMESPACE", "9"}, {"MASTER_ADDR", "node0"}}),
              HasSubstr("MASTER_ADDR is set but MASTER_PORT is not: set both"));
  // srun and hand-set variables still need the address.
  EXPECT_THAT(parse_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}), HasSubstr("MASTER_ADDR and MASTER_PORT"));
}

TEST(TcpStore, ServesOnAnAbstractUnixSocket) {
  const std::string name = "zoe-test-" + std::to_string(::getpid());
  TcpStore server(TcpStore::LocalSocket{name}, true, milliseconds(1000));
  TcpStore client(TcpStore::LocalSocket{name}, false, milliseconds(1000));
  client.set("a", bytes("xy"));
  EXPECT_EQ(server.get("a", milliseconds(1000), "test"), bytes("xy"));
  server.set("b", bytes("z"));
  EXPECT_EQ(client.get("b", milliseconds(1000), "test"), bytes("z"));
  try {
    TcpStore second(TcpStore::LocalSocket{name}, true, milliseconds(100));
    ADD_FAILURE() << "two servers on one name";
  } catch (const SystemError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("holds it"));
  }
  try {
    TcpStore none(TcpStore::LocalSocket{name + "-none"}, false, milliseconds(100));
    ADD_FAILURE() << "connected to nothing";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("abstract socket '" + name + "-none'"));
    EXPECT_THAT(std::string(e.what()), HasSubstr("need MASTER_ADDR=<rank 0's host> MASTER_PORT=<free port> (mpirun -x)"));
  }
}
