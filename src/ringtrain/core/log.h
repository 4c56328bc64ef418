// Logging to stderr with a level from RINGTRAIN_LOG_LEVEL (debug, info, warn, error; default info).
#pragma once

#include <string>

#include "ringtrain/core/error.h"

namespace ringtrain {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3 };

LogLevel log_level();
void log_line(LogLevel level, const std::string& msg);

}  // namespace ringtrain

#define RT_LOG(level, ...)                                                                   \
  do {                                                                                       \
    if (::ringtrain::LogLevel::level >= ::ringtrain::log_level())                            \
      ::ringtrain::log_line(::ringtrain::LogLevel::level, ::ringtrain::cat(__VA_ARGS__));    \
  } while (0)
