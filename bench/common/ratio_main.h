// ratio_main.h: a main() for sluice's Google Benchmark executables that reports every
// benchmark as a ratio to a floor measured in the same run.
//
// A benchmark file registers its benchmarks as usual, declares its ratios with
// SLUICE_BENCH_RATIO(subject, floor, target) and ends with SLUICE_BENCH_MAIN(). After the run
// the table prints, per ratio: the subject's and the floor's median time per operation and their
// quotient, next to the target (0 = report only). Nothing is asserted: the figures are read,
// recorded in bench/README.md, and never turned into a timed test. Unless the command line says
// otherwise, each benchmark runs 5 repetitions and the medians are compared.
// SLUICE_BENCH_BUDGET(subject, ns) adds an absolute budget from a document to the table.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace sluice::bench {

struct Ratio {
  std::string subject;
  std::string floor;
  double target;  // subject/floor must stay at or below this; 0 = report only
};

inline std::vector<Ratio>& ratios() {
  static std::vector<Ratio> r;
  return r;
}

inline bool declare_ratio(std::string subject, std::string floor, double target) {
  ratios().push_back({std::move(subject), std::move(floor), target});
  return true;
}

// An absolute budget a document sets (e.g. the gateway ADR's 100 ns per request), printed next
// to the ratios; as with them, nothing is asserted.
struct Budget {
  std::string subject;
  double ns;
};

inline std::vector<Budget>& budgets() {
  static std::vector<Budget> b;
  return b;
}

inline bool declare_budget(std::string subject, double ns) {
  budgets().push_back({std::move(subject), ns});
  return true;
}

// Collects the median (or the single run's) real time per operation of every benchmark.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      const bool single = run.run_type == Run::RT_Iteration && run.repetitions <= 1;
      if (median || single) ns_[run.run_name.str()] = run.GetAdjustedRealTime();
    }
  }
  [[nodiscard]] const std::map<std::string, double>& times() const { return ns_; }

 private:
  std::map<std::string, double> ns_;
};

inline bool has_flag(int argc, char** argv, const char* prefix) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]).rfind(prefix, 0) == 0) return true;
  return false;
}

inline int ratio_main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  std::string reps = "--benchmark_repetitions=5";
  std::string only_aggregates = "--benchmark_report_aggregates_only=true";
  if (!has_flag(argc, argv, "--benchmark_repetitions") &&
      !has_flag(argc, argv, "--benchmark_min_time")) {
    args.push_back(reps.data());
    args.push_back(only_aggregates.data());
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
#ifndef NDEBUG
  std::printf("WARNING: assertions are on (not a release build): figures are not representative\n");
#endif
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  std::printf("\n%-58s %10s %10s %8s %8s\n", "ratio (median ns/op)", "subject", "floor", "ratio",
              "target");
  for (const Ratio& r : ratios()) {
    const auto s = reporter.times().find(r.subject);
    const auto f = reporter.times().find(r.floor);
    if (s == reporter.times().end() || f == reporter.times().end() || f->second <= 0) continue;
    const double q = s->second / f->second;
    const std::string verdict = r.target <= 0 ? "report" : (q <= r.target ? "met" : "MISSED");
    std::printf("%-58s %10.2f %10.2f %7.2fx %7.2fx %s\n", (r.subject + " / " + r.floor).c_str(),
                s->second, f->second, q, r.target, verdict.c_str());
  }
  if (!budgets().empty())
    std::printf("\n%-58s %10s %10s\n", "budget (median ns/op)", "subject", "budget");
  for (const Budget& b : budgets()) {
    const auto s = reporter.times().find(b.subject);
    if (s == reporter.times().end()) continue;
    std::printf("%-58s %10.2f %10.2f %s\n", b.subject.c_str(), s->second, b.ns,
                s->second <= b.ns ? "met" : "MISSED");
  }
  return 0;
}

}  // namespace sluice::bench

#define SLUICE_BENCH_CAT2(a, b) a##b
#define SLUICE_BENCH_CAT(a, b) SLUICE_BENCH_CAT2(a, b)
#define SLUICE_BENCH_RATIO(subject, floor, target)                                     \
  [[maybe_unused]] static const bool SLUICE_BENCH_CAT(sluice_bench_ratio_, __LINE__) = \
      ::sluice::bench::declare_ratio(subject, floor, target)
#define SLUICE_BENCH_BUDGET(subject, ns)                                                \
  [[maybe_unused]] static const bool SLUICE_BENCH_CAT(sluice_bench_budget_, __LINE__) = \
      ::sluice::bench::declare_budget(subject, ns)
#define SLUICE_BENCH_MAIN() \
  int main(int argc, char** argv) { return ::sluice::bench::ratio_main(argc, argv); }
