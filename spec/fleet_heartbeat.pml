/* fleet_heartbeat.pml: the fleet guard's heartbeat protocol, for spin.
 *
 * The same protocol as src/core/fleet.cpp (sluice::heartbeat, sluice::leave) and its exhaustive
 * twin tests/model/fleet_model_test.cpp: N nodes (guards) share one key of a coordinator. Every
 * node reports l_local = L, so L_global = L with either aggregate (constant L_global), and a
 * guard's gate min(share, L_local) is its share. (With a constant aggregate the core's ceiling
 * in force is L throughout; the twin also searches L_local moving under held calls.) The coordinator keeps per node a record
 * (present, in_flight, share, acked generation, and with acknowledged handoff the grants not yet
 * superseded by an ack) and the key's generation. Its step is one d_step, rule for rule as
 * heartbeat(): upsert the reporter (in_flight, acked = max(acked, reported); with handoff drop
 * the grants with generation < acked), target (equal split: floor(L/n), +1 for the first L mod n
 * present ids in index order; -DDEMAND: demand-proportional, a satisfied node (in_flight < share)
 * gets a 1-slot probe, the hungry ones split the rest), cap: share = min(target, L - sum over the
 * other records of reserve), reserve = max(share, in_flight) (-DHANDOFF: and the largest
 * unacknowledged share), generation = max(generation, acked) + 1 (-DHANDOFF: appended to the
 * reporter's unacknowledged grants). Leases never lapse by themselves (the coordinator runs with
 * one `now`): a record goes by leave or by an expire step.
 *
 * Each node, in every interleaving: a fresh node's first heartbeat is its join; acquire iff
 * in_flight < its enforced share; release; leave (graceful, in_flight == 0: the record goes at
 * once); crash (its in-flight calls vanish, its record stays); expire (a stopped node's record is
 * removed: the lease expiry). Asynchronous heartbeats (default) take three steps with anything
 * interleaved: send (in_flight and the enforced generation are snapshotted into a report; at most
 * one heartbeat outstanding per node), process (the coordinator step on the snapshot, even if
 * the node has stopped since) and deliver (the node applies share and generation; a grant to a
 * stopped node is lost). -DSYNC makes report, process and deliver one atomic step.
 *
 * Finite space: after every step the generations the state mentions are renumbered 1..k in
 * order, as the twin does (they only meet the protocol through order comparisons and
 * "next = max + 1", so this is a bisimulation), and each node sends at most HB heartbeats
 * (default 3; -DHB=0: unbounded, as in the twin). With -DHB=0 the state count is the twin's plus
 * one (pan's state before init starts the nodes): -DHB=0 -DL=2 -DHANDOFF stores 4,924,287
 * states, the twin's async 3 nodes L = 2 equal split 4,924,286; -DHB=0 -DSYNC 88,241 and 88,240.
 * -DHB=0 at the default N = L = 3 with -DHANDOFF is too big for the suite (19.4M states, 2.5 GB).
 *
 * Checked, as assertions at the end of every step: GlobalCap (the shares of the present records
 * sum to <= L) always; InflightCap (the nodes' in-flight calls sum to <= L). InflightCap holds
 * with -DSYNC, and with -DHANDOFF in the asynchronous model; without either it fails: the
 * document's bounded residual (a guard admits against a cached grant while its reduction is in
 * transit), which shows the asynchronous model is not vacuous. -DNO_INFLIGHT_CAP replaces
 * InflightCap by that residual's bound (in-flight calls sum to <= 2L), so GlobalCap alone can be
 * checked in the asynchronous model without handoff. No invalid end state: every node loop is an
 * end state.
 *
 * -DTWIN: node 1 reports under node 0's id as another member (a server given another's
 * server.node_id). Every record names the member that wrote it; the coordinator refuses a report
 * whose id a present record of another member holds (sluice::clash: nothing changes, the node
 * enforces share 0), and a leave by another member leaves the record alone. InflightCap holds;
 * -DTWIN -DBROKEN_TWIN (no instance check: the report takes the record over afresh, a leave
 * takes it whoever wrote it) must fail.
 *
 * A deliberately broken variant spin must catch: -DBROKEN_STATELESS makes the coordinator a
 * stateless floor(L/n) split (+1 for the first L mod n ids) with no cap and no reserve; a joiner
 * gets a share while an incumbent still holds its larger pre-join one (GlobalCap fails; the
 * in-flight assertions are off in that variant). Run: spin -a -DHANDOFF fleet_heartbeat.pml &&
 * gcc -DSAFETY -o pan pan.c && ./pan (tests/spec/run_spin.sh does this in the test suite, with
 * -DSYNC, -DHANDOFF, -DHANDOFF -DDEMAND, -DTWIN -DHANDOFF, no flag (must fail),
 * -DBROKEN_STATELESS -DSYNC and -DTWIN -DBROKEN_TWIN -DSYNC (both must fail)).
 *
 * -DLOSS: the coordinator may lose its whole state between any two steps (a Redis back empty:
 * every record and the key's generation), while the nodes keep their calls, their grants and
 * the grants in transit to them. Within lease_ttl of the loss (`lost`) every grant is share 0
 * (fleet.h's loss rule); recover is the lease_ttl having passed: every grant from before the loss
 * has run out (a node still enforcing one, or receiving one late, admits nothing on it) and
 * every call admitted on one has ended by its deadline, and since the loss every grant was share
 * 0, so no call is younger. InflightCap holds with -DLOSS -DSYNC (1.3M states, 8 s) and
 * -DLOSS -DHANDOFF -DN=3 -DL=2 -DHB=2 (3.9M states, 19 s; at N = L = 3 it does not end in 15
 * minutes); -DLOSS -DBROKEN_LOSS (grants as usual right after a loss) must fail, and does in a
 * few hundred states.
 */
#ifndef N
#define N 3
#endif
#ifndef L
#define L 3
#endif
#ifndef HB
#define HB 3 /* heartbeats per node; 0: unbounded */
#endif
#if HB > 0
#define HB_LEFT(me) (node[me].hb < HB)
#define HB_COUNT(me) node[me].hb++
#else
#define HB_LEFT(me) true
#define HB_COUNT(me) skip
#endif
#define GMAX 32 /* generations in use after a step; at most 6N + 2 (checked) */
#define UMAX 2 /* unacknowledged grants per record: the acked one and the new one (checked) */

#ifdef TWIN
#define ID(me) (me == 1 -> 0 : me) /* node 1 reports under node 0's id: another member */
#else
#define ID(me) me
#endif
#ifdef BROKEN_TWIN
#define OWNS(me) true /* a leave or an expiry takes the record whoever wrote it */
#else
#define OWNS(me) (rec[ID(me)].owner == me + 1)
#endif

#define FRESH 0
#define RUNNING 1
#define STOPPED 2

#ifndef BROKEN_STATELESS
#ifndef NO_INFLIGHT_CAP
#define INFLIGHT_CAP
#else
#define RESIDUAL_BOUND
#endif
#endif

/* The coordinator's FleetNode for one node, minus its constants (l_local = L, expires_at). */
typedef Record {
  bit present;
  byte owner;        /* the member that wrote it: node index + 1 (its instance) */
  byte in_flight;
  byte share;
  byte acked;
  byte nun;          /* unacknowledged grants held, oldest first */
  byte ugen[UMAX];
  byte ushare[UMAX]
};

typedef Node {
  byte phase;
  byte in_flight;
  byte share;        /* the share it enforces */
  byte gen;          /* the generation of the grant it enforces */
  byte hb;           /* heartbeats sent (bounded by HB) */
  bit report;        /* a report in transit (asynchronous model) */
  byte report_in_flight;
  byte report_gen;
  bit grant;         /* a grant reply in transit (asynchronous model) */
  byte grant_share;
  byte grant_gen
#ifdef LOSS
  ;
  bit stale;         /* it enforces a grant issued before the coordinator's last loss */
  bit grant_stale    /* the grant in transit was issued before that loss */
#endif
};

Record rec[N];
byte generation;     /* the key's last issued generation */
#ifdef LOSS
bit lost;            /* within lease_ttl of a loss of the coordinator's state */
#endif
Node node[N];

/* Scratch for the d_steps: assigned before use in every step, so not part of the state. */
hidden byte s_id, s_i, s_k, s_cnt, s_rank, s_probes, s_hungry, s_hrank, s_pool, s_target;
hidden byte s_others, s_res, s_room, s_gs, s_gg, s_sum_share, s_sum_in_flight, s_v, s_next;
hidden byte s_used[GMAX];

inline split(budget, count, r, out) {
  if
  :: count == 0 -> out = 0
  :: else -> out = budget / count + (r < budget % count -> 1 : 0)
  fi
}

inline remove_record(r) {
  rec[r].present = 0;
  rec[r].owner = 0;
  rec[r].in_flight = 0;
  rec[r].share = 0;
  rec[r].acked = 0;
  rec[r].nun = 0;
  for (s_k : 0 .. UMAX - 1) {
    rec[r].ugen[s_k] = 0;
    rec[r].ushare[s_k] = 0
  }
}

/* The coordinator handles node me's report (rin in flight, acking generation rack); the grant
 * is left in s_gs (share) and s_gg (generation). */
inline coordinate(me, rin, rack) {
  s_id = ID(me);
#ifndef BROKEN_TWIN
  if
  :: rec[s_id].present && rec[s_id].owner != me + 1 ->  /* clash: refused, nothing changes */
    s_gs = 0;
    s_gg = rack
  :: else ->
#endif
  if
  :: rec[s_id].present && rec[s_id].owner != me + 1 ->  /* BROKEN_TWIN: taken over afresh */
    remove_record(s_id)
  :: else -> skip
  fi;
  /* 1. Upsert the reporter. */
  rec[s_id].present = 1;
  rec[s_id].owner = me + 1;
  rec[s_id].in_flight = rin;
  s_cnt = 0;
  s_rank = 0;
  for (s_i : 0 .. N - 1) {
    if
    :: rec[s_i].present -> s_cnt++; if :: s_i < s_id -> s_rank++ :: else -> skip fi
    :: else -> skip
    fi
  }
#ifdef BROKEN_STATELESS
  split(L, s_cnt, s_rank, s_gs);
  rec[s_id].share = s_gs;
  generation++;
  s_gg = generation
#else
  if :: rack > rec[s_id].acked -> rec[s_id].acked = rack :: else -> skip fi;
  s_k = 0;
  for (s_i : 0 .. UMAX - 1) {
    if
    :: s_i < rec[s_id].nun && rec[s_id].ugen[s_i] >= rec[s_id].acked ->
      rec[s_id].ugen[s_k] = rec[s_id].ugen[s_i];
      rec[s_id].ushare[s_k] = rec[s_id].ushare[s_i];
      s_k++
    :: else -> skip
    fi
  }
  rec[s_id].nun = s_k;
  for (s_i : 0 .. UMAX - 1) {
    if
    :: s_i >= s_k -> rec[s_id].ugen[s_i] = 0; rec[s_id].ushare[s_i] = 0
    :: else -> skip
    fi
  }
  /* 4. Target (L_global = L). */
#ifdef DEMAND
  s_probes = 0;
  s_hungry = 0;
  s_hrank = 0;
  for (s_i : 0 .. N - 1) {
    if
    :: rec[s_i].present && rec[s_i].in_flight < rec[s_i].share -> s_probes++
    :: rec[s_i].present && rec[s_i].in_flight >= rec[s_i].share ->
      s_hungry++; if :: s_i < s_id -> s_hrank++ :: else -> skip fi
    :: else -> skip
    fi
  }
  if
  :: rec[s_id].in_flight < rec[s_id].share -> s_target = 1
  :: else ->
    s_pool = (L > s_probes -> L - s_probes : 0);
    split(s_pool, s_hungry, s_hrank, s_target)
  fi;
#else
  split(L, s_cnt, s_rank, s_target);
#endif
  /* 5. Cap at what the others reserve. */
  s_others = 0;
  for (s_i : 0 .. N - 1) {
    if
    :: rec[s_i].present && s_i != s_id ->
      s_res = (rec[s_i].share > rec[s_i].in_flight -> rec[s_i].share : rec[s_i].in_flight);
#ifdef HANDOFF
      for (s_k : 0 .. UMAX - 1) {
        if
        :: s_k < rec[s_i].nun && rec[s_i].ushare[s_k] > s_res -> s_res = rec[s_i].ushare[s_k]
        :: else -> skip
        fi
      }
#endif
      s_others = s_others + s_res
    :: else -> skip
    fi
  }
  s_room = (L > s_others -> L - s_others : 0);
  s_gs = (s_target < s_room -> s_target : s_room);
#if defined(LOSS) && !defined(BROKEN_LOSS)
  if :: lost -> s_gs = 0 :: else -> skip fi;   /* within lease_ttl of a loss: nothing */
#endif
  /* 6. Issue. */
  generation = (generation > rec[s_id].acked -> generation : rec[s_id].acked) + 1;
  rec[s_id].share = s_gs;
#ifdef HANDOFF
  assert(rec[s_id].nun < UMAX);
  rec[s_id].ugen[rec[s_id].nun] = generation;
  rec[s_id].ushare[rec[s_id].nun] = s_gs;
  rec[s_id].nun++;
#endif
  s_gg = generation
#endif
#ifndef BROKEN_TWIN
  fi
#endif
}

/* The node stops: it never acts again, holds nothing, and a grant in transit to it is lost. A
 * report it sent may still reach the coordinator. */
inline stop(me) {
  node[me].phase = STOPPED;
  node[me].in_flight = 0;
  node[me].share = 0;
  node[me].gen = 0;
  node[me].hb = 0;
  node[me].grant = 0;
  node[me].grant_share = 0;
  node[me].grant_gen = 0;
#ifdef LOSS
  node[me].stale = 0;
  node[me].grant_stale = 0;
#endif
  skip
}

/* Order-preserving renumbering of every generation the state mentions to 1..k (0, "none",
 * stays 0), as the twin does: generations only meet the protocol through order comparisons and
 * "next = max + 1", so the renumbered state behaves exactly like the original. */
#define MARK(g) assert(g < GMAX); s_used[g] = 1
#define RENUMBER(g) g = s_used[g]

inline normalise() {
  for (s_v : 0 .. GMAX - 1) {
    s_used[s_v] = 0
  }
  MARK(generation);
  for (s_i : 0 .. N - 1) {
    MARK(rec[s_i].acked);
    for (s_k : 0 .. UMAX - 1) {
      MARK(rec[s_i].ugen[s_k])
    }
    MARK(node[s_i].gen);
    MARK(node[s_i].report_gen);
    MARK(node[s_i].grant_gen)
  }
  s_next = 0;
  s_used[0] = 0;
  for (s_v : 1 .. GMAX - 1) {
    if
    :: s_used[s_v] -> s_next++; s_used[s_v] = s_next
    :: else -> skip
    fi
  }
  RENUMBER(generation);
  for (s_i : 0 .. N - 1) {
    RENUMBER(rec[s_i].acked);
    for (s_k : 0 .. UMAX - 1) {
      RENUMBER(rec[s_i].ugen[s_k])
    }
    RENUMBER(node[s_i].gen);
    RENUMBER(node[s_i].report_gen);
    RENUMBER(node[s_i].grant_gen)
  }
}

/* The end of every step: renumber the generations, then check the invariants. */
inline check() {
  normalise();
  s_sum_share = 0;
  s_sum_in_flight = 0;
  for (s_i : 0 .. N - 1) {
    if :: rec[s_i].present -> s_sum_share = s_sum_share + rec[s_i].share :: else -> skip fi;
    s_sum_in_flight = s_sum_in_flight + node[s_i].in_flight
  }
  assert(s_sum_share <= L);              /* GlobalCap */
#ifdef INFLIGHT_CAP
  assert(s_sum_in_flight <= L);          /* InflightCap */
#endif
#ifdef RESIDUAL_BOUND
  assert(s_sum_in_flight <= 2 * L);      /* the residual without handoff is bounded */
#endif
  skip
}

proctype Guard(byte me) {
end:
  do
#ifdef SYNC
  :: d_step {   /* heartbeat: report, coordinator, apply the grant */
      node[me].phase != STOPPED && HB_LEFT(me) ->
      HB_COUNT(me);
      coordinate(me, node[me].in_flight, node[me].gen);
      node[me].phase = RUNNING;
      node[me].share = s_gs;
      node[me].gen = s_gg;
#ifdef LOSS
      node[me].stale = 0;
#endif
      check()
    }
#else
  :: d_step {   /* send: snapshot in_flight and the enforced generation */
      node[me].phase != STOPPED && HB_LEFT(me) && !node[me].report && !node[me].grant ->
      HB_COUNT(me);
      node[me].phase = RUNNING;
      node[me].report = 1;
      node[me].report_in_flight = node[me].in_flight;
      node[me].report_gen = node[me].gen;
      check()
    }
  :: d_step {   /* process: the coordinator runs on the snapshot */
      node[me].report ->
      coordinate(me, node[me].report_in_flight, node[me].report_gen);
      node[me].report = 0;
      node[me].report_in_flight = 0;
      node[me].report_gen = 0;
      if
      :: node[me].phase != STOPPED ->
        node[me].grant = 1;
        node[me].grant_share = s_gs;
        node[me].grant_gen = s_gg;
#ifdef LOSS
        node[me].grant_stale = 0;
#endif
        skip
      :: else -> skip
      fi;
      check()
    }
  :: d_step {   /* deliver: the node enforces the grant */
      node[me].grant ->
      node[me].share = node[me].grant_share;
      node[me].gen = node[me].grant_gen;
      node[me].grant = 0;
      node[me].grant_share = 0;
      node[me].grant_gen = 0;
#ifdef LOSS
      node[me].stale = node[me].grant_stale;
      node[me].grant_stale = 0;
#endif
      check()
    }
#endif
  :: d_step {   /* acquire */
      node[me].phase == RUNNING && node[me].in_flight < node[me].share ->
      node[me].in_flight++;
      check()
    }
  :: d_step {   /* release */
      node[me].in_flight > 0 ->
      node[me].in_flight--;
      check()
    }
  :: d_step {   /* leave: graceful, its own record goes at once (idempotent) */
      node[me].phase == RUNNING && node[me].in_flight == 0 ->
      if :: OWNS(me) -> remove_record(ID(me)) :: else -> skip fi;
      stop(me);
      check()
    }
  :: d_step {   /* crash: the record stays until it expires */
      node[me].phase == RUNNING ->
      stop(me);
      check()
    }
  :: d_step {   /* expire: a stopped node's lease lapses */
      node[me].phase == STOPPED && rec[ID(me)].present && rec[ID(me)].owner == me + 1 ->
      remove_record(ID(me));
      check()
    }
  od
}

#ifdef LOSS
/* The coordinator's own steps: it loses its state; lease_ttl later it recovers. */
proctype Coordinator() {
  byte c;
end:
  do
  :: d_step {   /* lose: every record and the generation; the nodes keep what they hold */
      true ->
      for (c : 0 .. N - 1) {
        remove_record(c);
        if :: node[c].phase == RUNNING -> node[c].stale = 1 :: else -> skip fi;
        if :: node[c].grant -> node[c].grant_stale = 1 :: else -> skip fi
      }
      generation = 0;
      lost = 1;
      check()
    }
  :: d_step {   /* recover: lease_ttl since the loss */
      lost ->
      lost = 0;
      for (c : 0 .. N - 1) {
        node[c].in_flight = 0;
        if :: node[c].stale -> node[c].share = 0 :: else -> skip fi;
        if :: node[c].grant_stale -> node[c].grant_share = 0 :: else -> skip fi;
        node[c].stale = 0;
        node[c].grant_stale = 0
      }
      check()
    }
  od
}
#endif

init {
  byte n;
  atomic {
    for (n : 0 .. N - 1) {
      run Guard(n)
    }
#ifdef LOSS
    run Coordinator()
#endif
  }
}
