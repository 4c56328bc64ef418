#include "ringtrain/core/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace ringtrain {
namespace {

LogLevel level_from_env() {
  const char* s = std::getenv("RINGTRAIN_LOG_LEVEL");
  if (!s) return LogLevel::Info;
  if (!std::strcmp(s, "debug")) return LogLevel::Debug;
  if (!std::strcmp(s, "warn")) return LogLevel::Warn;
  if (!std::strcmp(s, "error")) return LogLevel::Error;
  if (std::strcmp(s, "info"))
    std::fprintf(stderr, "[ringtrain warn] RINGTRAIN_LOG_LEVEL=%s: expected debug, info, warn or error; logging at "
                 "info\n", s);
  return LogLevel::Info;
}

}  // namespace

LogLevel log_level() {
  static const LogLevel level = level_from_env();
  return level;
}

void log_line(LogLevel level, const std::string& msg) {
  static const char* names[] = {"debug", "info", "warn", "error"};
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[ringtrain %s] %s\n", names[static_cast<int>(level)], msg.c_str());
}

}  // namespace ringtrain
