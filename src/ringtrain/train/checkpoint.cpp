#include "ringtrain/train/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <regex>

#include <nlohmann/json.hpp>

#include "ringtrain/comm/agreed.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/json.h"
#include "ringtrain/model/file_io.h"
#include "ringtrain/model/hf_config.h"
#include "ringtrain/model/params.h"
#include "ringtrain/model/safetensors.h"

namespace ringtrain::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kStateFile = "trainer_state.json";
constexpr const char* kSavingMarker = ".ringtrain-saving";  // in DIR.saving while a save is under way
constexpr const char* kFormat = "ringtrain-train-state";
constexpr int kVersion = 1;
constexpr const char* kKinds[3] = {"master", "exp_avg", "exp_avg_sq"};

fs::path normalized(const fs::path& dir) {
  fs::path d = dir.lexically_normal();
  if (d.filename().empty()) d = d.parent_path();
  RT_CHECK(!d.empty(), "checkpoint: empty folder name");
  return d;
}

fs::path saving_dir(const fs::path& dir) { return dir.parent_path() / (dir.filename().string() + ".saving"); }

std::string optimizer_file(int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof name, "optimizer/rank-%05d-of-%05d.safetensors", rank, world);
  return name;
}

// A directory (not a link to one) holding trainer_state.json: what a save may replace.
bool is_checkpoint_dir(const fs::path& p) {
  std::error_code ec;
  return fs::symlink_status(p, ec).type() == fs::file_type::directory &&
         fs::symlink_status(p / kStateFile, ec).type() == fs::file_type::regular;
}

}  // namespace

namespace {

std::vector<int64_t> all_gather_i64(comm::Communicator& world, int64_t value) {
  std::vector<int64_t> all(static_cast<size_t>(world.size()));
  Tensor send = Tensor::empty({1}, DType::I64, world.device());
  Tensor recv = Tensor::empty({world.size()}, DType::I64, world.device());
  copy(send, contiguous_view(&value, DType::I64, Device::cpu(), {1}));
  world.all_gather(send.data(), recv.data(), 1, DType::I64);
  copy(contiguous_view(all.data(), DType::I64, Device::cpu(), {world.size()}), recv);
  return all;
}

// The element range [lo, hi) of spec i that the flat shard [begin, end) covers, in the tensor's own elements
// (empty when lo >= hi).
std::pair<int64_t, int64_t> covered(const model::ParamSpec& spec, int64_t flat_offset, int64_t begin, int64_t end) {
  const int64_t lo = std::max(begin, flat_offset), hi = std::min(end, flat_offset + spec.numel);
  return {lo - flat_offset, hi - flat_offset};
}

std::vector<char> to_host(const Tensor& t) {
  std::vector<char> out(t.nbytes());
  if (!out.empty()) copy(contiguous_view(out.data(), t.dtype(), Device::cpu(), {t.numel()}), t);
  return out;
}

void write_optimizer_shard(const fs::path& path, Trainer& trainer) {
  model::Policy& policy = trainer.policy();
  const ShardState& sh = trainer.shard();
  const DType dtype = sh.master.dtype();
  const size_t es = dtype_size(dtype);
  const std::vector<char> host[3] = {to_host(sh.master), to_host(sh.exp_avg), to_host(sh.exp_avg_sq)};
  model::TensorMap tensors;
  const auto& specs = policy.layout().specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    const int64_t off = policy.flat_offsets()[i];
    const auto [lo, hi] = covered(specs[i], off, sh.begin, sh.end);
    if (lo >= hi) continue;
    const size_t from = static_cast<size_t>(off + lo - sh.begin) * es, bytes = static_cast<size_t>(hi - lo) * es;
    for (int k = 0; k < 3; ++k) {
      model::StoredTensor t;
      t.dtype = dtype;
      t.shape = {hi - lo};
      t.bytes.assign(host[k].data() + from, bytes);
      tensors[cat(kKinds[k], "@", specs[i].name, "@", lo)] = std::move(t);
    }
  }
  model::write_safetensors(path, tensors);
}

// The compute weights in the Hugging Face layout, in one file or in shards of at most max_shard_bytes with an
// index. Returns the files written (relative to dir).
std::vector<std::string> write_hf_weights(const fs::path& dir, Trainer& trainer, const CheckpointOptions& options) {
  model::Policy& policy = trainer.policy();
  model::ModelConfig config = policy.config();
  config.dtype = policy.weights().dtype == DType::BF16 ? DType::BF16 : DType::F32;
  const std::vector<float> values = policy.params();
  model::TensorMap all = model::params_to_tensors(policy.layout(), values.data(), config.dtype);
  std::vector<std::string> files;
  const auto done = [&](const std::string& name) {
    files.push_back(name);
    if (options.after_file) options.after_file(dir / name);
  };
  model::write_config(dir, config);
  done("config.json");
  int64_t total = 0;
  for (const auto& [name, t] : all) total += static_cast<int64_t>(t.bytes.size());
  if (total <= options.max_shard_bytes) {
    model::write_safetensors(dir / "model.safetensors", all);
    done("model.safetensors");
    return files;
  }
  // Shards in layout order, each closed before it would pass the limit (a larger tensor gets a shard of its own).
  std::vector<model::TensorMap> shards(1);
  int64_t in_shard = 0;
  for (const model::ParamSpec& spec : policy.layout().specs()) {
    auto node = all.extract(spec.name);
    if (node.empty()) continue;  // a tied lm_head is stored once
    const int64_t bytes = static_cast<int64_t>(node.mapped().bytes.size());
    if (in_shard > 0 && in_shard + bytes > options.max_shard_bytes) shards.emplace_back(), in_shard = 0;
    in_shard += bytes;
    shards.back().insert(std::move(node));
  }
  json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    for (const auto& [tensor, t] : shards[s]) index["weight_map"][tensor] = name;
    model::write_safetensors(dir / name, shards[s]);
    done(name);
  }
  model::write_file_atomic(dir / "model.safetensors.index.json", index.dump(2) + "\n");
  done("model.safetensors.index.json");
  return files;
}

// A folder of ours that a later save may remove: DIR.saving or DIR.old left by a save that died. That is a folder
// carrying our marker (an unfinished save, or a replaced checkpoint, which publish marks before it moves it) or an
// empty folder (made, not yet marked, or removed all but itself). Anything else there is not ours: a checkpoint that
// a user saved under such a name is never removed.
bool is_save_leftover(const fs::path& dir) {
  if (fs::symlink_status(dir).type() != fs::file_type::directory) return false;
  return fs::symlink_status(dir / kSavingMarker).type() == fs::file_type::regular || fs::is_empty(dir);
}

void check_removable_leftover(const fs::path& dir) {
  RT_CHECK(is_save_leftover(dir), "checkpoint: refusing to remove ", dir.string(), ": it is neither an unfinished save (",
           "no ", kSavingMarker, ") nor empty; move it away if it is not yours");
}

// Removes a folder of ours with its marker kept to the last, so that a kill at any point leaves a folder that
// is_save_leftover accepts: marked, or empty.
void remove_leftover(const fs::path& dir) {
  model::create_marker(dir / kSavingMarker);
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (e.path().filename() != kSavingMarker) fs::remove_all(e.path());
  fs::remove(dir / kSavingMarker);
  fs::remove(dir);
}

// Whether a save writes an entry of this name and type into a checkpoint folder (the marker too: a kill between
// publishing a checkpoint and removing its marker leaves it there).
bool saved_entry(const fs::directory_entry& e) {
  static const std::regex shard(R"(model-\d{5}-of-\d{5}\.safetensors)"), rank(R"(rank-\d{5}-of-\d{5}\.safetensors)");
  const std::string name = e.path().filename().string();
  const fs::file_type type = e.symlink_status().type();
  if (name == "optimizer") {
    if (type != fs::file_type::directory) return false;
    for (const fs::directory_entry& f : fs::directory_iterator(e.path()))
      if (f.symlink_status().type() != fs::file_type::regular ||
          !std::regex_match(f.path().filename().string(), rank))
        return false;
    return true;
  }
  const std::vector<std::string>& companions = model::hf_companion_files();
  return type == fs::file_type::regular &&
         (name == "config.json" || name == "model.safetensors" || name == "model.safetensors.index.json" ||
          name == kStateFile || name == kSavingMarker || std::regex_match(name, shard) ||
          std::find(companions.begin(), companions.end(), name) != companions.end());
}

// A save replaces only a checkpoint folder of ours that holds nothing but what a save writes, since the folder it
// replaces is removed whole: an export, notes or another checkpoint put inside one are never deleted with it. A link
// is never followed, and named as what it is.
void check_replaceable(const fs::path& dest) {
  RT_CHECK(!fs::is_symlink(dest), "checkpoint: refusing to replace ", dest.string(), ": it is a symbolic link (to ",
           fs::read_symlink(dest).string(), "); save to the folder itself");
  RT_CHECK(is_checkpoint_dir(dest), "checkpoint: refusing to replace ", dest.string(),
           ": it is not a checkpoint folder (a directory with ", kStateFile, ")");
  for (const fs::directory_entry& e : fs::directory_iterator(dest))
    RT_CHECK(saved_entry(e), "checkpoint: refusing to replace ", dest.string(), ": it holds ", e.path().string(),
             ", which a save does not write (move it out of the checkpoint, or save elsewhere)");
}

// A folder of ours removed, or an error that says what to do about it.
void remove_stale(const fs::path& dir) {
  check_removable_leftover(dir);
  try {
    remove_leftover(dir);
  } catch (const std::exception& e) {
    throw Error(cat("checkpoint: cannot remove ", dir.string(), ", left by an earlier save (", e.what(),
                    "); remove it yourself, or save elsewhere"));
  }
}

// DIR.saving made afresh and held for this save (a leftover of a save that died is removed; one that another save
// is writing is refused). The marker goes in before anything else.
std::unique_ptr<model::StagingFolder> prepare_saving_dir(const fs::path& dest, const fs::path& tmp) {
  const std::string what = cat("checkpoint save ", dest.string());
  if (model::exists_no_follow(dest)) {
    check_replaceable(dest);
    model::check_removable(dest, what);
  }
  auto staging = std::make_unique<model::StagingFolder>(tmp, kSavingMarker, what, remove_stale);
  fs::create_directory(tmp / "optimizer");
  return staging;
}

json read_json(const fs::path& path) { return parse_json(model::read_file(path), path.string()); }

// The config as JSON without the storage dtype and the special token ids (a bf16 and an fp32 checkpoint of one model
// are the same model, and the ids change no weight).
json model_fingerprint(model::ModelConfig c) {
  c.dtype = DType::F32;
  c.special_tokens = json::object();
  return model::config_to_json(c);
}

// Every file the state lists exists with its recorded size (a truncated or replaced file is named before any read).
void check_files(const fs::path& dir, const json& files, const fs::path& state_path) {
  RT_CHECK(files.is_object(), state_path.string(), ": 'files' must be an object");
  for (const auto& [name, size] : files.items()) {
    const fs::path rel(name);
    RT_CHECK(rel.is_relative() && name.find("..") == std::string::npos, state_path.string(), ": file name '", name,
             "' must stay inside the checkpoint");
    const fs::path p = dir / rel;
    std::error_code ec;
    RT_CHECK(fs::symlink_status(p, ec).type() == fs::file_type::regular, p.string(),
             ": missing (or not a regular file), listed in ", state_path.string());
    const auto actual = fs::file_size(p, ec);
    RT_CHECK(!ec && size.is_number_unsigned() && actual == size.get<uint64_t>(), p.string(), ": ", actual,
             " bytes, but the checkpoint recorded ", size.dump(), " (truncated or replaced)");
  }
}

// "kind@name@start" → its parts; an error names the file and the tensor.
struct PieceKey {
  int kind = -1;
  std::string name;
  int64_t start = 0;
};
PieceKey parse_piece(const std::string& key, const std::string& file) {
  const size_t a = key.find('@'), b = key.rfind('@');
  PieceKey p;
  if (a != std::string::npos && b > a) {
    const std::string kind = key.substr(0, a);
    for (int k = 0; k < 3; ++k)
      if (kind == kKinds[k]) p.kind = k;
    p.name = key.substr(a + 1, b - a - 1);
    const auto [end, ec] = std::from_chars(key.data() + b + 1, key.data() + key.size(), p.start);
    if (ec != std::errc() || end != key.data() + key.size() || p.start < 0) p.kind = -1;
  }
  RT_CHECK(p.kind >= 0, file, ": tensor '", key, "' is not an optimizer piece (kind@name@start)");
  return p;
}

// Fills this rank's shard (host buffers of the master dtype, 3 × n elements) from every rank's optimizer file, whose
// pieces hold the saved master dtype.
void read_optimizer_shards(const fs::path& dir, const std::vector<std::string>& files, DType saved_dtype,
                           Trainer& trainer, std::vector<char> (&host)[3]) {
  model::Policy& policy = trainer.policy();
  const ShardState& sh = trainer.shard();
  const DType dtype = sh.master.dtype();
  const size_t es = dtype_size(dtype);
  const int64_t n = sh.end - sh.begin;
  // Per element of the shard and kind: 0 = must be filled, 1 = filled or not part of any tensor (an alignment gap).
  std::vector<uint8_t> filled(static_cast<size_t>(3 * n), 1);
  for (size_t i = 0; i < policy.layout().specs().size(); ++i) {
    const auto [lo, hi] = covered(policy.layout().specs()[i], policy.flat_offsets()[i], sh.begin, sh.end);
    for (int k = 0; k < 3 && lo < hi; ++k)
      std::fill_n(filled.begin() + k * n + policy.flat_offsets()[i] + lo - sh.begin, hi - lo, uint8_t{0});
  }
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < policy.layout().specs().size(); ++i) index[policy.layout().specs()[i].name] = i;
  for (const std::string& name : files) {
    const fs::path path = dir / name;
    for (const auto& [key, t] : model::read_safetensors(path)) {
      const PieceKey p = parse_piece(key, path.string());
      const auto found = index.find(p.name);
      RT_CHECK(found != index.end(), path.string(), ": tensor '", key, "' names no weight of this model");
      const model::ParamSpec& spec = policy.layout().specs()[found->second];
      RT_CHECK(t.shape.size() == 1 && t.dtype == saved_dtype, path.string(), ": tensor '", key, "' must be a 1-D ",
               dtype_name(saved_dtype), " tensor (the state's master_dtype), got ", model::shape_string(t.shape), " ",
               dtype_name(t.dtype));
      const int64_t len = t.shape[0];
      RT_CHECK(len <= spec.numel - p.start, path.string(), ": tensor '", key, "' covers ", len, " elements from ",
               p.start, " of a tensor of ", spec.numel);
      const int64_t off = policy.flat_offsets()[found->second];
      const auto [lo, hi] = covered(spec, off, sh.begin, sh.end);
      const int64_t from = std::max(lo, p.start), to = std::min(hi, p.start + len);
      if (from >= to) continue;
      const int64_t at = off + from - sh.begin;  // elements [from, to) of the tensor are [at, at + to - from) here
      std::fill_n(filled.begin() + p.kind * n + at, to - from, uint8_t{1});
      // Each value checked (a corrupted piece must not resume into NaN weights), then copied in the master dtype.
      for (int64_t e = from; e < to; ++e) {
        const double v = load_as_double(t.bytes.data(), t.dtype, e - p.start);
        RT_CHECK(std::isfinite(v) && (p.kind != 2 || v >= 0), path.string(), ": tensor '", key, "' element ",
                 e - p.start, " is ", v, p.kind == 2 ? " (a second moment must be finite and >= 0)"
                                                     : " (optimizer state must be finite)");
        if (t.dtype != dtype) store_from_double(host[p.kind].data(), dtype, at + e - from, v);
      }
      if (t.dtype == dtype)
        std::memcpy(host[p.kind].data() + at * es, t.bytes.data() + (from - p.start) * es, (to - from) * es);
    }
  }
  for (int k = 0; k < 3; ++k)
    for (int64_t at = 0; at < n; ++at)
      if (!filled[k * n + at]) {
        std::string where;
        for (size_t i = 0; i < policy.layout().specs().size(); ++i) {
          const int64_t off = policy.flat_offsets()[i];
          if (sh.begin + at >= off && sh.begin + at < off + policy.layout().specs()[i].numel)
            where = cat(policy.layout().specs()[i].name, " element ", sh.begin + at - off);
        }
        throw Error(cat(dir.string(), "/optimizer: no piece holds ", kKinds[k], " of ", where));
      }
}

// f, with the save named in an error that does not say what it came from (a file system's "cannot write X: ...").
std::function<void()> naming_the_save(const fs::path& dir, std::function<void()> f) {
  return [&dir, f = std::move(f)] { with_context(cat("checkpoint save ", dir.string()), "checkpoint", f); };
}

// A name that a save's leftover has: DIR.saving, or DIR.old.
bool has_leftover_name(const fs::path& path) {
  const std::string name = path.filename().string();
  return name.ends_with(".saving") || name.ends_with(".old");
}

}  // namespace

void check_same_model(const fs::path& config_file, const model::ModelConfig& policy_config) {
  const model::ModelConfig saved = model::load_config(config_file.parent_path());
  const json a = model_fingerprint(saved), b = model_fingerprint(policy_config);
  if (a == b) return;
  for (const auto& [key, value] : a.items()) {
    const auto other = b.find(key);
    RT_CHECK(other != b.end() && *other == value, config_file.string(), ": the checkpoint is of another model: '", key,
             "' is ", value.dump(), " there and ", other == b.end() ? "absent" : other->dump(), " in this policy");
  }
  for (const auto& [key, value] : b.items())
    RT_CHECK(a.contains(key), config_file.string(), ": the checkpoint is of another model: '", key,
             "' is absent there and ", value.dump(), " in this policy");
}

void check_save_leftover(const fs::path& path) {
  if (has_leftover_name(path)) check_removable_leftover(path);
}

std::vector<fs::path> remove_save_leftovers(const fs::path& dir) {
  std::vector<fs::path> leftovers, removed;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (has_leftover_name(e.path()) && is_save_leftover(e.path())) leftovers.push_back(e.path());
  for (const fs::path& p : leftovers)
    if (model::remove_unless_held(p, cat("checkpoint: removing ", p.string()), remove_stale)) removed.push_back(p);
  return removed;
}

void save_training_checkpoint(const fs::path& dir_in, Trainer& trainer, const TrainingProgress& progress,
                              const CheckpointOptions& options) {
  comm::Communicator& world = trainer.mesh().world();
  const int rank = world.rank(), size = world.size();
  fs::path dest, tmp;
  std::unique_ptr<model::StagingFolder> staging;  // rank 0's hold on DIR.saving
  comm::all_or_none(world, "checkpoint save (preparing)", naming_the_save(dir_in, [&] {
    // What load accepts, checked before anything is written: a save that load would refuse must not replace a good
    // one.
    RT_CHECK(progress.epoch >= 0 && progress.index >= 0, "checkpoint save ", dir_in.string(),
             ": the data position (epoch ", progress.epoch, ", index ", progress.index, ") must be non-negative");
    dest = normalized(dir_in);
    tmp = saving_dir(dest);
    if (rank == 0) staging = prepare_saving_dir(dest, tmp);
  }));
  std::vector<std::string> lead_files;
  int64_t shard_bytes = 0;
  comm::all_or_none(world, "checkpoint save (writing)", naming_the_save(dir_in, [&] {
    const fs::path mine = tmp / optimizer_file(rank, size);
    write_optimizer_shard(mine, trainer);
    if (options.after_file) options.after_file(mine);
    shard_bytes = static_cast<int64_t>(fs::file_size(mine));
    if (rank != 0) return;
    lead_files = write_hf_weights(tmp, trainer, options);
    model::write_hf_companion_files(tmp, options.companions);
    if (options.after_file)
      for (const auto& file : options.companions) options.after_file(tmp / file.first);
  }));
  const std::vector<int64_t> sizes = all_gather_i64(world, shard_bytes);
  comm::all_or_none(world, "checkpoint save (publishing)", naming_the_save(dir_in, [&] {
    if (rank != 0) return;
    json st;
    st["format"] = kFormat;
    st["version"] = kVersion;
    st["step"] = trainer.steps_taken();
    st["optimizer_steps"] = trainer.optimizer_steps();
    st["schedule_position"] = trainer.schedule_position();
    const ScheduleConfig& sc = trainer.config().schedule;
    st["schedule"] = {{"decay", sc.decay == ScheduleConfig::Decay::Cosine ? "cosine" : "constant"},
                      {"base_lr", sc.base_lr},
                      {"warmup_steps", sc.warmup_steps},
                      {"warmup_start_factor", sc.warmup_start_factor},
                      {"decay_steps", sc.decay_steps},
                      {"min_lr", sc.min_lr}};
    st["data"] = {{"epoch", progress.epoch}, {"index", progress.index}};
    st["rng"] = progress.rng;
    st["mesh"] = {{"dp", trainer.mesh().dp()}, {"cp", trainer.mesh().cp()}};
    st["master_dtype"] = dtype_name(trainer.shard().master.dtype());
    st["model"] = model_fingerprint(trainer.policy().config());
    st["files"] = json::object();
    st["optimizer_files"] = json::array();
    for (const std::string& f : lead_files) st["files"][f] = fs::file_size(tmp / f);
    for (int r = 0; r < size; ++r) {
      st["files"][optimizer_file(r, size)] = sizes[r];
      st["optimizer_files"].push_back(optimizer_file(r, size));
    }
    model::write_file_atomic(tmp / kStateFile, st.dump(2) + "\n");
    if (options.after_file) options.after_file(tmp / kStateFile);
    // DIR.saving becomes DIR, exchanged with a checkpoint there, which then goes (DIR.old where there is no exchange).
    staging->publish(dest, dest.parent_path() / (dest.filename().string() + ".old"), check_replaceable);
  }));
  world.barrier();  // every rank returns with the checkpoint in place
}

std::optional<ScheduleConfig> saved_schedule(const fs::path& dir_in) {
  const fs::path state_path = normalized(dir_in) / kStateFile;
  const json st = read_json(state_path);
  if (!st.is_object() || !st.contains("schedule")) return std::nullopt;
  const json& j = st.at("schedule");
  const std::string where = cat(state_path.string(), ": schedule");
  RT_CHECK(j.is_object(), where, " = ", json_excerpt(j), ": expected an object");
  const auto field = [&](const char* key) -> const json& {
    RT_CHECK(j.contains(key), where, ": no ", key);
    return j.at(key);
  };
  const auto number = [&](const char* key) {
    const json& v = field(key);
    RT_CHECK(v.is_number(), where, ".", key, " = ", json_excerpt(v), ": expected a number");
    return v.get<double>();
  };
  const auto steps = [&](const char* key) {
    const json& v = field(key);
    RT_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= (int64_t{1} << 53), where, ".",
             key, " = ", json_excerpt(v), ": expected an integer in [0, 2^53]");
    return v.get<int64_t>();
  };
  ScheduleConfig sc;
  const json& decay = field("decay");
  RT_CHECK(decay == "cosine" || decay == "constant", where, ".decay = ", json_excerpt(decay),
           ": expected \"cosine\" or \"constant\"");
  sc.decay = decay == "cosine" ? ScheduleConfig::Decay::Cosine : ScheduleConfig::Decay::Constant;
  sc.base_lr = number("base_lr");
  sc.warmup_steps = steps("warmup_steps");
  sc.warmup_start_factor = number("warmup_start_factor");
  sc.decay_steps = steps("decay_steps");
  sc.min_lr = number("min_lr");
  try {
    validate(sc);
  } catch (const Error& e) {
    throw Error(cat(where, ": ", e.what()));
  }
  return sc;
}

TrainingProgress load_training_checkpoint(const fs::path& dir_in, Trainer& trainer) {
  comm::Communicator& world = trainer.mesh().world();
  TrainingProgress progress;
  int64_t steps = 0, optimizer_steps = 0, schedule_position = 0;
  ShardState& sh = trainer.shard();
  std::vector<char> host[3];
  comm::all_or_none(world, "checkpoint load", [&] {
    const fs::path dir = normalized(dir_in), state_path = dir / kStateFile;
    const json st = read_json(state_path);
    try {
      RT_CHECK(st.value("format", "") == kFormat && st.value("version", 0) == kVersion, state_path.string(),
               ": not a ringtrain training state of version ", kVersion);
      check_files(dir, st.at("files"), state_path);
      check_same_model(dir / "config.json", trainer.policy().config());
      // get<int64_t> would truncate 4.7 to 4 and wrap 2^64 - 1 to -1.
      // Up to 2^53, more steps than any run takes: the counters grow with every step and must not overflow.
      const auto counter = [&](const json& v, const char* key) {
        RT_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= (int64_t{1} << 53),
                 state_path.string(), ": ", key, " = ", json_excerpt(v), ": expected an integer in [0, 2^53]");
        return v.get<int64_t>();
      };
      steps = counter(st.at("step"), "step");
      optimizer_steps = counter(st.at("optimizer_steps"), "optimizer_steps");
      schedule_position = counter(st.at("schedule_position"), "schedule_position");
      // A skipped step takes no optimizer step; the schedule steps once per train step, skipped or not.
      RT_CHECK(optimizer_steps <= steps, state_path.string(), ": optimizer_steps = ", optimizer_steps,
               " exceeds step = ", steps);
      RT_CHECK(schedule_position == steps, state_path.string(), ": schedule_position = ", schedule_position,
               " but step = ", steps, " (the schedule steps once per train step)");
      progress.epoch = counter(st.at("data").at("epoch"), "data.epoch");
      progress.index = counter(st.at("data").at("index"), "data.index");
      progress.rng = st.at("rng").get<std::string>();
      std::vector<std::string> files = st.at("optimizer_files").get<std::vector<std::string>>();
      for (const std::string& f : files)
        RT_CHECK(st["files"].contains(f), state_path.string(), ": optimizer file ", f, " has no recorded size");
      // The saving mesh and master dtype: any may load, but they must describe the files (one per saving rank).
      const int64_t dp = counter(st.at("mesh").at("dp"), "mesh.dp"), cp = counter(st.at("mesh").at("cp"), "mesh.cp");
      RT_CHECK(dp >= 1 && cp >= 1 && dp <= comm::kMaxRanks && cp <= comm::kMaxRanks &&
                   dp * cp == static_cast<int64_t>(files.size()),
               state_path.string(), ": mesh ", dp, " x ", cp, " does not match its ", files.size(), " optimizer files");
      const std::string master = st.at("master_dtype").get<std::string>();
      std::optional<DType> saved_dtype;
      try {
        saved_dtype = parse_dtype(master);
      } catch (const Error&) {  // refused below, with the value and what is expected
      }
      RT_CHECK(saved_dtype && is_float(*saved_dtype), state_path.string(), ": master_dtype = '", master.substr(0, 40),
               "': expected fp64, fp32, bf16 or fp16");
      for (auto& h : host) h.resize(sh.master.nbytes());
      read_optimizer_shards(dir, files, *saved_dtype, trainer, host);
    } catch (const nlohmann::json::exception& e) {
      throw Error(cat(state_path.string(), ": ", e.what()));
    }
  });
  // Every rank has read its part: only now is the state replaced, so a load that fails on any rank leaves every
  // rank's state as it was.
  const Tensor* dst[3] = {&sh.master, &sh.exp_avg, &sh.exp_avg_sq};
  for (int k = 0; k < 3; ++k)
    if (!host[k].empty())
      copy(*dst[k], contiguous_view(host[k].data(), sh.master.dtype(), Device::cpu(), {sh.master.numel()}));
  trainer.restore_counters(steps, optimizer_steps, schedule_position);
  trainer.refresh_weights();
  return progress;
}

}  // namespace ringtrain::train
