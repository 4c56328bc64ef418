#include "ringtrain/comm/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include "ringtrain/comm/communicator.h"

extern char** environ;

namespace ringtrain::comm {
namespace {

using Clock = std::chrono::steady_clock;

int to_int(const std::map<std::string, std::string>& env, const std::string& key) {
  const std::string& v = env.at(key);
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  RT_CHECK(!v.empty() && *end == '\0' && x >= 0 && x < (1L << 30), "environment variable ", key, "='", v,
           "' is not a non-negative integer");
  return static_cast<int>(x);
}

// An owned socket descriptor.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

// Reads or writes exactly n bytes before the deadline.
void transfer(int fd, void* buf, size_t n, bool write, Clock::time_point deadline, const std::string& what) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    const int r = ::poll(&pfd, 1, ms_left(deadline));
    if (r == 0) throw CommError(cat("rendezvous: timed out while ", what));
    if (r < 0 && errno == EINTR) continue;
    const ssize_t k = write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k == 0) throw CommError(cat("rendezvous: connection closed while ", what));
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw CommError(cat("rendezvous: ", std::strerror(errno), " while ", what));
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
}

sockaddr_in resolve(const RankInfo& info) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  const int rc = ::getaddrinfo(info.master_addr.c_str(), nullptr, &hints, &res);
  RT_CHECK(rc == 0 && res, "rendezvous: cannot resolve MASTER_ADDR '", info.master_addr, "': ", gai_strerror(rc));
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  addr.sin_port = htons(static_cast<uint16_t>(info.master_port));
  return addr;
}

std::vector<uint8_t> serve(const RankInfo& info, const std::vector<uint8_t>& payload, Clock::time_point deadline) {
  Fd listener(::socket(AF_INET, SOCK_STREAM, 0));
  RT_CHECK(listener.fd >= 0, "rendezvous: socket(): ", std::strerror(errno));
  const int one = 1;
  ::setsockopt(listener.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(info.master_port));
  if (::bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    throw CommError(cat("rendezvous: rank 0 cannot listen on port ", info.master_port, ": ", std::strerror(errno)));
  RT_CHECK(::listen(listener.fd, info.world) == 0, "rendezvous: listen(): ", std::strerror(errno));
  std::vector<Fd> peers;
  std::set<int> joined;
  while (static_cast<int>(joined.size()) < info.world - 1) {
    pollfd pfd{listener.fd, POLLIN, 0};
    const int r = ::poll(&pfd, 1, ms_left(deadline));
    if (r == 0) {
      std::string missing;
      for (int q = 1; q < info.world; ++q)
        if (!joined.count(q)) missing += cat(missing.empty() ? "" : ", ", q);
      throw CommError(cat("rendezvous: timed out on ", info.master_addr, ":", info.master_port,
                          " waiting for rank(s) ", missing, " of ", info.world));
    }
    if (r < 0) continue;
    Fd peer(::accept(listener.fd, nullptr, nullptr));
    if (peer.fd < 0) continue;
    int32_t peer_rank = -1;
    transfer(peer.fd, &peer_rank, sizeof peer_rank, false, deadline, "reading a peer's rank");
    RT_CHECK(peer_rank > 0 && peer_rank < info.world && !joined.count(peer_rank), "rendezvous: a peer announced rank ",
             peer_rank, " (world ", info.world, ", already joined ", joined.size(), "): are two jobs sharing port ",
             info.master_port, "?");
    joined.insert(peer_rank);
    peers.push_back(std::move(peer));
  }
  const uint32_t n = static_cast<uint32_t>(payload.size());
  for (Fd& peer : peers) {
    transfer(peer.fd, const_cast<uint32_t*>(&n), sizeof n, true, deadline, "sending the payload size");
    transfer(peer.fd, const_cast<uint8_t*>(payload.data()), n, true, deadline, "sending the payload");
  }
  return payload;
}

std::vector<uint8_t> join(const RankInfo& info, Clock::time_point deadline) {
  const sockaddr_in addr = resolve(info);
  for (;;) {
    Fd s(::socket(AF_INET, SOCK_STREAM, 0));
    RT_CHECK(s.fd >= 0, "rendezvous: socket(): ", std::strerror(errno));
    if (::connect(s.fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) {
      const int32_t me = info.rank;
      transfer(s.fd, const_cast<int32_t*>(&me), sizeof me, true, deadline, "announcing this rank");
      uint32_t n = 0;
      transfer(s.fd, &n, sizeof n, false, deadline, cat("waiting for rank 0 at ", info.master_addr, ":",
                                                           info.master_port, " to send the id"));
      RT_CHECK(n < (1u << 20), "rendezvous: implausible payload size ", n);
      std::vector<uint8_t> payload(n);
      transfer(s.fd, payload.data(), n, false, deadline, "receiving the payload");
      return payload;
    }
    if (Clock::now() >= deadline)
      throw CommError(cat("rendezvous: rank ", info.rank, " could not reach rank 0 at ", info.master_addr, ":",
                          info.master_port, " before the timeout (", std::strerror(errno), ")"));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

RankInfo rank_info_from(const std::map<std::string, std::string>& env) {
  RankInfo info;
  auto has = [&](const char* k) { return env.count(k) > 0; };
  if (has("RANK") && has("WORLD_SIZE")) {
    info.rank = to_int(env, "RANK");
    info.world = to_int(env, "WORLD_SIZE");
    info.local_rank = has("LOCAL_RANK") ? to_int(env, "LOCAL_RANK") : info.rank;
    info.source = "torchrun";
  } else if (has("OMPI_COMM_WORLD_RANK") && has("OMPI_COMM_WORLD_SIZE")) {
    info.rank = to_int(env, "OMPI_COMM_WORLD_RANK");
    info.world = to_int(env, "OMPI_COMM_WORLD_SIZE");
    info.local_rank = has("OMPI_COMM_WORLD_LOCAL_RANK") ? to_int(env, "OMPI_COMM_WORLD_LOCAL_RANK") : info.rank;
    info.source = "openmpi";
  } else if (has("SLURM_PROCID") && has("SLURM_NTASKS")) {
    info.rank = to_int(env, "SLURM_PROCID");
    info.world = to_int(env, "SLURM_NTASKS");
    info.local_rank = has("SLURM_LOCALID") ? to_int(env, "SLURM_LOCALID") : info.rank;
    info.source = "slurm";
  } else {
    info.source = "single process";
  }
  RT_CHECK(info.world >= 1 && info.rank < info.world, "rank ", info.rank, " is not below the world size ", info.world,
           " (", info.source, " variables)");
  if (has("MASTER_ADDR")) info.master_addr = env.at("MASTER_ADDR");
  if (has("MASTER_PORT")) {
    info.master_port = to_int(env, "MASTER_PORT");
    RT_CHECK(info.master_port > 0 && info.master_port < 65536, "MASTER_PORT=", info.master_port, " is not a port");
  }
  return info;
}

RankInfo rank_info_from_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) env.emplace(std::string(*e, static_cast<size_t>(eq - *e)), std::string(eq + 1));
  }
  return rank_info_from(env);
}

std::vector<uint8_t> rendezvous_broadcast(const RankInfo& info, const std::vector<uint8_t>& payload,
                                          std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  if (info.world == 1) return payload;
  return info.rank == 0 ? serve(info, payload, deadline) : join(info, deadline);
}

}  // namespace ringtrain::comm
