// ringtrain._core: the policy worker for Python (ringtrain/__init__.py wraps it). Config errors and bad batches
// raise ValueError / TypeError before any rank starts; errors of the worker itself raise ringtrain.Error (a
// RuntimeError; ringtrain.CommError for communicator failures) with the C++ message. The GIL is released while
// the ranks work.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "batch.h"
#include "ctrl_c.h"
#include "ranks.h"
#include "ringtrain/comm/agreed.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/generate.h"
#include "ringtrain/worker/config.h"
#include "ringtrain/worker/data.h"
#include "ringtrain/worker/policy_worker.h"

namespace ringtrain::python {
namespace {

// Text from the engine (messages, YAML, a checkpoint's RNG state) as a Python str. Paths and values may hold bytes
// that are not UTF-8, which a strict decode turns into an empty exception or a UnicodeDecodeError; they come back as
// surrogate escapes, from which os.fsencode gives the bytes again.
py::str to_python_text(std::string_view s) {
  PyObject* text = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogateescape");
  if (!text) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(text);
}

// Sets `type` with the message of `e` (a translator's or a wrapper's raise).
void set_error(PyObject* type, const std::exception& e) { PyErr_SetObject(type, to_python_text(e.what()).ptr()); }

// Config errors (unknown key, bad value, a model that does not fit the config) as ValueError.
template <typename F>
auto as_value_error(F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    set_error(PyExc_ValueError, e);
    throw py::error_already_set();
  }
}

worker::Config read_config(const std::string& config, bool is_text, const std::string& source,
                           const std::vector<std::string>& overrides) {
  return as_value_error([&] {
    constexpr worker::ConfigUse use = worker::ConfigUse::Worker;  // the batches come from the Python loop
    return is_text ? worker::parse_config(config, source, overrides, use)
                   : worker::load_config(config, overrides, use);
  });
}

const char* dtype_label(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    case DType::F64: return "float64";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::U8: return "uint8";
  }
  return "?";
}

// timeout_s as the communicator's timeout: 1 ms to a week, as the CLI's --timeout-ms. Checked before converting:
// a NaN, an infinity or 1e300 seconds does not fit the int64 count of milliseconds.
std::chrono::milliseconds rank_timeout(double timeout_s) {
  constexpr double kMaxSeconds = 7 * 24 * 3600.0;
  if (!(timeout_s >= 1e-3 && timeout_s <= kMaxSeconds))
    throw py::value_error(cat("timeout_s = ", timeout_s, ": expected seconds in [0.001, ", kMaxSeconds, "]"));
  return std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
}

// An empty float32 PyTorch tensor of ids' shape on ids' device (PyTorch is imported only for a CUDA batch).
py::object results_like(py::handle ids) {
  const py::module_ torch = py::module_::import("torch");
  return torch.attr("empty")(ids.attr("shape"), py::arg("dtype") = torch.attr("float32"),
                             py::arg("device") = ids.attr("device"));
}

class Worker {
 public:
  Worker(const std::string& config, bool is_text, const std::string& source, const std::vector<std::string>& overrides,
         double timeout_s)
      : config_(read_config(config, is_text, source, overrides)) {
    model_ = as_value_error([&] {
      model::ModelConfig m = worker::resolve_model_config(config_.policy);
      config_.validate_against(m);
      return m;
    });
    const std::chrono::milliseconds timeout = rank_timeout(timeout_s);
    RT_CHECK(!exiting, "no PolicyWorker is made while the Python interpreter exits");
    ++constructions;
    const auto done = [](int* count) { --*count; };  // with the GIL again, after the release below ends
    const std::unique_ptr<int, decltype(done)> counted(&constructions, done);
    py::gil_scoped_release unlocked;
    group_ = std::make_unique<WorkerGroup>(config_, timeout, &stop_);
  }

  // The interpreter's exit (the atexit hook): workers are no longer made; `constructions` counts those under way.
  // Both with the GIL held.
  static inline bool exiting = false;
  static inline int constructions = 0;

  py::dict get_logprobs(py::handle batch, bool with_entropy) {
    const InFlight call(*this);
    const Batch b = read_batch(batch, config_, model_.vocab, "get_logprobs");
    worker::LogprobResult r;
    run_interruptible([&](int i, worker::PolicyWorker& w) {
      worker::LogprobResult x = w.get_logprobs(b.samples, with_entropy);
      if (i == 0) r = std::move(x);
    });
    py::dict out;
    out["logprobs"] = padded(r.logprobs, b.columns);
    if (with_entropy) out["entropy"] = padded(r.entropy, b.columns);
    return out;
  }

  py::dict get_reference_logprobs(py::handle batch) {
    const InFlight call(*this);
    const Batch b = read_batch(batch, config_, model_.vocab, "get_reference_logprobs");
    worker::LogprobResult r;
    run_interruptible([&](int i, worker::PolicyWorker& w) {
      worker::LogprobResult x = w.get_reference_logprobs(b.samples);
      if (i == 0) r = std::move(x);
    });
    py::dict out;
    out["reference_logprobs"] = padded(r.logprobs, b.columns);
    return out;
  }

  // The zero-copy forms (ringtrain/__init__.py chooses them for CUDA input_ids on this worker's GPU): input_ids read
  // in place, the scores written into float32 PyTorch tensors made on its device once the batch has passed its checks.
  py::dict get_logprobs_cuda(py::handle batch, bool with_entropy) {
    const InFlight call(*this);
    const std::vector<const char*> keys = with_entropy ? std::vector{"logprobs", "entropy"} : std::vector{"logprobs"};
    return score_cuda(batch, "get_logprobs", keys, [](worker::PolicyWorker& w, const worker::TokenRowsBatch& rows,
                                                      const std::vector<TensorView>& out) {
      w.get_logprobs_into(rows, out[0], out.size() > 1 ? out[1] : TensorView{});
    });
  }

  py::dict get_reference_logprobs_cuda(py::handle batch) {
    const InFlight call(*this);
    return score_cuda(batch, "get_reference_logprobs", {"reference_logprobs"},
                      [](worker::PolicyWorker& w, const worker::TokenRowsBatch& rows,
                         const std::vector<TensorView>& out) { w.get_reference_logprobs_into(rows, out[0]); });
  }

  // The zero-copy call `what`: the batch read and checked, one result tensor per key made, then score(worker, rows,
  // the results' views) on every rank without the GIL.
  template <typename Score>
  py::dict score_cuda(py::handle batch, const char* what, const std::vector<const char*>& keys, const Score& score) {
    const RowsBatch b = read_rows_batch(batch, config_, model_.vocab, what);
    py::dict out;
    std::vector<DeviceArray> results;
    std::vector<TensorView> views;
    for (const char* key : keys) {
      out[key] = results_like(batch["input_ids"]);
      results.push_back(read_device_array(out[key], key));
      views.push_back(results.back().view);
    }
    run_interruptible([&](int, worker::PolicyWorker& w) { score(w, b.rows, views); });
    return out;
  }

  // The GPU whose CUDA tensors the zero-copy forms take: this process's one rank's, or -1 (a CPU worker, whose
  // in-process ranks would share one result tensor).
  int zero_copy_device() {
    if (group_->local_ranks() != 1) return -1;
    const Device d = group_->lead().policy().device();
    return d.is_cuda() ? d.index : -1;
  }

  py::dict train(py::handle batch) {
    const InFlight call(*this);
    const Batch b = read_batch(batch, config_, model_.vocab, "train");
    check_train_batch(b, config_);
    return run_train([&](worker::PolicyWorker& w) { return w.train(b.samples); });
  }

  // The zero-copy form (ringtrain/__init__.py chooses it when every array of the batch is a CUDA tensor on this
  // worker's GPU): the batch is read in place and the step's per-token work stays on the GPU.
  py::dict train_cuda(py::handle batch) {
    const InFlight call(*this);
    const TrainRowsInput b = read_train_rows_batch(batch, config_, model_.vocab);
    return run_train([&](worker::PolicyWorker& w) { return w.train_rows(b.rows); });
  }

  // step(worker) on every rank without the GIL; rank 0's result as a dict.
  template <typename Step>
  py::dict run_train(const Step& step) {
    worker::TrainResult r;
    run_interruptible(
        [&](int i, worker::PolicyWorker& w) {
          worker::TrainResult x = step(w);
          if (i == 0) r = std::move(x);
        },
        LateSigint::Report);
    py::dict out, metrics;
    out["step"] = r.step.step;
    out["loss"] = r.step.loss;
    out["grad_norm"] = r.step.grad_norm;
    out["lr"] = r.step.lr;
    out["valid_tokens"] = r.step.valid_tokens;
    out["valid_sequences"] = r.step.valid_sequences;
    out["skipped"] = r.step.skipped;
    out["tokens_per_second"] = r.tokens_per_second;
    out["seconds"] = r.seconds;
    out["microbatch_losses"] = r.step.microbatch_losses;
    for (const train::Metric& m : r.step.metrics) metrics[py::str(m.name)] = m.value;
    out["metrics"] = metrics;
    return out;
  }

  void save(const std::string& dir, int64_t epoch, int64_t index, const std::string& rng) {
    const InFlight call(*this);
    train::TrainingProgress p;
    p.epoch = epoch, p.index = index, p.rng = rng;
    py::gil_scoped_release unlocked;
    const std::lock_guard<std::mutex> one_call(mu_);
    group_->run([&](int, worker::PolicyWorker& w) { w.save(dir, p); });
  }

  py::dict load(const std::string& dir) {
    const InFlight call(*this);
    train::TrainingProgress p;
    {
      py::gil_scoped_release unlocked;
      const std::lock_guard<std::mutex> one_call(mu_);
      group_->run([&](int i, worker::PolicyWorker& w) {
        train::TrainingProgress x = w.load(dir);
        if (i == 0) p = x;
      });
    }
    py::dict out;
    out["epoch"] = p.epoch;
    out["index"] = p.index;
    out["rng"] = to_python_text(p.rng);
    return out;
  }

  void export_hf(const std::string& dir) {
    const InFlight call(*this);
    py::gil_scoped_release unlocked;
    const std::lock_guard<std::mutex> one_call(mu_);
    group_->run([&](int, worker::PolicyWorker& w) { w.export_hf(dir); });
  }

  // The built-in sampler on this process's first rank, from the weights it holds now (after a step every rank holds
  // the same): up to max_new_tokens per prompt, each prompt's randomness keyed by (seed, its index). Arguments are
  // checked here (ValueError naming the prompt, position or parameter); the sampler's own limits (the KV cache's
  // bytes) raise ringtrain.Error.
  py::list generate(const std::vector<std::vector<int64_t>>& prompts, int64_t max_new_tokens, double temperature,
                    double top_p, int64_t top_k, const std::vector<int64_t>& stop_tokens, uint64_t seed) {
    const InFlight call(*this);
    if (prompts.empty()) throw py::value_error("generate: no prompts");
    const int64_t vocab = model_.vocab, limit = config_.policy.max_total_sequence_length;
    if (max_new_tokens < 1 || max_new_tokens >= limit)
      throw py::value_error(cat("generate: max_new_tokens ", max_new_tokens, " must be in [1, ",
                                "policy.max_total_sequence_length = ", limit, ")"));
    if (!std::isfinite(temperature) || temperature < 0)
      throw py::value_error(cat("generate: temperature ", temperature, " must be finite and >= 0 (0: greedy)"));
    if (!(top_p > 0 && top_p <= 1)) throw py::value_error(cat("generate: top_p ", top_p, " must be in (0, 1]"));
    if (top_k < 0) throw py::value_error(cat("generate: top_k ", top_k, " must be >= 0 (0: all tokens)"));
    model::SamplingParams sp;
    sp.max_new_tokens = max_new_tokens, sp.temperature = temperature, sp.top_p = top_p, sp.top_k = top_k;
    sp.seed = seed;
    for (size_t i = 0; i < stop_tokens.size(); ++i) {
      if (stop_tokens[i] < 0 || stop_tokens[i] >= vocab)
        throw py::value_error(cat("generate: stop_tokens[", i, "] = ", stop_tokens[i], " is not in [0, ", vocab, ")"));
      sp.stop_tokens.push_back(static_cast<int32_t>(stop_tokens[i]));
    }
    std::vector<std::vector<int32_t>> ids(prompts.size());
    for (size_t b = 0; b < prompts.size(); ++b) {
      const std::vector<int64_t>& p = prompts[b];
      if (p.empty()) throw py::value_error(cat("generate: prompts[", b, "] is empty"));
      if (static_cast<int64_t>(p.size()) > limit - max_new_tokens)
        throw py::value_error(cat("generate: prompts[", b, "] has ", p.size(), " tokens; with max_new_tokens ",
                                  max_new_tokens, " that is more than policy.max_total_sequence_length = ", limit));
      for (size_t i = 0; i < p.size(); ++i) {
        if (p[i] < 0 || p[i] >= vocab)
          throw py::value_error(cat("generate: prompts[", b, "][", i, "] = ", p[i], " is not in [0, ", vocab, ")"));
        ids[b].push_back(static_cast<int32_t>(p[i]));
      }
    }
    std::vector<model::Generation> gens;
    model::SamplerOptions so;
    so.attention_backends = config_.attention_backends;
    so.stop = &stop_;
    run_interruptible([&] {
      model::Sampler sampler(group_->lead().policy(), so);
      gens = sampler.generate(ids, sp);
    });
    py::list out;
    for (const model::Generation& g : gens) {
      py::dict d;
      d["tokens"] = py::array_t<int32_t>(static_cast<py::ssize_t>(g.tokens.size()), g.tokens.data());
      d["logprobs"] = py::array_t<float>(static_cast<py::ssize_t>(g.logprobs.size()), g.logprobs.data());
      d["finish"] = g.finish == model::FinishReason::Stop ? "stop" : "length";
      out.append(d);
    }
    return out;
  }

  py::list refit_info() {
    py::list out;
    for (const worker::RefitEntry& e : group_->lead().refit_info()) {
      py::dict d;
      d["name"] = e.name;
      d["shape"] = py::tuple(py::cast(e.shape));
      d["dtype"] = dtype_label(e.dtype);
      out.append(d);
    }
    return out;
  }

  py::str config_yaml() const { return to_python_text(worker::to_yaml(config_)); }
  std::string model_config_json() const { return model::config_to_json(model_).dump(); }
  int rank() const { return group_->rank(); }
  int world_size() const { return group_->world_size(); }
  int local_ranks() const { return group_->local_ranks(); }
  std::string device() const { return device_name(config_.device); }
  int64_t steps_taken() const { return group_->lead().steps_taken(); }

  // At the interpreter's exit (atexit, before it stops daemon threads and destroys the C++ statics): later calls are
  // refused and calls under way stop at their next microbatch or token; the caller waits for calls_in_flight() to be 0.
  void close_at_exit() {
    unusable_ = "the Python interpreter is exiting";
    stop_.request();
  }
  int calls_in_flight() const { return calls_; }
  // In the child of a fork: a call that another thread had under way is gone with that thread, leaving the worker's
  // lock held and its ranks' state unknown; the group is then never destroyed there (its destructor would wait on
  // that state).
  void after_fork_in_child() {
    if (calls_ == 0) return;
    unusable_ = "the process forked while another thread was in a call of it";
    forked_in_call_ = true;
    calls_ = 0;
  }

  ~Worker() {
    if (forked_in_call_) (void)group_.release();
  }

 private:
  // What a SIGINT that came after the call's last stop check does once the call has returned.
  enum class LateSigint : uint8_t {
    Raise,   // KeyboardInterrupt, as Python would have raised it: the result (a score, samples) is dropped
    Report,  // a note on stderr and the result returned: KeyboardInterrupt would hide an applied train step
  };

  // f on this process's first rank (f()) or on every rank (f(rank index, worker)), without the GIL and one call at a
  // time; Ctrl-C stops it at its next microbatch or token (ctrl_c.h) and raises KeyboardInterrupt.
  template <typename F>
  void run_interruptible(const F& f, LateSigint late = LateSigint::Raise) {
    const bool take = python_takes_sigint_here();
    bool interrupted = false, caught = false;
    {
      py::gil_scoped_release unlocked;
      const std::lock_guard<std::mutex> one_call(mu_);
      const SigintToStop sigint(stop_, take, caught);
      {
        // A Ctrl-C that came before the call held its worker (while it read its batch, or waited for another
        // thread's call) is Python's: it raises here, before anything is done.
        const py::gil_scoped_acquire python;
        if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      }
      try {
        if constexpr (std::is_invocable_v<const F&>) {
          group_->check_usable();
          f();
        } else {
          group_->run(f);
        }
      } catch (const comm::Interrupted&) {
        interrupted = true;
      }
    }
    if (interrupted) {
      PyErr_SetNone(PyExc_KeyboardInterrupt);
      throw py::error_already_set();
    }
    if (!caught) return;
    if (late == LateSigint::Raise) {
      PyErr_SetInterrupt();
    } else {
      PySys_WriteStderr("ringtrain: Ctrl-C came after train step %lld was applied: the step is kept and its result "
                        "returned; press Ctrl-C again to stop\n",
                        static_cast<long long>(group_->lead().steps_taken()));
    }
  }

  // A call from its entry to its return to Python, both with the GIL, first thing in every method that does work
  // without the GIL: counted, so that the interpreter's exit can wait for the calls of daemon threads to leave C++
  // (close_at_exit) and a forked child knows that one was under way. Refused once the worker was closed.
  class InFlight {
   public:
    explicit InFlight(Worker& w) : w_(w) {
      RT_CHECK(w_.unusable_.empty(), "this PolicyWorker cannot be used any more: ", w_.unusable_, "; make a new one");
      ++w_.calls_;
    }
    ~InFlight() { --w_.calls_; }
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;

   private:
    Worker& w_;
  };

  worker::Config config_;
  model::ModelConfig model_;
  int calls_ = 0;                // InFlight calls; read and written with the GIL held
  std::string unusable_;         // why calls are refused (the exit, a fork during a call); with the GIL held
  bool forked_in_call_ = false;  // this is a fork's child, whose group another thread's call had under way
  StopRequest stop_;  // set by Ctrl-C during a call of the main thread; read by every rank of this process
  std::unique_ptr<WorkerGroup> group_;
  std::mutex mu_;  // one call at a time: Python threads may share the worker while the GIL is released
};

// A member function as a binding that raises TypeError on an instance made by __new__ alone, whose C++ object was
// never constructed: pybind11 would call the function on that storage as it is.
template <typename C>
C& constructed(py::handle self) {
  auto* instance = reinterpret_cast<py::detail::instance*>(self.ptr());
  const py::detail::value_and_holder v_h = instance->get_value_and_holder(py::detail::get_type_info(typeid(C)));
  if (!v_h || !v_h.holder_constructed())
    throw py::type_error("this object was made without __init__ (call the class, not __new__)");
  return *v_h.template value_ptr<C>();
}
template <typename C, typename R, typename... A>
auto initialized(R (C::*f)(A...)) {
  return [f](py::handle self, A... a) -> R { return (constructed<C>(self).*f)(std::forward<A>(a)...); };
}
template <typename C, typename R, typename... A>
auto initialized(R (C::*f)(A...) const) {
  return [f](py::handle self, A... a) -> R { return (constructed<C>(self).*f)(std::forward<A>(a)...); };
}

}  // namespace
}  // namespace ringtrain::python

PYBIND11_MODULE(_core, m) {
  namespace py = pybind11;
  using namespace ringtrain;
  using ringtrain::python::Worker;
  using ringtrain::python::initialized;
  m.doc() = "The C++ side of the ringtrain package (use `import ringtrain`).";
  static py::exception<Error> error(m, "Error", PyExc_RuntimeError);
  static py::exception<comm::CommError> comm_error(m, "CommError", error.ptr());
  // The messages through to_python_text (a path in them need not be UTF-8). Host memory running out is a MemoryError
  // that says what would need less, not a bare "std::bad_alloc".
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const comm::CommError& e) {
      ringtrain::python::set_error(comm_error.ptr(), e);
    } catch (const Error& e) {
      ringtrain::python::set_error(error.ptr(), e);
    } catch (const std::bad_alloc&) {
      PyErr_SetString(PyExc_MemoryError,
                      "out of host memory (std::bad_alloc); a smaller batch, policy.logprob_batch_size or "
                      "sequence length, fewer CPU ranks (parallel.dp x cp) or a smaller model would need less");
    }
  });

  py::class_<Worker>(m, "PolicyWorker")
      .def(py::init<const std::string&, bool, const std::string&, const std::vector<std::string>&, double>(),
           py::arg("config"), py::arg("is_text"), py::arg("source"), py::arg("overrides"), py::arg("timeout_s"))
      .def("get_logprobs", initialized(&Worker::get_logprobs), py::arg("batch"),
           py::arg("with_entropy").noconvert() = false)
      .def("get_reference_logprobs", initialized(&Worker::get_reference_logprobs), py::arg("batch"))
      .def("get_logprobs_cuda", initialized(&Worker::get_logprobs_cuda), py::arg("batch"), py::arg("with_entropy"))
      .def("get_reference_logprobs_cuda", initialized(&Worker::get_reference_logprobs_cuda), py::arg("batch"))
      .def_property_readonly("zero_copy_device", initialized(&Worker::zero_copy_device))
      .def("train", initialized(&Worker::train), py::arg("batch"))
      .def("train_cuda", initialized(&Worker::train_cuda), py::arg("batch"))
      .def("save", initialized(&Worker::save), py::arg("dir"), py::arg("epoch"), py::arg("index"), py::arg("rng"))
      .def("load", initialized(&Worker::load), py::arg("dir"))
      .def("export_hf", initialized(&Worker::export_hf), py::arg("dir"))
      .def("refit_info", initialized(&Worker::refit_info))
      .def("generate", initialized(&Worker::generate), py::arg("prompts"), py::arg("max_new_tokens"),
           py::arg("temperature"), py::arg("top_p"), py::arg("top_k"), py::arg("stop_tokens"), py::arg("seed"))
      .def_property_readonly("config_yaml", initialized(&Worker::config_yaml))
      .def_property_readonly("model_config_json", initialized(&Worker::model_config_json))
      .def_property_readonly("rank", initialized(&Worker::rank))
      .def_property_readonly("world_size", initialized(&Worker::world_size))
      .def_property_readonly("local_ranks", initialized(&Worker::local_ranks))
      .def_property_readonly("device", initialized(&Worker::device))
      .def_property_readonly("steps_taken", initialized(&Worker::steps_taken))
      .def("close_at_exit", initialized(&Worker::close_at_exit))
      .def_property_readonly("calls_in_flight", initialized(&Worker::calls_in_flight))
      .def("after_fork_in_child", initialized(&Worker::after_fork_in_child));
  m.def("begin_exit", [] { Worker::exiting = true; });
  m.def("constructions_in_flight", [] { return Worker::constructions; });
  m.def("give_sigint_back_after_fork", &ringtrain::python::give_sigint_back_after_fork,
        "In a fork's child: Python's SIGINT handler again, where a call of the parent's main thread had taken it.");

  m.def(
      "resolve_config",
      [](const std::string& config, bool is_text, const std::string& source,
         const std::vector<std::string>& overrides) {
        return ringtrain::python::to_python_text(
            worker::to_yaml(ringtrain::python::read_config(config, is_text, source, overrides)));
      },
      py::arg("config"), py::arg("is_text"), py::arg("source"), py::arg("overrides"));

  py::class_<worker::BatchSchedule>(m, "BatchSchedule",
                                    "The order of global batches of `ringtrain train`: every epoch a permutation of "
                                    "the units drawn from the seed, cut into global batches.")
      .def(py::init<int64_t, int64_t, uint64_t>(), py::arg("units"), py::arg("global_batch"), py::arg("seed"))
      .def_property_readonly("steps_per_epoch", initialized(&worker::BatchSchedule::steps_per_epoch))
      .def("step_units", initialized(&worker::BatchSchedule::step_units), py::arg("step"),
           "The units (rows of the data file; DPO: pairs) of global step `step` (0-based), in batch order.");
}
