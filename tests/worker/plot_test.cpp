// Training curves: metrics.jsonl read into series (nulls and a torn last line skipped, bad lines named), and the
// SVG parsed back: one panel per metric in order, and every polyline point mapped back through the panel's own
// tick marks to the data it was drawn from.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <random>
#include <regex>

#include "ringtrain/core/error.h"
#include "ringtrain/model/file_io.h"
#include "ringtrain/worker/metrics.h"
#include "ringtrain/worker/plot.h"
#include "test_util.h"

namespace ringtrain::worker {
namespace {

namespace fs = std::filesystem;

double attr(const std::string& element, const std::string& name) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(element, m, std::regex(" " + name + "=\"([^\"]*)\""))) << name << " in " << element;
  return std::stod(m[1].str());
}

// The panel's tick marks: (data value, pixel) pairs of one axis.
std::vector<std::pair<double, double>> ticks(const std::string& panel, const std::string& cls, const char* pixel) {
  std::vector<std::pair<double, double>> out;
  const std::regex tick("<line class=\"" + cls + "\"[^>]*/>");
  for (auto it = std::sregex_iterator(panel.begin(), panel.end(), tick); it != std::sregex_iterator(); ++it)
    out.emplace_back(attr(it->str(), "data-value"), attr(it->str(), pixel));
  return out;
}

TEST(WorkerPlot, PanelsAndPointsMatchTheData) {
  const testing::TempDir tmp("rt_plot_test");
  const fs::path& dir = tmp.path;
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<double> loss, kl;
  {
    MetricsWriter w(dir, false);
    double l = 3.0;
    for (int64_t step = 1; step <= 37; ++step) {
      l *= std::exp(-0.05 + 0.02 * std::normal_distribution<double>()(rng));
      loss.push_back(l);
      kl.push_back(step == 9 ? std::nan("") : 1e-3 * static_cast<double>(step));
      w.write(step, {{"loss", l},
                     {"grad_norm", 1.0 + 0.1 * step},
                     {"lr", 1e-5},
                     {"kl_to_ref", kl.back()},
                     {"reward/mean", std::normal_distribution<double>()(rng)}});
    }
  }
  // Steps 31-37 written again (a file appended to by hand, or by another writer): the later values replace the earlier
  // ones.
  {
    std::ofstream again(dir / "metrics.jsonl", std::ios::app);
    again.precision(17);
    for (int64_t step = 31; step <= 37; ++step) {
      loss[static_cast<size_t>(step - 1)] = 0.01 * static_cast<double>(step);
      again << "{\"step\": " << step << ", \"loss\": " << loss[static_cast<size_t>(step - 1)] << "}\n";
    }
  }
  // A torn last line (the run stopped while writing it) is ignored.
  std::ofstream(dir / "metrics.jsonl", std::ios::app) << "{\"step\": 38, \"loss\": 1";

  const std::vector<Series> all = read_metrics(dir / "metrics.jsonl");
  EXPECT_EQ(default_panels(all), (std::vector<std::string>{"loss", "grad_norm", "kl_to_ref", "reward/mean"}));
  const std::vector<Series> panels = select_series(all, {"loss", "kl_to_ref"});
  // Patterns: every match in file order, each series once; a pattern that matches nothing names what the file has.
  std::vector<std::string> matched;
  for (const Series& s : select_series(all, {"*re*", "loss", "kl*"})) matched.push_back(s.name);
  EXPECT_EQ(matched, (std::vector<std::string>{"kl_to_ref", "reward/mean", "loss"}));
  try {
    select_series(all, {"entropy*"});
    ADD_FAILURE() << "no error for a pattern that matches nothing";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no metric matches 'entropy*' (the file has: "), std::string::npos)
        << e.what();
  }
  ASSERT_EQ(panels[0].values, loss);
  ASSERT_EQ(panels[0].steps.size(), 37u);
  EXPECT_TRUE(std::is_sorted(panels[0].steps.begin(), panels[0].steps.end()));
  ASSERT_EQ(panels[1].steps.size(), 36u);  // the NaN at step 9 was written as null and is skipped

  const std::string svg = render_svg(panels, "run <A> & B");
  EXPECT_NE(svg.find(">run &lt;A&gt; &amp; B</text>"), std::string::npos);
  const std::regex panel_re("<g class=\"panel\" data-metric=\"([^\"]*)\">([\\s\\S]*?)</g>");
  std::vector<std::string> names;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), panel_re); it != std::sregex_iterator(); ++it) {
    const std::string name = (*it)[1].str(), body = (*it)[2].str();
    names.push_back(name);
    const Series& s = panels[names.size() - 1];
    SCOPED_TRACE(name);
    EXPECT_NE(body.find("class=\"panel-title\""), std::string::npos);
    EXPECT_NE(body.find(">step</text>"), std::string::npos);
    // The axis maps from two of its ticks (the first and the last), as a reader of the picture would take them.
    const auto xt = ticks(body, "xtick", "x1"), yt = ticks(body, "ytick", "y1");
    ASSERT_GE(xt.size(), 3u);
    ASSERT_GE(yt.size(), 3u);
    auto inverse = [](const std::vector<std::pair<double, double>>& t, double pixel) {
      return t.front().first +
             (pixel - t.front().second) / (t.back().second - t.front().second) * (t.back().first - t.front().first);
    };
    // Ticks cover the data.
    EXPECT_LE(xt.front().first, s.steps.front());
    EXPECT_GE(xt.back().first, s.steps.back());
    std::smatch m;
    ASSERT_TRUE(std::regex_search(body, m, std::regex("<polyline class=\"series\"[^>]* points=\"([^\"]*)\"")));
    std::istringstream points(m[1].str());
    std::string pt;
    size_t i = 0;
    // Points are written with 0.01 px: half of that in data units, plus rounding of the tick positions.
    const double x_tol = 0.02 * (xt.back().first - xt.front().first) / std::abs(xt.back().second - xt.front().second);
    const double y_tol = 0.02 * (yt.back().first - yt.front().first) / std::abs(yt.back().second - yt.front().second);
    while (points >> pt) {
      ASSERT_LT(i, s.steps.size());
      const size_t comma = pt.find(',');
      EXPECT_NEAR(inverse(xt, std::stod(pt.substr(0, comma))), s.steps[i], x_tol);
      EXPECT_NEAR(inverse(yt, std::stod(pt.substr(comma + 1))), s.values[i], y_tol);
      ++i;
    }
    EXPECT_EQ(i, s.steps.size());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"loss", "kl_to_ref"}));

  write_svg(dir / "curves.svg", svg);
  EXPECT_EQ(model::read_file(dir / "curves.svg"), svg);
  auto error_of_writing = [&](const fs::path& out) -> std::string {
    try {
      write_svg(out, svg);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  fs::create_directories(dir / "adir.svg");
  EXPECT_NE(error_of_writing(dir / "adir.svg").find("adir.svg: exists and is not a regular file"), std::string::npos);
  std::ofstream(dir / "metrics.jsonl") << "{\"step\": 1}\n";
  EXPECT_NE(error_of_writing(dir / "metrics.jsonl").find("metrics.jsonl: the curves go to a file named NAME.svg"),
            std::string::npos);
  EXPECT_EQ(model::read_file(dir / "metrics.jsonl"), "{\"step\": 1}\n");
  // A hidden file named ".svg" has no extension: the same refusal, whose message fits it too.
  EXPECT_NE(error_of_writing(dir / ".svg").find(".svg: the curves go to a file named NAME.svg"), std::string::npos);
}

// Values a few ulps apart (a metric that does not move), spans of 1e-9 of their size, and huge or tiny magnitudes:
// every coordinate finite, ticks covering the data, and no two tick labels of an axis the same.
TEST(WorkerPlot, NarrowSpansGetFiniteCoordinatesAndDistinctLabels) {
  std::mt19937_64 rng(testing::fresh_seed());
  const auto ulps = [](double v, int n) {
    for (int i = 0; i < n; ++i) v = std::nextafter(v, INFINITY);
    return v;
  };
  const double base = std::exp(std::uniform_real_distribution<double>(-14, 16)(rng));
  const std::vector<std::pair<double, double>> spans = {
      {0.013231498163515324, 0.013231498163515326}, {1e12, 1000000000000.0001}, {base, ulps(base, 3)},
      {5.545177459716797, 5.545177459716797 * (1 + 1e-9)}, {-2.5e-7, -2.5e-7 * (1 - 1e-8)}, {0, 0}, {7, 7},
      // Ends on a multiple of the step, whose products round past them (0.7 / 0.02 * 0.02 = 0.7000000000000001).
      {0.7, 0.75}, {0.85, 1.0}, {0.35, 0.36}, {-0.75, -0.7}};
  for (const auto& [a, b] : spans) {
    SCOPED_TRACE(::testing::Message() << std::setprecision(17) << a << " .. " << b);
    const std::string svg = render_svg({{"loss", {1, 2, 3}, {a, b, a}}}, "t");
    EXPECT_EQ(svg.find("nan"), std::string::npos);
    EXPECT_EQ(svg.find("inf"), std::string::npos);
    std::vector<double> tick_values;
    for (const auto& [value, pixel] : ticks(svg, "ytick", "y1")) {
      EXPECT_TRUE(std::isfinite(value) && std::isfinite(pixel));
      tick_values.push_back(value);
    }
    ASSERT_GE(tick_values.size(), 2u);
    EXPECT_LE(tick_values.front(), std::min(a, b));
    EXPECT_GE(tick_values.back(), std::max(a, b));
    std::vector<std::string> labels;
    const std::regex label("<text class=\"ytick-label\"[^>]*>([^<]*)</text>");
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), label); it != std::sregex_iterator(); ++it)
      labels.push_back((*it)[1].str());
    std::sort(labels.begin(), labels.end());
    EXPECT_EQ(std::adjacent_find(labels.begin(), labels.end()), labels.end()) << svg;
  }
}

// Titles and metric names are written as XML 1.0 text: bytes that are not UTF-8 become U+FFFD, characters XML does
// not allow are left out, and valid UTF-8 passes as it is.
TEST(WorkerPlot, TextThatIsNotUtf8BecomesValidXml) {
  const std::string title = "caf\xe9 \xff\xfe \xed\xa0\x80 \xef\xbf\xbf \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 \xe2\x82";
  const std::string svg = render_svg({{"r\xef\xbf\xbe", {1, 2}, {1, 2}}}, title);
  const std::string replacement = "\xef\xbf\xbd";
  EXPECT_NE(svg.find(">caf" + replacement + " " + replacement + replacement + " " + replacement + replacement +
                     replacement + "  \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 " + replacement + replacement + "</text>"),
            std::string::npos)
      << svg;
  EXPECT_NE(svg.find("data-metric=\"r\""), std::string::npos);
}

// The last line of a file without its newline is a record when it parses (a file a tool wrote without the final
// newline); a torn one is the run's last write and skipped (PanelsAndPointsMatchTheData).
TEST(WorkerPlot, AWholeLastLineWithoutItsNewlineCounts) {
  const testing::TempDir tmp("rt_plot_last");
  std::ofstream(tmp.path / "m.jsonl") << "{\"step\":1,\"loss\":2}\n{\"step\":2,\"loss\":1}\n{\"step\":3,\"loss\":0.5}";
  const std::vector<Series> all = read_metrics(tmp.path / "m.jsonl");
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].values, (std::vector<double>{2, 1, 0.5}));
}

TEST(WorkerPlot, BadInputsAreNamed) {
  const testing::TempDir tmp("rt_plot_test");
  const fs::path& dir = tmp.path;
  auto error_of = [&](const std::string& text) -> std::string {
    std::ofstream(dir / "m.jsonl", std::ios::trunc) << text;
    try {
      read_metrics(dir / "m.jsonl");
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(error_of("{\"step\": 1}\n{\"loss\": [1]}\n").find("m.jsonl:2: JSON nested deeper"), std::string::npos);
  EXPECT_NE(error_of("{\"loss\": 1}\n").find("m.jsonl:1: expected an object with a numeric \"step\""),
            std::string::npos);
  EXPECT_NE(error_of("{\"step\": 1,\n").find("m.jsonl:1: invalid JSON"), std::string::npos);
  EXPECT_THROW(select_series(read_metrics(dir / "m.jsonl"), {"loss"}), Error);
  EXPECT_THROW(render_svg({}, "t"), Error);
  // One point, a constant series and extreme values draw or fail cleanly, never produce NaN coordinates.
  const std::string one = render_svg({Series{"x", {5}, {2.5}}}, "t");
  EXPECT_EQ(one.find("nan"), std::string::npos);
  EXPECT_THROW(render_svg({Series{"x", {0, 1}, {-1.7e308, 1.7e308}}}, "t"), Error);
}

}  // namespace
}  // namespace ringtrain::worker
