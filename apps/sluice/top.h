// top.h: `sluice top`: a running server's policies in a terminal, one line each, refreshing:
// in-flight against the limit, decisions and refusals per second (the commonest reason), and
// the kind's own column (a fleet's L_global, a federated policy's escrow, the throttler's worst
// metric against its threshold, a cascade's open breakers). Plain ANSI (any terminal, over SSH,
// 80 columns and up): sort and filter keys, q or Ctrl-C to quit with the terminal restored.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client.h"

namespace sluice::cli {

enum class TopSort { kName, kKind, kUtilisation, kRate, kRefusals };

struct TopOptions {
  double interval_seconds = 1;
  TopSort sort = TopSort::kName;
  std::string filter;  // only policies whose name or kind holds it
  bool once = false;   // print one frame (after one interval, for the rates) and exit
};

// One policy's line, from its state now and one interval before (null: none yet).
struct TopRow {
  std::string name, kind;
  std::string in_flight = "-";  // "3/10"; "-" for kinds without leases
  std::string detail;           // the kind's own column
  double utilisation = 0;       // in flight / limit, 0 without one
  double rate = 0;              // decisions per second
  double refused = 0;           // refusals per second
  std::string reason;           // the commonest reason among them ("" when none)
};
[[nodiscard]] TopRow top_row(const nlohmann::json& now, const nlohmann::json& before,
                             double seconds);

struct TopView {
  std::string server, status;  // status: "generation 3, 2 lease(s)" or why it is not answering
  std::vector<TopRow> rows;
  TopSort sort = TopSort::kName;
  std::string filter;
  bool editing_filter = false;  // the filter prompt is open
};
// The screen: a header, the column titles, one line per row (sorted, filtered, as many as
// fit in `height` with the footer), the keys; every line at most `width` characters.
[[nodiscard]] std::vector<std::string> top_frame(const TopView& v, int width, int height);

// "name", "kind", "util", "rate", "refused" (the --sort values); false if none of them.
[[nodiscard]] bool parse_top_sort(const std::string& text, TopSort& out);

// Exit codes: 0 (quit with q or Ctrl-C, or --once done), 2 (the server did not answer with
// --once, or the terminal could not be set up).
int run_top(const ClientOptions& o, const TopOptions& t);

}  // namespace sluice::cli
