// etcd_options.h: how to reach an etcd v3 cluster (sluice/backends/etcd_coordinator.h).
//
// What it is: a plain value, apart from the coordinators themselves, so that a config can name an
// etcd cluster without pulling in the etcd backend (library sluice::etcd, gRPC).
//
// Endpoints: the members' client addresses ("host:port", gRPC on etcd's client port), tried in
// order; a call that a member cannot answer (down, isolated from the quorum, no leader) moves on
// to the next one within the call's timeout, and later calls start there. Any member serves
// every call: etcd forwards writes to its leader and answers reads linearizably (never
// serializable reads), so each call sees every write acknowledged before it, wherever it lands.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "sluice/core/clock.h"

namespace sluice {

struct EtcdOptions {
  std::vector<std::string> endpoints = {"127.0.0.1:2379"};  // default 127.0.0.1:2379
  // With etcd's authentication on: the user and password (Auth.Authenticate); the token it hands
  // back goes with every call and is asked for again when etcd no longer takes it. Empty: none.
  std::string username;
  std::string password;
  // How long the first connection to a member may take before the next one is tried (a call's
  // own timeout bounds it too). Default 1 s.
  Nanos connect_timeout = std::chrono::seconds(1);
  std::string key_prefix = "sluice/fleet/";  // default "sluice/fleet/"
  // Federation only (sluice/backends/etcd_rate_coordinator.h): how far, at most, any server's
  // wall clock is from true time. etcd lends no clock, so a window's time is its callers' clocks;
  // escrow ends twice this early, and a server whose clock is more than twice this behind
  // another's is refused. Default 100 ms.
  Nanos max_clock_offset = std::chrono::milliseconds(100);
  // TLS (etcd's --cert-file on its client URLs): with ca_file, every member is reached over TLS
  // and its certificate verified against that CA (PEM); with cert_file and key_file too, this
  // client shows that certificate (etcd's --client-cert-auth). Empty: plain TCP.
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

}  // namespace sluice
