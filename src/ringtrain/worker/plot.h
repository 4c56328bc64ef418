// Training curves from metrics.jsonl as an SVG: one panel per metric, stacked, each with its own axes, ticks at
// round values, grid lines and labels, under one title.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace ringtrain::worker {

struct Series {
  std::string name;
  std::vector<double> steps, values;  // finite points only, by increasing step
};

// Every numeric key of metrics.jsonl except step and wall_time becomes a series; null values (non-finite metrics)
// are left out. A step that appears again (a resumed run) keeps its last value. A last line without its newline (a
// run stopped while writing it) is ignored; any other bad line is an error naming FILE:LINE.
std::vector<Series> read_metrics(const std::filesystem::path& jsonl);

// The panels shown when none are named: loss, grad_norm, then every metric with "reward" or "kl" in its name;
// only those present.
std::vector<std::string> default_panels(const std::vector<Series>& all);
// The named series, in the order named; a name with '*' is a shell-style pattern (fnmatch) standing for every
// metric it matches, in file order. A series is shown once however many names match it. An error lists the metrics
// the file has when a name matches none.
std::vector<Series> select_series(const std::vector<Series>& all, const std::vector<std::string>& names);

std::string render_svg(const std::vector<Series>& panels, const std::string& title);
// An error unless `out` ends in .svg and is absent or a regular file (a symlink is not followed): what write_svg
// checks, for a command to check before the work whose curves it will write.
void check_svg_out(const std::filesystem::path& out);
// Writes through a temporary file and a rename, after check_svg_out.
void write_svg(const std::filesystem::path& out, const std::string& svg);

}  // namespace ringtrain::worker
