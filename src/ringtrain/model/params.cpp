#include "ringtrain/model/params.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <new>
#include <random>
#include <set>
#include <vector>

#include "ringtrain/core/checked.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/json.h"
#include "ringtrain/core/sys_error.h"
#include "ringtrain/model/file_io.h"

namespace ringtrain::model {

int64_t ParamLayout::add(std::string name, std::vector<int64_t> shape) {
  ParamSpec s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.numel = checked_numel(s.shape, cat("parameter '", s.name, "' size"));
  s.offset = total_;
  total_ = checked_add(total_, s.numel, "parameter count");
  specs_.push_back(std::move(s));
  return specs_.back().offset;
}

ParamLayout::ParamLayout(const ModelConfig& c) {
  const int64_t qd = c.heads * c.head_dim, kvd = c.kv_heads * c.head_dim;
  embed = add("model.embed_tokens.weight", {c.vocab, c.hidden});
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = cat("model.layers.", i, ".");
    LayerOffsets l;
    l.input_norm = add(p + "input_layernorm.weight", {c.hidden});
    l.q_w = add(p + "self_attn.q_proj.weight", {qd, c.hidden});
    if (c.qkv_bias) l.q_b = add(p + "self_attn.q_proj.bias", {qd});
    l.k_w = add(p + "self_attn.k_proj.weight", {kvd, c.hidden});
    if (c.qkv_bias) l.k_b = add(p + "self_attn.k_proj.bias", {kvd});
    l.v_w = add(p + "self_attn.v_proj.weight", {kvd, c.hidden});
    if (c.qkv_bias) l.v_b = add(p + "self_attn.v_proj.bias", {kvd});
    l.o_w = add(p + "self_attn.o_proj.weight", {c.hidden, qd});
    if (c.o_bias) l.o_b = add(p + "self_attn.o_proj.bias", {c.hidden});
    if (c.qk_norm) {
      l.q_norm = add(p + "self_attn.q_norm.weight", {c.head_dim});
      l.k_norm = add(p + "self_attn.k_norm.weight", {c.head_dim});
    }
    l.post_norm = add(p + "post_attention_layernorm.weight", {c.hidden});
    l.gate = add(p + "mlp.gate_proj.weight", {c.ffn, c.hidden});
    l.up = add(p + "mlp.up_proj.weight", {c.ffn, c.hidden});
    l.down = add(p + "mlp.down_proj.weight", {c.hidden, c.ffn});
    layers.push_back(l);
  }
  final_norm = add("model.norm.weight", {c.hidden});
  lm_head = c.tie_embeddings ? embed : add("lm_head.weight", {c.vocab, c.hidden});
}

const ParamSpec* ParamLayout::find(const std::string& name) const {
  for (const ParamSpec& s : specs_)
    if (s.name == name) return &s;
  return nullptr;
}

namespace {

// A NaN or infinite weight makes every output NaN (written as null): refuse it at load, naming the tensor.
void check_finite(const float* v, int64_t n, const std::string& what) {
  for (int64_t i = 0; i < n; ++i)
    RT_CHECK(std::isfinite(v[i]), what, ": element ", i, " is ", v[i], " (weights must be finite)");
}

std::vector<float> allocate_params(const ParamLayout& layout, const std::string& what) {
  try {
    return std::vector<float>(static_cast<size_t>(layout.total()));
  } catch (const std::bad_alloc&) {
    throw Error(cat(what, ": cannot allocate ", layout.total(), " fp32 parameters (",
                    static_cast<double>(layout.total()) * 4 / (1 << 30), " GiB)"));
  } catch (const std::length_error&) {
    throw Error(cat(what, ": ", layout.total(), " fp32 parameters exceed the address space"));
  }
}

}  // namespace

std::vector<float> params_from_tensors(const ParamLayout& layout, const ModelConfig& c, const TensorMap& tensors,
                                       const std::string& source) {
  // Names and shapes first, from the headers alone: a config.json that claims a far larger model than its weights is
  // refused before the memory it claims is allocated.
  std::set<std::string_view> expected;
  for (const ParamSpec& s : layout.specs()) {
    expected.insert(s.name);
    auto it = tensors.find(s.name);
    RT_CHECK(it != tensors.end(), source, ": missing tensor '", s.name, "' (expected shape ", shape_string(s.shape),
             ")");
    RT_CHECK(it->second.shape == s.shape, it->second.file, ": tensor '", s.name, "' has shape ",
             shape_string(it->second.shape), ", expected ", shape_string(s.shape), " from config.json");
  }
  for (const auto& [name, t] : tensors) {
    if (expected.count(name)) continue;
    const bool rope_cache = name.ends_with("rotary_emb.inv_freq");
    const bool tied_head = c.tie_embeddings && name == "lm_head.weight";
    RT_CHECK(rope_cache || tied_head, t.file, ": unexpected tensor '", name, "' ", shape_string(t.shape),
             " for a ", arch_class_name(c.arch), " with this config.json");
  }
  std::vector<float> out = allocate_params(layout, source);
  for (const ParamSpec& s : layout.specs()) {
    const auto it = tensors.find(s.name);
    to_float32(s.name, it->second, out.data() + s.offset);
    check_finite(out.data() + s.offset, s.numel, cat(it->second.file, ": tensor '", s.name, "'"));
  }
  return out;
}

TensorMap params_to_tensors(const ParamLayout& layout, const float* values, DType dtype) {
  TensorMap out;
  for (const ParamSpec& s : layout.specs())
    out.emplace(s.name, from_float32(std::vector<float>(values + s.offset, values + s.offset + s.numel), s.shape, dtype));
  return out;
}

std::vector<float> random_params(const ParamLayout& layout, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 0.02f);
  std::vector<float> out = allocate_params(layout, "random_params");
  for (const ParamSpec& s : layout.specs()) {
    const bool is_norm = s.name.find("norm.weight") != std::string::npos;
    const bool is_bias = s.name.ends_with(".bias");
    for (int64_t i = 0; i < s.numel; ++i) out[s.offset + i] = is_norm ? 1.f : is_bias ? 0.f : normal(rng);
  }
  return out;
}

namespace {

const char* const kIndexName = "model.safetensors.index.json";

bool holds_checkpoint(const std::filesystem::path& dir) {
  for (const char* name : {"config.json", "model.safetensors", kIndexName})
    if (std::filesystem::exists(std::filesystem::symlink_status(dir / name))) return true;
  return false;
}

// The shard files an index names (plain names only; anything else is not ours to delete).
std::set<std::string> indexed_shards(const std::filesystem::path& index) {
  std::set<std::string> shards;
  try {
    const nlohmann::json j = parse_json(read_file(index), index.string());
    if (j.is_object() && j.contains("weight_map") && j["weight_map"].is_object())
      for (const auto& [name, file] : j["weight_map"].items())
        if (file.is_string() && file.get<std::string>().find('/') == std::string::npos &&
            file.get<std::string>().ends_with(".safetensors"))
          shards.insert(file.get<std::string>());
  } catch (const Error&) {
    // A broken stale index still goes; its shards stay, since we cannot tell which they are.
  }
  return shards;
}

void rename_or_throw(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int err = errno;
    throw Error(sys_message(cat("cannot rename ", from.string(), " to"), to.string(), err));
  }
}

void remove_or_throw(const std::filesystem::path& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) throw_sys_error("cannot remove", path.string());
}

// Moves the files of the finished checkpoint in `staged` over those of `dir`: the stale index first (the folder must
// not hold a second set of weights), then each file by rename, then the shards the index named. Every file it replaces
// or removes is checked before the first is touched and kept as a link in `staged` until the new files are in, so
// that a failing move puts it back: the folder holds the previous checkpoint or the new one, never a mix.
void replace_checkpoint_files(const std::filesystem::path& staged, const std::filesystem::path& dir) {
  const std::filesystem::path index = dir / kIndexName;
  const char* const kMoved[] = {"model.safetensors", "config.json"};
  const char* const kReplaced[] = {kIndexName, "model.safetensors", "config.json"};  // removed (the index) or moved
  for (const char* name : kReplaced) check_replaceable(dir / name);
  const bool has_index = std::filesystem::exists(std::filesystem::symlink_status(index));
  std::set<std::string> stale_shards;
  if (has_index) stale_shards = indexed_shards(index);
  stale_shards.erase("model.safetensors");
  for (const std::string& shard : stale_shards) check_replaceable(dir / shard);

  const auto kept = [&](const std::string& name) { return staged / cat("previous.", name); };
  std::vector<std::string> previous;  // the files of `dir` kept in `staged`
  for (const char* name : kReplaced)
    if (std::filesystem::exists(std::filesystem::symlink_status(dir / name))) {
      if (::link((dir / name).c_str(), kept(name).c_str()) != 0)
        throw_sys_error("nothing was changed: cannot keep a hard link (to put it back on a failure) to",
                        (dir / name).string());
      previous.push_back(name);
    }
  std::vector<std::string> changed;  // the names of `dir` already removed or replaced
  try {
    if (has_index) {
      remove_or_throw(index);
      changed.push_back(kIndexName);
    }
    for (const char* name : kMoved) {
      rename_or_throw(staged / name, dir / name);
      changed.push_back(name);
    }
  } catch (const Error& e) {
    std::string restore;
    for (const std::string& name : changed) {
      const bool had = std::find(previous.begin(), previous.end(), name) != previous.end();
      const int rc = had ? ::rename(kept(name).c_str(), (dir / name).c_str()) : ::unlink((dir / name).c_str());
      if (rc != 0) restore += cat("; ", sys_message("could not put back", (dir / name).string(), errno));
    }
    throw Error(cat(e.what(), changed.empty()   ? std::string("; nothing was changed")
                              : restore.empty() ? std::string("; the previous files were put back")
                                                : restore));
  }
  for (const std::string& shard : stale_shards) remove_or_throw(dir / shard);
  sync_path(dir);
}

}  // namespace

void save_checkpoint(const std::filesystem::path& dir, const ModelConfig& c, const std::vector<float>& values,
                     ExistingCheckpoint existing) {
  const ParamLayout layout(c);
  RT_CHECK(static_cast<int64_t>(values.size()) == layout.total(), "save_checkpoint: ", values.size(),
           " values for a model of ", layout.total(), " parameters");
  const std::filesystem::path target = std::filesystem::absolute(dir).lexically_normal();
  std::error_code ec;
  // A symlink is refused, not followed: it would put the checkpoint into a folder the command was not given.
  const std::filesystem::file_status status = std::filesystem::symlink_status(target, ec);
  const bool exists = std::filesystem::exists(status);
  RT_CHECK(!exists || std::filesystem::is_directory(status), "cannot write a checkpoint to ", dir.string(),
           ": it exists and is not a directory", std::filesystem::is_symlink(status) ? " (a symlink)" : "");
  RT_CHECK(!exists || existing == ExistingCheckpoint::Replace || !holds_checkpoint(target), dir.string(),
           " already holds a checkpoint (config.json, model.safetensors or an index); refusing to overwrite it");
  // The whole checkpoint is written into a staging folder next to the target first, so that a full disk or a
  // crash leaves either the old checkpoint or none, never a partial one.
  const std::filesystem::path parent = target.parent_path();
  std::filesystem::create_directories(parent);
  const std::filesystem::path staged = temporary_sibling(target);
  std::filesystem::remove_all(staged, ec);
  if (!std::filesystem::create_directory(staged, ec))
    throw Error(sys_message("cannot create", staged.string(), ec.value()));
  try {
    write_safetensors(staged / "model.safetensors", params_to_tensors(layout, values.data(), c.dtype));
    write_config(staged, c);
    if (!exists) {
      rename_or_throw(staged, target);
      sync_path(parent);
      return;
    }
    replace_checkpoint_files(staged, target);
  } catch (...) {
    std::filesystem::remove_all(staged, ec);
    throw;
  }
  std::filesystem::remove_all(staged, ec);
}

std::vector<float> load_checkpoint_params(const std::filesystem::path& dir, const ModelConfig& c) {
  return params_from_tensors(ParamLayout(c), c, read_checkpoint_tensors(dir, TensorData::Defer),
                             dir.string());
}

}  // namespace ringtrain::model
