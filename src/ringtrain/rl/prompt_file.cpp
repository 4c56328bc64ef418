#include "ringtrain/rl/prompt_file.h"

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "ringtrain/core/error.h"
#include "ringtrain/core/json.h"

namespace ringtrain::rl {
namespace {

bool blank(const std::string& line) { return line.find_first_not_of(" \t\r") == std::string::npos; }

}  // namespace

std::vector<Example> read_prompt_file(const std::filesystem::path& path, const CharTokenizer& tokenizer) {
  const std::string name = path.string();
  std::error_code ec;
  RT_CHECK(std::filesystem::is_regular_file(path, ec), "prompt file ", name, ": not a regular file",
           ec ? cat(" (", ec.message(), ")") : std::string());
  std::ifstream in(path, std::ios::binary);
  RT_CHECK(in.good(), "prompt file ", name, ": cannot be opened");
  std::vector<Example> examples;
  std::string line;
  for (int64_t number = 1;; ++number) {
    line.clear();
    // Read by hand up to the bound: std::getline would hold a whole file without newlines in memory.
    char c;
    bool any = false;
    while (in.get(c) && c != '\n') {
      any = true;
      RT_CHECK(static_cast<int64_t>(line.size()) < kMaxPromptLineBytes, name, ":", number, ": line longer than ",
               kMaxPromptLineBytes, " bytes");
      line += c;
    }
    if (!any && !in) break;
    if (blank(line)) continue;
    const std::string where = cat(name, ":", number);
    // Records are flat: any object or array inside the top-level one is refused before the line is parsed.
    const nlohmann::json record = parse_json(line, where, 1);
    RT_CHECK(record.is_object(), where, ": a record must be a JSON object, not ", record.type_name());
    for (const auto& [key, value] : record.items()) {
      RT_CHECK(key == "prompt" || key == "answer", where, ": unknown key '", key, "' (expected prompt, answer)");
      RT_CHECK(value.is_string(), where, ": key '", key, "' must be a string, not ", value.type_name());
    }
    Example e;
    e.origin = where;
    for (const char* key : {"prompt", "answer"}) {
      RT_CHECK(record.contains(key), where, ": missing key '", key, "'");
      std::string& field = std::string(key) == "prompt" ? e.prompt : e.answer;
      field = record[key].get<std::string>();
      try {
        tokenizer.encode(field);
      } catch (const Error& err) {
        throw Error(cat(where, ": key '", key, "': ", err.what()));
      }
    }
    RT_CHECK(!e.prompt.empty(), where, ": empty prompt");
    examples.push_back(std::move(e));
  }
  RT_CHECK(!in.bad(), "prompt file ", name, ": read error");
  RT_CHECK(!examples.empty(), "prompt file ", name, ": no records");
  return examples;
}

}  // namespace ringtrain::rl
