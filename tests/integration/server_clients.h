// server_clients.h: the backend tests' own ways into the servers the harness starts, beside
// the code under test: redis-cli for one command, a blocking libpq connection for SQL. Setup
// and inspection only; a failed statement is a test failure.
#pragma once

#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <array>
#include <cstdio>
#include <string>
#include <vector>

namespace sluice::test_clients {

// One redis-cli command's output (trailing newlines removed); `password` for AUTH.
inline std::string cli(int port, const std::string& args, const std::string& password = {}) {
  std::string cmd = "redis-cli -h 127.0.0.1 -p " + std::to_string(port);
  if (!password.empty()) cmd += " --no-auth-warning -a " + password;
  cmd += " " + args + " 2>&1";
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    std::array<char, 512> buf{};
    while (std::fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
    ::pclose(p);
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// The value of `field` in `INFO <section>` ("" when absent).
inline std::string info_field(int port, const std::string& section, const std::string& field) {
  const std::string info = cli(port, "INFO " + section);
  const auto at = info.find(field + ":");
  if (at == std::string::npos) return {};
  const auto end = info.find_first_of("\r\n", at);
  return info.substr(at + field.size() + 1,
                     end == std::string::npos ? std::string::npos : end - at - field.size() - 1);
}

// Makes the federation's Redis coordinator on `prefix` one that has kept its state for a long
// time: the origin marker at 0 and the server marker naming the server as it is now (its run_id
// and evicted_keys), so a first window is not spent. Returns whether both were written.
inline bool settle_federation(int port, const std::string& prefix) {
  const std::string server =
      info_field(port, "server", "run_id") + ":" + info_field(port, "stats", "evicted_keys");
  return cli(port, "SET " + prefix + "origin 0") == "OK" &&
         cli(port, "SET " + prefix + "server " + server) == "OK";
}

// A blocking libpq connection (PQexec).
class RawConn {
 public:
  explicit RawConn(const std::string& conninfo) : c_(PQconnectdb(conninfo.c_str())) {}
  ~RawConn() { PQfinish(c_); }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;

  [[nodiscard]] bool ok() const { return PQstatus(c_) == CONNECTION_OK; }
  [[nodiscard]] std::string error() const { return PQerrorMessage(c_); }

  // Every row of `sql` as text ("" for NULL); a failure is a test failure and no rows.
  std::vector<std::vector<std::string>> rows(const std::string& sql) {
    PGresult* r = PQexec(c_, sql.c_str());
    std::vector<std::vector<std::string>> out;
    const ExecStatusType st = PQresultStatus(r);
    EXPECT_TRUE(st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK)
        << sql << ": " << PQresultErrorMessage(r);
    for (int i = 0; st == PGRES_TUPLES_OK && i < PQntuples(r); ++i) {
      out.emplace_back();
      for (int j = 0; j < PQnfields(r); ++j) out.back().emplace_back(PQgetvalue(r, i, j));
    }
    PQclear(r);
    return out;
  }
  // The single value of `sql` ("" for NULL; "<no single value>" for none or several).
  std::string value(const std::string& sql) {
    const auto r = rows(sql);
    return r.size() == 1 && r[0].size() == 1 ? r[0][0] : "<no single value>";
  }

 private:
  PGconn* c_;
};

}  // namespace sluice::test_clients
