// `ringtrain plot METRICS.jsonl --out curves.svg`: training curves as an SVG, one panel per metric.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/cli/commands.h"
#include "ringtrain/cli/options.h"
#include "ringtrain/core/error.h"
#include "ringtrain/worker/plot.h"

namespace ringtrain::cli {

void add_plot_command(CLI::App& app) {
  struct Opts {
    std::string metrics, out, title;
    std::vector<std::string> panels;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("plot", "Plot training curves from metrics.jsonl as an SVG");
  cmd->add_option("metrics", o->metrics, "metrics.jsonl written by a training run")->required();
  cmd->add_option("--out", o->out, "SVG file to write")->required();
  cmd->add_option("--metrics", o->panels,
                  "metrics to plot, one panel each; '*' matches any characters (default: loss, grad_norm, *reward*, "
                  "*kl*)")
      ->delimiter(',');
  cmd->add_option("--title", o->title, "title (default: the metrics file's path)");
  cmd->callback([o] {
    // Read first: a metrics path that is no file is the error to report, not an --out beside it.
    const std::vector<worker::Series> all = worker::read_metrics(o->metrics);
    check_out_is_not_input("--out", o->out, {{o->metrics, "metrics"}});
    const std::vector<std::string> names = o->panels.empty() ? worker::default_panels(all) : o->panels;
    RT_CHECK(!names.empty(), o->metrics,
             ": none of loss, grad_norm, reward or kl has a finite value; name the "
             "metrics with --metrics");
    const auto panels = worker::select_series(all, names);
    worker::write_svg(o->out, worker::render_svg(panels, o->title.empty() ? o->metrics : o->title));
    std::printf("wrote %s (%zu panels)\n", o->out.c_str(), panels.size());
  });
}

}  // namespace ringtrain::cli
