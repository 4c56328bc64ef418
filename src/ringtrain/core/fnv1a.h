// FNV-1a, 64 bits: a fingerprint of a run's inputs (a data file's tokens, a prompt file's records) recorded in its
// checkpoints, so that a resume on other inputs of the same size is told apart. Not a cryptographic hash.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace ringtrain {

class Fnv1a {
 public:
  // The eight bytes of v, least significant first.
  void mix(uint64_t v) {
    for (int i = 0; i < 8; ++i) byte(static_cast<unsigned char>(v >> (8 * i)));
  }
  // The length, then the bytes: "ab" + "c" and "a" + "bc" differ.
  void mix(std::string_view s) {
    mix(static_cast<uint64_t>(s.size()));
    for (char c : s) byte(static_cast<unsigned char>(c));
  }
  uint64_t value() const { return hash_; }
  // Sixteen lower-case hex digits.
  std::string hex() const {
    char out[17];
    std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(hash_));
    return out;
  }

 private:
  void byte(unsigned char b) { hash_ = (hash_ ^ b) * 1099511628211ull; }
  uint64_t hash_ = 14695981039346656037ull;
};

}  // namespace ringtrain
