#include "ringtrain/worker/plot.h"

#include <fnmatch.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <map>

#include "ringtrain/core/error.h"
#include "ringtrain/core/json.h"
#include "ringtrain/model/file_io.h"

namespace ringtrain::worker {
namespace {

// Layout in SVG user units (pixels).
constexpr double kWidth = 860, kPanelHeight = 240, kTitleHeight = 44;
constexpr double kLeft = 78, kRight = 24, kTop = 30, kBottom = 44;  // a panel's plot area inside its band

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// The length of the UTF-8 sequence at s[i] and its code point, or 0 where the bytes there are not UTF-8 (a stray
// continuation byte, a cut or overlong sequence, a surrogate, a code point above U+10FFFF).
size_t utf8_sequence(const std::string& s, size_t i, uint32_t& code) {
  const auto byte = [&](size_t k) { return k < s.size() ? static_cast<unsigned char>(s[k]) : 0u; };
  const unsigned b0 = byte(i);
  const auto continuation = [&](size_t k) { return (byte(k) & 0xC0u) == 0x80u; };
  if (b0 < 0x80) return code = b0, 1;
  if (b0 >= 0xC2 && b0 <= 0xDF && continuation(i + 1)) return code = (b0 & 0x1Fu) << 6 | (byte(i + 1) & 0x3Fu), 2;
  if (b0 >= 0xE0 && b0 <= 0xEF && continuation(i + 1) && continuation(i + 2)) {
    code = (b0 & 0x0Fu) << 12 | (byte(i + 1) & 0x3Fu) << 6 | (byte(i + 2) & 0x3Fu);
    return code >= 0x800 && (code < 0xD800 || code > 0xDFFF) ? 3 : 0;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4 && continuation(i + 1) && continuation(i + 2) && continuation(i + 3)) {
    code = (b0 & 0x07u) << 18 | (byte(i + 1) & 0x3Fu) << 12 | (byte(i + 2) & 0x3Fu) << 6 | (byte(i + 3) & 0x3Fu);
    return code >= 0x10000 && code <= 0x10FFFF ? 4 : 0;
  }
  return 0;
}

// Text as XML 1.0 takes it: markup characters escaped; bytes that are not UTF-8 (a path in another encoding) shown as
// U+FFFD; control characters other than tab, U+FFFE and U+FFFF, which XML does not allow, left out.
std::string xml_escape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    uint32_t code = 0;
    const size_t n = utf8_sequence(s, i, code);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    switch (code) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if ((code >= 0x20 || code == '\t') && code != 0xFFFE && code != 0xFFFF) out.append(s, i, n);
    }
    i += n;
  }
  return out;
}

struct Ticks {
  double lo, hi, step;  // the axis spans [lo, hi]; ticks at lo, lo + step, ..., hi
};

// Round tick values (1, 2 or 5 times a power of ten) covering [min, max] with about `target` intervals.
Ticks nice_ticks(double min, double max, int target, const std::string& what) {
  // One value, or values apart by less than 1e-12 of their size (the last bits of a metric that does not move, which
  // no tick step could tell apart): a range around their middle.
  if (!(max - min > 1e-12 * std::max(std::abs(min), std::abs(max)))) {
    const double mid = min + (max - min) / 2, pad = mid == 0 ? 1.0 : std::abs(mid) * 0.1;
    min = mid - pad, max = mid + pad;
  }
  const double raw = (max - min) / target;
  RT_CHECK(std::isfinite(raw) && raw > 0, what, " spans [", min, ", ", max,
           "], a range too wide or too narrow to plot");
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  const double step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
  Ticks t{std::floor(min / step) * step, std::ceil(max / step) * step, step};
  // The products round: 0.7 on a step of 0.02 gives a lo of 0.7000000000000001. A step further out covers it.
  if (t.lo > min) t.lo -= step;
  if (t.hi < max) t.hi += step;
  RT_CHECK(t.hi > t.lo && t.lo <= min && t.hi >= max, what, " spans [", min, ", ", max, "], which ticks of ", step,
           " cannot cover");
  return t;
}

// Tick labels: few digits, but enough to tell neighbouring ticks of the axis apart.
std::string tick_label(double v, const Ticks& t) {
  if (std::abs(v) < t.step * 1e-9) v = 0;  // -0 and rounding noise at zero
  const double a = std::abs(v);
  if (a != 0 && (a >= 1e6 || a < 1e-3)) {
    const double top = std::max(std::abs(t.lo), std::abs(t.hi));
    const int digits = static_cast<int>(std::floor(std::log10(top)) - std::floor(std::log10(t.step))) + 1;
    return fmt(cat("%.", std::clamp(digits, 3, 15), "g").c_str(), v);
  }
  const int decimals = std::max(0, static_cast<int>(std::ceil(-std::log10(t.step) - 1e-9)));
  return fmt(cat("%.", std::min(decimals, 15), "f").c_str(), v);
}

void render_panel(std::string& svg, const Series& s, double y0) {
  const double px0 = kLeft, px1 = kWidth - kRight, py0 = y0 + kTop, py1 = y0 + kPanelHeight - kBottom;
  const auto [xmin, xmax] = std::minmax_element(s.steps.begin(), s.steps.end());
  const auto [vmin, vmax] = std::minmax_element(s.values.begin(), s.values.end());
  const Ticks xt = nice_ticks(*xmin, *xmax, 8, "the steps of " + s.name);
  const Ticks yt = nice_ticks(*vmin, *vmax, 5, "metric " + s.name);
  auto x_of = [&](double x) { return px0 + (x - xt.lo) / (xt.hi - xt.lo) * (px1 - px0); };
  auto y_of = [&](double v) { return py1 - (v - yt.lo) / (yt.hi - yt.lo) * (py1 - py0); };

  svg += cat("<g class=\"panel\" data-metric=\"", xml_escape(s.name), "\">\n");
  svg += cat("<text class=\"panel-title\" x=\"", fmt("%.2f", (px0 + px1) / 2), "\" y=\"", fmt("%.2f", py0 - 10),
             "\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">", xml_escape(s.name), "</text>\n");
  // Ticks are generated by index so that accumulated rounding cannot drop or repeat the last one.
  const int nx = static_cast<int>(std::llround((xt.hi - xt.lo) / xt.step));
  for (int i = 0; i <= nx; ++i) {
    const double v = xt.lo + i * xt.step, x = x_of(v);
    svg += cat("<line class=\"grid\" x1=\"", fmt("%.2f", x), "\" y1=\"", fmt("%.2f", py0), "\" x2=\"", fmt("%.2f", x),
               "\" y2=\"", fmt("%.2f", py1), "\" stroke=\"#e4e4e4\"/>\n");
    svg +=
        cat("<line class=\"xtick\" data-value=\"", fmt("%.17g", v), "\" x1=\"", fmt("%.2f", x), "\" y1=\"",
            fmt("%.2f", py1), "\" x2=\"", fmt("%.2f", x), "\" y2=\"", fmt("%.2f", py1 + 5), "\" stroke=\"#333\"/>\n");
    svg += cat("<text class=\"xtick-label\" x=\"", fmt("%.2f", x), "\" y=\"", fmt("%.2f", py1 + 19),
               "\" text-anchor=\"middle\" font-size=\"12\">", tick_label(v, xt), "</text>\n");
  }
  const int ny = static_cast<int>(std::llround((yt.hi - yt.lo) / yt.step));
  for (int i = 0; i <= ny; ++i) {
    const double v = yt.lo + i * yt.step, y = y_of(v);
    svg += cat("<line class=\"grid\" x1=\"", fmt("%.2f", px0), "\" y1=\"", fmt("%.2f", y), "\" x2=\"", fmt("%.2f", px1),
               "\" y2=\"", fmt("%.2f", y), "\" stroke=\"#e4e4e4\"/>\n");
    svg += cat("<line class=\"ytick\" data-value=\"", fmt("%.17g", v), "\" x1=\"", fmt("%.2f", px0 - 5), "\" y1=\"",
               fmt("%.2f", y), "\" x2=\"", fmt("%.2f", px0), "\" y2=\"", fmt("%.2f", y), "\" stroke=\"#333\"/>\n");
    svg += cat("<text class=\"ytick-label\" x=\"", fmt("%.2f", px0 - 8), "\" y=\"", fmt("%.2f", y + 4),
               "\" text-anchor=\"end\" font-size=\"12\">", tick_label(v, yt), "</text>\n");
  }
  svg += cat("<rect class=\"frame\" x=\"", fmt("%.2f", px0), "\" y=\"", fmt("%.2f", py0), "\" width=\"",
             fmt("%.2f", px1 - px0), "\" height=\"", fmt("%.2f", py1 - py0), "\" fill=\"none\" stroke=\"#333\"/>\n");
  svg += cat("<text class=\"xlabel\" x=\"", fmt("%.2f", (px0 + px1) / 2), "\" y=\"", fmt("%.2f", py1 + 37),
             "\" text-anchor=\"middle\" font-size=\"13\">step</text>\n");
  const double ymid = (py0 + py1) / 2;
  svg += cat("<text class=\"ylabel\" x=\"18\" y=\"", fmt("%.2f", ymid),
             "\" text-anchor=\"middle\" font-size=\"13\" "
             "transform=\"rotate(-90 18 ",
             fmt("%.2f", ymid), ")\">", xml_escape(s.name), "</text>\n");
  svg += "<polyline class=\"series\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.8\" points=\"";
  for (size_t i = 0; i < s.steps.size(); ++i)
    svg += cat(i ? " " : "", fmt("%.2f", x_of(s.steps[i])), ",", fmt("%.2f", y_of(s.values[i])));
  svg += "\"/>\n</g>\n";
}

}  // namespace

std::vector<Series> read_metrics(const std::filesystem::path& jsonl) {
  const std::string text = model::read_file(jsonl);  // names a missing file, a directory, a FIFO as such
  // Per metric, in order of first appearance: step -> value, so a step written again (a run resumed from an earlier
  // checkpoint) keeps its latest value and the curve runs left to right.
  std::vector<std::pair<std::string, std::map<double, double>>> by_step;
  std::map<std::string, size_t> index;
  int64_t lineno = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t nl = std::min(text.find('\n', pos), text.size());
    const bool last_unended = nl == text.size();  // a whole record without its newline, or one still being written
    const std::string_view line(text.data() + pos, nl - pos);
    pos = nl + 1;
    ++lineno;
    const std::string where = cat(jsonl.string(), ":", lineno);
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    nlohmann::ordered_json j;
    try {
      j = parse_ordered_json(line, where, 1);  // an object of scalars
    } catch (const Error&) {
      if (last_unended) break;  // the run was writing it when it stopped
      throw;
    }
    RT_CHECK(j.is_object() && j.contains("step") && j["step"].is_number(), where,
             ": expected an object with a numeric \"step\"");
    const double step = j["step"].get<double>();
    RT_CHECK(std::isfinite(step), where, ": step is not finite");
    for (const auto& [key, value] : j.items()) {
      if (key == "step" || key == "wall_time" || !value.is_number()) continue;
      const double v = value.get<double>();
      if (!std::isfinite(v)) continue;
      auto [it, fresh] = index.emplace(key, by_step.size());
      if (fresh) by_step.emplace_back(key, std::map<double, double>{});
      by_step[it->second].second[step] = v;
    }
  }
  std::vector<Series> out;
  for (const auto& [name, points] : by_step) {
    Series s{name, {}, {}};
    for (const auto& [step, value] : points) s.steps.push_back(step), s.values.push_back(value);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<std::string> default_panels(const std::vector<Series>& all) {
  std::vector<std::string> names;
  for (const char* first : {"loss", "grad_norm"}) {
    for (const Series& s : all)
      if (s.name == first) names.push_back(s.name);
  }
  for (const Series& s : all) {
    const bool wanted = s.name.find("reward") != std::string::npos || s.name.find("kl") != std::string::npos;
    if (wanted && std::find(names.begin(), names.end(), s.name) == names.end()) names.push_back(s.name);
  }
  return names;
}

std::vector<Series> select_series(const std::vector<Series>& all, const std::vector<std::string>& names) {
  std::vector<Series> out;
  std::vector<bool> shown(all.size(), false);
  for (const std::string& n : names) {
    const bool pattern = n.find('*') != std::string::npos;
    bool matched = false;
    for (size_t i = 0; i < all.size(); ++i) {
      const bool match = pattern ? ::fnmatch(n.c_str(), all[i].name.c_str(), 0) == 0 : all[i].name == n;
      if (!match) continue;
      matched = true;
      if (!shown[i]) out.push_back(all[i]);
      shown[i] = true;
    }
    if (!matched) {
      std::string known;
      for (const Series& s : all) known += (known.empty() ? "" : ", ") + s.name;
      throw Error(cat("no metric ", pattern ? "matches '" : "'", n, "'", pattern ? "" : " with a finite value",
                      " (the file has: ", known.empty() ? "none" : known, ")"));
    }
  }
  return out;
}

std::string render_svg(const std::vector<Series>& panels, const std::string& title) {
  RT_CHECK(!panels.empty(), "no metrics to plot");
  for (const Series& s : panels)
    RT_CHECK(!s.steps.empty() && s.steps.size() == s.values.size(), "metric '", s.name, "' has no points");
  const double height = kTitleHeight + kPanelHeight * static_cast<double>(panels.size());
  std::string svg =
      cat("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", kWidth,
          "\" height=\"", height, "\" viewBox=\"0 0 ", kWidth, " ", height,
          "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n");
  svg += cat("<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
  svg += cat("<text class=\"title\" x=\"", kWidth / 2,
             "\" y=\"28\" text-anchor=\"middle\" font-size=\"19\" "
             "font-weight=\"bold\">",
             xml_escape(title), "</text>\n");
  for (size_t i = 0; i < panels.size(); ++i) render_panel(svg, panels[i], kTitleHeight + kPanelHeight * i);
  svg += "</svg>\n";
  return svg;
}

void check_svg_out(const std::filesystem::path& out) {
  RT_CHECK(out.extension() == ".svg", out.string(), ": the curves go to a file named NAME.svg; refusing to write them "
           "over what may be another file");
  std::error_code ec;
  const auto st = std::filesystem::symlink_status(out, ec);
  RT_CHECK(!std::filesystem::exists(st) || std::filesystem::is_regular_file(st), out.string(),
           ": exists and is not a regular file; not replacing it");
}

void write_svg(const std::filesystem::path& out, const std::string& svg) {
  check_svg_out(out);
  model::write_file_atomic(out, svg);
}

}  // namespace ringtrain::worker
