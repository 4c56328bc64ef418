// In-process communicator. All ranks share one Group guarded by a mutex and a condition variable.
//
// Collectives are two barrier points: at the first every rank has published its arguments (a Slot) so that
// each rank can check the calls match and read its peers' send buffers into private scratch; at the second
// every rank is done reading, so each copies its scratch into its receive buffer (any aliasing of send and
// receive buffers is therefore safe) and may reuse its send buffer. A barrier point is a per-rank counter:
// point k is passed when every rank's counter is >= k, and the ranks still below k are the ones to name when
// it times out. Point-to-point sends copy the data into a mailbox at once (eager), receives wait for it.
// Every wait gives up at the timeout; any failure (abort, timeout, mismatch) is recorded with its order so
// that every other rank's pending and later operations throw naming the first failed rank and its error.
// Groups split from one another form a failure domain: they share the lock and the condition variable, and a
// rank's failure in any of them is recorded by its rank in the first group (its world rank), so a rank waiting in
// another group of the domain fails fast too instead of waiting for the timeout.
#include "ringtrain/comm/in_process.h"

#include <signal.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <new>
#include <tuple>
#include <mutex>
#include <thread>

#include "ringtrain/comm/agreed.h"

namespace ringtrain::comm {
namespace {

using Clock = std::chrono::steady_clock;

// When the process last continued after a stop (SIGCONT: Ctrl-Z then fg, a scheduler's suspend), in steady_clock
// nanoseconds; 0 before any. Every rank of an in-process group is a thread of this one process, so a stop halts the
// rank that a wait waits for as much as the wait: the wait's timeout starts again from the continue.
std::atomic<int64_t> g_continued_ns{0};

extern "C" void on_continue(int) {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);  // steady_clock's clock, and safe in a signal handler
  g_continued_ns.store(int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec, std::memory_order_relaxed);
}

// Installs on_continue once, unless the program has a SIGCONT handler of its own.
void watch_continues() {
  static const bool installed = [] {
    struct sigaction old {};
    ::sigaction(SIGCONT, nullptr, &old);
    if (old.sa_handler != SIG_DFL) return false;
    struct sigaction sa {};
    sa.sa_handler = on_continue;
    sa.sa_flags = SA_RESTART;
    ::sigemptyset(&sa.sa_mask);
    return ::sigaction(SIGCONT, &sa, nullptr) == 0;
  }();
  (void)installed;
}

Clock::time_point last_continue() {
  return Clock::time_point(std::chrono::nanoseconds(g_continued_ns.load(std::memory_order_relaxed)));
}

std::string reduce_op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "max"; }

// What one rank passed to the current collective.
struct Slot {
  std::string op;
  const void* send = nullptr;
  size_t count = 0;
  DType dtype = DType::F32;
  ReduceOp reduce = ReduceOp::Sum;
  int root = 0;

  std::string describe() const {
    std::string s = cat(op, "(count=", count, ", dtype=", dtype_name(dtype));
    if (op == "all_reduce" || op == "reduce_scatter") s += cat(", op=", reduce_op_name(reduce));
    if (op == "broadcast") s += cat(", root=", root);
    return s + ")";
  }
  bool matches(const Slot& o) const {
    return op == o.op && count == o.count && dtype == o.dtype && reduce == o.reduce && root == o.root;
  }
};

struct Message {
  std::vector<char> bytes;
  size_t count = 0;
  DType dtype = DType::F32;
};

class Group;

// What every group split from one make_in_process_group shares (see the file comment).
struct Domain {
  explicit Domain(int world) : failure(world), failure_order(world, -1) {}
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> failure;    // by world rank
  std::vector<int64_t> failure_order;  // by world rank; -1: has not failed
  int64_t failures = 0;
  // Sub-groups being formed, by (parent group, split number, color): the group and how many members have yet to
  // take it.
  std::map<std::tuple<const Group*, int64_t, int64_t>, std::pair<std::shared_ptr<Group>, int>> forming;
};

std::vector<int> identity_ranks(int world) {
  std::vector<int> ranks(world);
  for (int r = 0; r < world; ++r) ranks[r] = r;
  return ranks;
}

class Group {
 public:
  Group(std::shared_ptr<Domain> domain, std::vector<int> world_ranks, std::chrono::milliseconds timeout)
      : domain_(std::move(domain)),
        mu_(domain_->mu),
        cv_(domain_->cv),
        world_ranks_(std::move(world_ranks)),
        world_(static_cast<int>(world_ranks_.size())),
        is_world_(world_ranks_ == identity_ranks(static_cast<int>(domain_->failure.size()))),
        timeout_(timeout),
        points_(world_, 0),
        slots_(world_),
        failure_(world_),
        failure_order_(world_, -1),
        mail_(static_cast<size_t>(world_) * world_),
        sent_(static_cast<size_t>(world_) * world_, 0) {}

  int world() const { return world_; }
  int world_rank(int r) const { return world_ranks_[r]; }
  // Rank r as errors name it: with its world rank where this group is a sub-group, so that a user is pointed at
  // the rank the launcher and the logs number.
  std::string who(int r) const {
    if (is_world_ || r < 0 || r >= world_) return cat("rank ", r);  // out of range: named as given, in the error
    return cat("rank ", r, " (world rank ", world_ranks_[r], ")");
  }

  // The sub-group of `color` formed by the split numbered `split` of this group, with `world_ranks` as its ranks:
  // the first member to arrive makes it, the others of the color take the same one.
  std::shared_ptr<Group> join_split(int64_t split, int64_t color, const std::vector<int>& world_ranks) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto key = std::make_tuple(static_cast<const Group*>(this), split, color);
    auto& [group, waiting] = domain_->forming[key];
    if (!group) {
      group = std::make_shared<Group>(domain_, world_ranks, timeout_);
      waiting = static_cast<int>(world_ranks.size());
    }
    std::shared_ptr<Group> mine = group;
    if (--waiting == 0) domain_->forming.erase(key);
    return mine;
  }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Records rank `self` as failed (first record wins) and returns the error for it to throw.
  CommError fail_locked(int self, const std::string& msg) {
    if (failure_order_[self] < 0) {
      failure_[self] = msg;
      failure_order_[self] = domain_->failures++;
      const int w = world_ranks_[self];
      if (domain_->failure_order[w] < 0) {
        domain_->failure[w] = msg;
        domain_->failure_order[w] = failure_order_[self];
      }
      cv_.notify_all();
    }
    return CommError(msg);
  }

  void abort(int self, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_locked(self, why);
  }

  // The rank that failed first, among those with failed[r]; -1 if none.
  int first_failed(const std::vector<bool>& consider) {
    std::lock_guard<std::mutex> lock(mu_);
    int first = -1;
    for (int r = 0; r < world_; ++r)
      if (consider[r] && failure_order_[r] >= 0 && (first < 0 || failure_order_[r] < failure_order_[first])) first = r;
    return first;
  }

  // Throws when this rank or a peer has failed (lock held).
  void check_failures_locked(int self, const std::string& what) {
    if (failure_order_[self] >= 0)
      throw CommError(cat(what, " on ", who(self), ": this rank was aborted earlier: ", failure_[self]));
    int first = -1;
    for (int r = 0; r < world_; ++r)
      if (failure_order_[r] >= 0 && (first < 0 || failure_order_[r] < failure_order_[first])) first = r;
    if (first >= 0)
      throw fail_locked(self, cat(what, " on ", who(self), ": ", who(first), " failed: ", failure_[first]));
    // A failure in another group of the domain.
    int first_world = -1;
    for (size_t w = 0; w < domain_->failure_order.size(); ++w)
      if (domain_->failure_order[w] >= 0 &&
          (first_world < 0 || domain_->failure_order[w] < domain_->failure_order[first_world]))
        first_world = static_cast<int>(w);
    if (first_world >= 0)
      throw fail_locked(self, cat(what, " on ", who(self), ": world rank ", first_world, " failed in another group: ",
                                  domain_->failure[first_world]));
  }

  // Waits until ready() (lock held), failing fast on any failure and at the timeout with pending() named.
  template <typename Ready, typename Pending>
  void wait_locked(std::unique_lock<std::mutex>& lock, int self, const std::string& what, Ready&& ready,
                   Pending&& pending) {
    auto since = Clock::now();
    for (;;) {
      check_failures_locked(self, what);
      if (ready()) return;
      if (cv_.wait_until(lock, since + timeout_) == std::cv_status::timeout) {
        check_failures_locked(self, what);
        if (ready()) return;
        if (last_continue() > since) {  // stopped and continued while waiting: the others were stopped too
          since = last_continue();
          continue;
        }
        throw fail_locked(self, cat(what, " on ", who(self), " timed out after ", timeout_.count(), " ms waiting for ",
                                    pending()));
      }
    }
  }

  // A barrier point: returns when every rank has reached this rank's next point.
  void pass_point_locked(std::unique_lock<std::mutex>& lock, int self, const std::string& what) {
    const int64_t point = ++points_[self];
    cv_.notify_all();
    wait_locked(
        lock, self, what,
        [&] {
          for (int64_t p : points_)
            if (p < point) return false;
          return true;
        },
        [&] {
          std::string missing, in_world;
          for (int r = 0; r < world_; ++r)
            if (points_[r] < point) {
              missing += cat(missing.empty() ? "" : ", ", r);
              in_world += cat(in_world.empty() ? "" : ", ", world_ranks_[r]);
            }
          return cat("rank(s) ", missing, is_world_ ? "" : cat(" (world ", in_world, ")"), " to join");
        });
  }

  // Runs one collective: publish `mine`, check all calls match, gather(slots) reads peers' buffers into this
  // rank's scratch, then after everyone is done reading, finish() writes this rank's outputs.
  void collective(int self, const std::string& what, const Slot& mine,
                  const std::function<void(const std::vector<Slot>&)>& gather, const std::function<void()>& finish) {
    std::vector<Slot> slots;
    {
      std::unique_lock<std::mutex> lock(mu_);
      check_failures_locked(self, what);
      slots_[self] = mine;
      pass_point_locked(lock, self, what);
      slots = slots_;
      for (int r = 0; r < world_; ++r) {
        if (slots[r].matches(slots[0])) continue;
        std::string calls;
        for (int q = 0; q < world_; ++q) calls += cat(q ? ", " : "", "rank ", q, " ", slots[q].describe());
        throw fail_locked(self, cat(what, " on rank ", self, ": the ranks' calls do not match: ", calls));
      }
    }
    gather(slots);
    {
      std::unique_lock<std::mutex> lock(mu_);
      pass_point_locked(lock, self, what);
    }
    finish();
  }

  void post(int self, int dst, const void* data, size_t count, DType dtype, const std::string& what) {
    Message m;
    m.bytes.resize(count * dtype_size(dtype));
    if (!m.bytes.empty()) std::memcpy(m.bytes.data(), data, m.bytes.size());
    m.count = count;
    m.dtype = dtype;
    std::lock_guard<std::mutex> lock(mu_);
    check_failures_locked(self, what);
    const size_t box = static_cast<size_t>(self) * world_ + dst;
    mail_[box].emplace(sent_[box]++, std::move(m));
    cv_.notify_all();
  }

  Message take(int self, int src, int64_t seq, const std::string& what) {
    std::unique_lock<std::mutex> lock(mu_);
    std::map<int64_t, Message>& box = mail_[static_cast<size_t>(src) * world_ + self];
    wait_locked(
        lock, self, what, [&] { return box.count(seq) > 0; }, [&] { return cat(who(src), "'s send"); });
    Message m = std::move(box.at(seq));
    box.erase(seq);
    return m;
  }

  CommError fail(int self, const std::string& msg) {
    std::lock_guard<std::mutex> lock(mu_);
    return fail_locked(self, msg);
  }

 private:
  const std::shared_ptr<Domain> domain_;
  std::mutex& mu_;
  std::condition_variable& cv_;
  const std::vector<int> world_ranks_;  // rank r of this group is world rank world_ranks_[r]
  const int world_;
  const bool is_world_;  // the ranks are the world's, in its order
  const std::chrono::milliseconds timeout_;
  std::vector<int64_t> points_;
  std::vector<Slot> slots_;
  std::vector<std::string> failure_;
  std::vector<int64_t> failure_order_;  // the domain's order of failures
  std::vector<std::map<int64_t, Message>> mail_;  // [src * world + dst]: messages by sequence number
  std::vector<int64_t> sent_;                     // [src * world + dst]: messages posted so far
};

// Element-wise reduction of block `block` of every rank's send buffer into out (rank order: deterministic).
template <typename T>
void reduce_native(const std::vector<Slot>& slots, size_t block, size_t n, ReduceOp op, T* out) {
  const T* first = static_cast<const T*>(slots[0].send) + block * n;
  std::memcpy(out, first, n * sizeof(T));
  for (size_t r = 1; r < slots.size(); ++r) {
    const T* in = static_cast<const T*>(slots[r].send) + block * n;
    if (op == ReduceOp::Sum) {
      for (size_t i = 0; i < n; ++i) out[i] += in[i];
    } else {
      for (size_t i = 0; i < n; ++i) out[i] = in[i] > out[i] ? in[i] : out[i];
    }
  }
}

// 16-bit floats: reduce in double, round once.
void reduce_half(const std::vector<Slot>& slots, size_t block, size_t n, ReduceOp op, DType dtype, void* out) {
  for (size_t i = 0; i < n; ++i) {
    const int64_t at = static_cast<int64_t>(block * n + i);
    double acc = load_as_double(slots[0].send, dtype, at);
    for (size_t r = 1; r < slots.size(); ++r) {
      const double x = load_as_double(slots[r].send, dtype, at);
      acc = op == ReduceOp::Sum ? acc + x : (x > acc ? x : acc);
    }
    store_from_double(out, dtype, static_cast<int64_t>(i), acc);
  }
}

void reduce_block(const std::vector<Slot>& slots, size_t block, size_t n, ReduceOp op, DType dtype, void* out) {
  if (n == 0) return;
  switch (dtype) {
    case DType::F32: return reduce_native(slots, block, n, op, static_cast<float*>(out));
    case DType::F64: return reduce_native(slots, block, n, op, static_cast<double*>(out));
    case DType::I32: return reduce_native(slots, block, n, op, static_cast<int32_t*>(out));
    case DType::I64: return reduce_native(slots, block, n, op, static_cast<int64_t*>(out));
    case DType::U8: return reduce_native(slots, block, n, op, static_cast<uint8_t*>(out));
    case DType::BF16:
    case DType::F16: return reduce_half(slots, block, n, op, dtype, out);
  }
}

class InProcessRequest final : public Request {
 public:
  // One expected message per part: its sequence number from src, where it goes and how many elements it holds.
  struct Part {
    int64_t seq;
    void* recv;
    size_t count;
  };
  InProcessRequest(std::shared_ptr<Group> g, int self, int src, std::vector<Part> parts, DType dtype, std::string what)
      : g_(std::move(g)), self_(self), src_(src), parts_(std::move(parts)), dtype_(dtype), what_(std::move(what)) {}

  void wait() override {
    if (done_) return;
    for (const Part& p : parts_) {
      Message m = g_->take(self_, src_, p.seq, what_);
      if (m.count != p.count || m.dtype != dtype_)
        throw g_->fail(self_, cat(what_, " on rank ", self_, ": rank ", src_, " sent ", m.count, " ",
                                  dtype_name(m.dtype), " elements, this rank expected ", p.count, " ",
                                  dtype_name(dtype_)));
      if (!m.bytes.empty()) std::memcpy(p.recv, m.bytes.data(), m.bytes.size());
    }
    done_ = true;
  }

 private:
  std::shared_ptr<Group> g_;
  int self_, src_;
  std::vector<Part> parts_;
  DType dtype_;
  std::string what_;
  bool done_ = false;
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Group> g, int rank)
      : g_(std::move(g)), rank_(rank), received_(g_->world(), 0) {}

  int rank() const override { return rank_; }
  int size() const override { return g_->world(); }
  Device device() const override { return Device::cpu(); }
  std::chrono::milliseconds timeout() const override { return g_->timeout(); }
  Group& group() { return *g_; }

  std::unique_ptr<Request> exchange(std::span<const Transfer> parts, int dst, int src, DType dtype,
                                    void*) override {
    const std::string what = cat("send_recv #", ++ops_, " (to ", g_->who(dst), ", from ", g_->who(src), ")");
    if (dst < 0 || dst >= size() || src < 0 || src >= size())
      throw g_->fail(rank_, cat(what, " on rank ", rank_, ": peer out of range for a group of ", size()));
    std::vector<InProcessRequest::Part> expected;
    for (const Transfer& t : parts) {
      g_->post(rank_, dst, t.send, t.count, dtype, what);
      expected.push_back({received_[src]++, t.recv, t.count});
    }
    return std::make_unique<InProcessRequest>(g_, rank_, src, std::move(expected), dtype, what);
  }

  void all_gather(const void* send, void* recv, size_t count, DType dtype, void*) override {
    const size_t block = count * dtype_size(dtype);
    std::vector<char> scratch(block * size());
    g_->collective(
        rank_, next("all_gather"), {"all_gather", send, count, dtype},
        [&](const std::vector<Slot>& s) {
          for (int r = 0; r < size(); ++r)
            if (block) std::memcpy(scratch.data() + r * block, s[r].send, block);
        },
        [&] {
          if (!scratch.empty()) std::memcpy(recv, scratch.data(), scratch.size());
        });
  }

  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, void*) override {
    std::vector<char> scratch(count * dtype_size(dtype));
    g_->collective(
        rank_, next("reduce_scatter"), {"reduce_scatter", send, count, dtype, op},
        [&](const std::vector<Slot>& s) { reduce_block(s, rank_, count, op, dtype, scratch.data()); },
        [&] {
          if (!scratch.empty()) std::memcpy(recv, scratch.data(), scratch.size());
        });
  }

  void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, void*) override {
    std::vector<char> scratch(count * dtype_size(dtype));
    g_->collective(
        rank_, next("all_reduce"), {"all_reduce", buf, count, dtype, op},
        [&](const std::vector<Slot>& s) { reduce_block(s, 0, count, op, dtype, scratch.data()); },
        [&] {
          if (!scratch.empty()) std::memcpy(buf, scratch.data(), scratch.size());
        });
  }

  void all_to_all(const void* send, void* recv, size_t count, DType dtype, void*) override {
    const size_t block = count * dtype_size(dtype);
    std::vector<char> scratch(block * size());
    g_->collective(
        rank_, next("all_to_all"), {"all_to_all", send, count, dtype},
        [&](const std::vector<Slot>& s) {
          const size_t mine = static_cast<size_t>(rank_) * block;  // this rank's block of everyone's send buffer
          for (int r = 0; r < size(); ++r)
            if (block) std::memcpy(scratch.data() + r * block, static_cast<const char*>(s[r].send) + mine, block);
        },
        [&] {
          if (!scratch.empty()) std::memcpy(recv, scratch.data(), scratch.size());
        });
  }

  void broadcast(void* buf, size_t count, DType dtype, int root, void*) override {
    const std::string what = next("broadcast");
    if (root < 0 || root >= size())
      throw g_->fail(rank_, cat(what, " on rank ", rank_, ": root ", root, " out of range for a group of ", size()));
    std::vector<char> scratch(count * dtype_size(dtype));
    g_->collective(
        rank_, what, {"broadcast", buf, count, dtype, ReduceOp::Sum, root},
        [&](const std::vector<Slot>& s) {
          if (!scratch.empty()) std::memcpy(scratch.data(), s[root].send, scratch.size());
        },
        [&] {
          if (!scratch.empty() && rank_ != root) std::memcpy(buf, scratch.data(), scratch.size());
        });
  }

  void barrier() override {
    g_->collective(
        rank_, next("barrier"), {"barrier", nullptr, 0, DType::F32}, [](const std::vector<Slot>&) {}, [] {});
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    const std::string what = next("split");
    const int64_t split_no = splits_++;  // every rank of the group splits in the same order
    const int64_t mine[2] = {color, key};
    std::vector<int64_t> all(2 * static_cast<size_t>(size()));
    all_gather(mine, all.data(), 2, DType::I64, nullptr);
    for (int r = 0; r < size(); ++r)
      if (all[2 * r] < 0)
        throw g_->fail(rank_, cat(what, " on rank ", rank_, ": rank ", r, " passed color ", all[2 * r],
                                  " (colors are >= 0)"));
    std::vector<std::pair<int64_t, int>> members;  // (key, rank) of this color
    for (int r = 0; r < size(); ++r)
      if (all[2 * r] == color) members.emplace_back(all[2 * r + 1], r);
    std::sort(members.begin(), members.end());
    std::vector<int> world_ranks;
    int new_rank = -1;
    for (const auto& [k, r] : members) {
      if (r == rank_) new_rank = static_cast<int>(world_ranks.size());
      world_ranks.push_back(g_->world_rank(r));
    }
    return std::make_unique<InProcessCommunicator>(g_->join_split(split_no, color, world_ranks), new_rank);
  }

  void abort(const std::string& why) override { g_->abort(rank_, why); }

 private:
  std::string next(const char* op) { return cat(op, " #", ++ops_); }

  std::shared_ptr<Group> g_;
  int rank_;
  int64_t ops_ = 0;                // operations started by this rank (numbers the error messages)
  int64_t splits_ = 0;             // splits of this group made by this rank
  std::vector<int64_t> received_;  // receives posted per source rank (matches the sender's sequence)
};

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_in_process_group(int world, std::chrono::milliseconds timeout) {
  RT_CHECK(world >= 1 && world <= kMaxRanks, "in-process communicator: world size must be in [1, ", kMaxRanks,
           "], got ", world);
  RT_CHECK(timeout.count() > 0, "in-process communicator: timeout must be > 0 ms, got ", timeout.count());
  watch_continues();
  auto group = std::make_shared<Group>(std::make_shared<Domain>(world), identity_ranks(world), timeout);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < world; ++r) comms.push_back(std::make_unique<InProcessCommunicator>(group, r));
  return comms;
}

namespace {

// Joins the started rank threads however run_ranks is left (a joinable std::thread destroyed would terminate the
// program). Left before every rank started (a thread, or memory, could not be had), it first aborts the group, which
// ends the started ranks' waits; the message is made before any rank starts, so the abort needs no memory.
class JoinRanks {
 public:
  JoinRanks(const std::vector<std::unique_ptr<Communicator>>& comms, std::vector<std::thread>& threads)
      : comms_(comms), threads_(threads) {}
  JoinRanks(const JoinRanks&) = delete;
  JoinRanks& operator=(const JoinRanks&) = delete;
  void all_started() { all_started_ = true; }
  ~JoinRanks() {
    if (!all_started_)
      for (const auto& c : comms_) {
        try {
          c->abort(why_);
        } catch (...) {  // the other ranks still end at their timeout
        }
      }
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  const std::vector<std::unique_ptr<Communicator>>& comms_;
  std::vector<std::thread>& threads_;
  const std::string why_ = "a rank thread could not be started";
  bool all_started_ = false;
};

}  // namespace

std::vector<std::exception_ptr> run_threads(const std::vector<std::unique_ptr<Communicator>>& comms,
                                            const std::function<void(int)>& fn) {
  const int n = static_cast<int>(comms.size());
  std::vector<std::exception_ptr> errors(comms.size());
  {
    std::vector<std::thread> threads;
    threads.reserve(comms.size());  // emplace_back below never reallocates
    JoinRanks join(comms, threads);
    for (int r = 0; r < n; ++r) {
      try {
        threads.emplace_back([&, r] {
          try {
            fn(r);
          } catch (const AgreedError&) {  // every rank raises it: none is left waiting
            errors[r] = std::current_exception();
          } catch (...) {
            errors[r] = std::current_exception();
            try {
              comms[r]->abort(message_of(errors[r]));
            } catch (...) {  // no memory for the message: the others end at their timeout
            }
          }
        });
      } catch (const std::exception& e) {
        throw Error(cat("cannot start the thread of rank ", r, " of ", n, ": ", e.what()));
      }
    }
    join.all_started();
  }  // every thread joined: nothing writes `errors` any more
  return errors;
}

void run_ranks(int world, std::chrono::milliseconds timeout, const std::function<void(Communicator&)>& fn) {
  auto comms = make_in_process_group(world, timeout);
  const std::vector<std::exception_ptr> errors = run_threads(comms, [&](int r) { fn(*comms[r]); });
  std::vector<bool> threw(world);
  for (int r = 0; r < world; ++r) threw[r] = errors[r] != nullptr;
  int root = static_cast<InProcessCommunicator&>(*comms[0]).group().first_failed(threw);
  // No rank aborted: every error is an AgreedError, and the lowest rank's names the cause.
  if (root < 0) root = static_cast<int>(std::find(threw.begin(), threw.end(), true) - threw.begin());
  if (root == world) return;
  try {
    std::rethrow_exception(errors[root]);
  } catch (const Interrupted&) {  // the same on every rank: the caller tells a stop from a failure by its type
    throw;
  } catch (const CommError& e) {
    throw CommError(cat("rank ", root, ": ", e.what()));
  } catch (const std::bad_alloc&) {
    throw Error(cat("rank ", root, ": out of host memory (std::bad_alloc); a smaller model, batch or sequence length, "
                    "or fewer CPU ranks (parallel.dp x cp) would need less"));
  } catch (const std::exception& e) {
    throw Error(cat("rank ", root, ": ", e.what()));
  } catch (...) {
    throw Error(cat("rank ", root, ": unknown exception"));
  }
}

}  // namespace ringtrain::comm
