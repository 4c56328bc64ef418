#include "ringtrain/model/file_io.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "ringtrain/core/error.h"

namespace ringtrain::model {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  RT_CHECK(in, "cannot open ", path.string(), ": ", std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  RT_CHECK(!in.bad(), "error reading ", path.string());
  return bytes;
}

void write_file_atomic(const std::filesystem::path& path, std::string_view bytes) {
  const std::filesystem::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    RT_CHECK(out, "cannot create ", tmp.string(), ": ", std::strerror(errno));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw Error(cat("error writing ", tmp.string(), " (", bytes.size(), " bytes)"));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw Error(cat("cannot rename ", tmp.string(), " to ", path.string(), ": ", ec.message()));
  }
}

}  // namespace ringtrain::model
