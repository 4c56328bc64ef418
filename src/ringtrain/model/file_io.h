// Whole-file reads and crash-safe writes (a temporary name in the same folder, then a rename).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace ringtrain::model {

std::string read_file(const std::filesystem::path& path);
// Writes `bytes` to path + ".tmp.<pid>" and renames it over `path`; a failed write leaves `path` untouched.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes);

}  // namespace ringtrain::model
