#include "ringtrain/core/error.h"

#include <cstdio>

namespace ringtrain {

std::string printable(std::string_view text, bool line_breaks) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c < 0x20 && !(line_breaks && (c == '\n' || c == '\t'))) || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace ringtrain
