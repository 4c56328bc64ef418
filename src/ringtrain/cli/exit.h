// How a command ends the program other than by returning: an exit code, or the signal that stopped its run.
#pragma once

namespace ringtrain::cli {

// Thrown by a command to end the program with a given exit code after printing its own message. A run that a signal
// stopped ends by that signal instead (`signal`, raised again under the disposition the program started with), so
// that the shell that started it sees a process the signal ended and a script's loop stops too.
struct Exit {
  int code;
  int signal = 0;
};

}  // namespace ringtrain::cli
