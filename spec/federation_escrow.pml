/* federation_escrow.pml: federation's escrow protocol, for spin.
 *
 * The same protocol as src/core/escrow.cpp (sluice::lease, reconcile, escrow_expiry, add_grant,
 * spend, relinquish) and its exhaustive twin tests/model/federation_model_test.cpp: N = 2
 * regions share one key of L units per window of P ticks. One global clock t (0 .. T - 1) is
 * the coordinator's; region i reads t + i (a constant skew; -DCALLER_CLOCKS below: t + d[i]).
 * Windows are numbered from 1 (0: none), so "no window" sorts before every window.
 *
 * The coordinator's ledger, rule for rule as the core (the spec is fixed, min_window_left 0):
 * the window is the one t falls in, a new one starts with the whole budget and forgets its
 * grants; a window at or before the origin window (the one a state loss happened in) is spent;
 * a grant is min(B, left, taper), taper = max(1, ceil(left / (2 x regions))) with regions the
 * regions granted in this window, the asker included (-DNEED: every lease needs the whole
 * batch: with less than B left nothing is granted, else never less than B); reconcile(region, window, total) keeps a
 * running total per region and window: a repeat or an older window changes nothing, and while
 * the window is current the new units go back into its budget (capped by what the region was
 * granted there and has not given back), once it has ended they are only forfeited.
 *
 * Each region, in every interleaving: send (a lease request, when it has nothing usable and none
 * outstanding, noting its clock), process (the coordinator decides it, not during an outage; the
 * reply's expiry on the region's clock is the send time plus what was left of the window when
 * the coordinator decided), drop (during an outage a request or a reply in transit is lost),
 * deliver (add_grant: a newer window replaces the escrow and what is left of the old one is
 * reconciled for its window; the same window adds and keeps the later expiry; an older window
 * is lost), spend (one unit before the expiry on the region's clock: an admission, counted in
 * the real window t is in), expire (past the expiry the units are relinquished and a reconcile
 * with the window's running total is sent). The network holds up to NET reconciles; any of them
 * may arrive first (reordering), and arrive again later (a duplicate stays in transit); one sent
 * when the network is full pushes out the first slot's (a loss). The world: tick (the clock
 * moves on), outage (the coordinator becomes unreachable or reachable again), loss (the
 * coordinator's state is lost: an empty ledger, the origin window the one t is in).
 *
 * Checked, as assertions at the end of every step: Admitted (the admissions of the real window
 * t is in, t + U with -DCALLER_CLOCKS, never exceed L) and Ledger (granted - returned <= L in
 * the ledger's window).
 *
 * -DCHARGE adds charges after the fact (src/core/federated_key.cpp: charge_key, pay_owed,
 * settle_owed, lease_owed), at most C a real window: charge (one hit: spent from usable escrow
 * when nothing is owed, else owed until the end of the window the region last heard of, or a
 * period from now; what is owed makes the region lease, and its checks wait behind it), and
 * on deliver what is owed is paid first from the grant. What is owed is forgiven once its time
 * has passed on the region's clock, or when the coordinator grants nothing (the window is
 * spent or lost). Admitted then counts what a window spends: its admissions and its paid
 * charges.
 *
 * -DCALLER_CLOCKS: a coordinator with no clock of its own (the etcd backend). Every region's
 * clock is within the stated offset of true time t: region i reads t + d[i], 0 <= d[i] <= U (U
 * ticks, default 1: the coordinator's clock uncertainty, twice the stated offset); the offsets
 * are constant, any in [0, U], chosen at the start. The coordinator's time for a call is c =
 * max(clock_high, s), s the caller's clock when it sent the call and clock_high the ledger's
 * high-water mark, set to c at every lease (and lost with the ledger): the ledger's window is
 * the one c is in, and a reconcile gives back into it while c is before its end. A window with
 * less than U left at c grants nothing (kWindowEnding); the reply carries the window's end E
 * and c, and the expiry on the region's clock is s + (E - c) - U. A state loss's origin window
 * is the one t + U is in (the latest reading any clock can have). Admitted counts by the window
 * t + U is in: a grant of window [S, E) has S <= c <= t + U, and its units are spent at t + d[i]
 * < s + (E - c) - U <= E - U, so t + U < E. (Checked without -DCHARGE.)
 *
 * -DREACH_LIMIT adds the assertion that fewer than L are admitted in a window, which must fail:
 * the whole budget can be admitted, so the model is not vacuous. -DREACH_PAID (with -DCHARGE)
 * asserts that no grant ever pays what a charge owed, which must fail too.
 *
 * Deliberately broken variants spin must catch: -DBROKEN_ESCROW (spend ignores the expiry: escrow
 * survives its window), -DBROKEN_RECONCILE (reconcile forgets the running total: a duplicate
 * gives its units back again), -DBROKEN_RESTART (a coordinator that lost its state does not count
 * its current window as spent), -DBROKEN_CARRY (an ended window's units go back into the current
 * window's budget), -DBROKEN_CHARGE (with -DCHARGE: what a charge owes is counted as spent at
 * once, without a lease), -DBROKEN_UNCERTAINTY (with -DCALLER_CLOCKS: the expiry is s + (E - c),
 * not shortened by U), -DBROKEN_SKEW (with -DCALLER_CLOCKS: the last region's offset is U + 1,
 * outside the bound). -DSKEW_REFUSAL (with -DCALLER_CLOCKS) makes the coordinator refuse a lease
 * when clock_high - s > U (a caller more than U behind); with -DBROKEN_SKEW spin still finds the
 * violation: the clock ahead of the bound is the one that spends a window's budget early.
 * Run: spin -a federation_escrow.pml && gcc -DSAFETY -o pan pan.c && ./pan
 * (tests/spec/run_spin.sh does this in the test suite, the correct model and each variant).
 */
#ifndef N
#define N 2
#endif
#ifndef L
#define L 3
#endif
#ifndef B
#define B 2
#endif
#ifndef P
#define P 2
#endif
#ifndef T
#define T 4
#endif
#ifndef C
#define C 2
#endif
#define NET 2
#ifdef CHARGE
#define NOTHING_OWED(i) (owed[i] == 0) /* a check waits behind what is owed */
#else
#define NOTHING_OWED(i) 1
#endif
#define EXPIRED 0 /* an expiry already passed (all of them behave alike from then on) */
#define WIN (t / P + 1) /* the window t is in */
#ifdef CALLER_CLOCKS
#ifndef U
#define U 1
#endif
#define CLOCK(i) (t + d[i] + 1) /* region i's clock, shifted by 1 so that 0 can mean EXPIRED */
#define NOW s_c /* the coordinator's time for the call in hand */
#define AWIN ((t + U) / P + 1) /* the window admissions are counted in: the one t + U is in */
/* The lowest reading region i's next lease (or the one in transit) can be decided at. */
#define LOW(i) (req[i] -> sent[i] - 1 : t + d[i])
/* The lowest window region i can be granted in from now on (a lower one is at or before the
 * origin). */
#define FLOOR(i) ((clock_high > LOW(i) -> clock_high : LOW(i)) / P + 1)
#else
#define CLOCK(i) (t + i + 1) /* region i's clock, shifted by 1 so that 0 can mean EXPIRED */
#define NOW t
#define AWIN WIN
#define FLOOR(i) WIN
#endif
#define CWIN (NOW / P + 1) /* the window the coordinator's time is in */

byte t;
bit outage;
byte admitted; /* admissions in the window AWIN (the one t is in, or t + U with CALLER_CLOCKS) */
#ifdef CALLER_CLOCKS
byte d[N];      /* region i's clock offset: it reads t + d[i] */
#endif

/* The coordinator: the ledger of the key. */
byte lw;        /* its window; 0: none */
byte lgranted;
byte lreturned;
byte origin;    /* the window of the last state loss; 0: none */
byte rgranted[N];
byte rrel[N];   /* running total given back in window rrelw */
byte rrelw[N];
#ifdef CALLER_CLOCKS
byte clock_high; /* the latest time a lease was decided at; 0 at first (as low as any) */
#endif

/* The regions: escrow, a request and a reply in transit. */
byte ew[N];     /* the escrow's window; 0: none */
byte eexp[N];   /* its expiry on the region's clock */
byte eunits[N];
byte erel[N];   /* running total relinquished in ew */
bit req[N];
byte sent[N];   /* the region's clock when it sent the request */
bit rep[N];
byte rgr[N];    /* the reply's grant, window and expiry */
byte rwin[N];
byte rexp[N];

#ifdef CHARGE
byte charged;   /* charges made in the window t is in */
byte owed[N];   /* hits charged and not yet paid */
byte oexp[N];   /* when what is owed is forgiven, on the region's clock */
#endif

/* The network: reconciles in transit. */
bit mused[NET];
byte mreg[NET];
byte mwin[NET];
byte mtot[NET];
#ifdef CALLER_CLOCKS
byte mclk[NET]; /* the region's clock when it sent the reconcile */
#endif

hidden byte s_pay, s_k, s_left, s_regions, s_taper, s_g, s_before, s_delta, s_held, s_lost, s_w, s_tot;
hidden byte s_c, s_lo, s_j; /* with CALLER_CLOCKS: the coordinator's time; the lowest next one */

inline post(me, w, total) {
  if
  :: !mused[0] -> s_k = 0
  :: mused[0] && !mused[1] -> s_k = 1
  :: else -> s_k = 0 /* full: the first slot's is lost */
  fi;
  mused[s_k] = 1;
  mreg[s_k] = me;
  mwin[s_k] = w;
  mtot[s_k] = total;
#ifdef CALLER_CLOCKS
  mclk[s_k] = CLOCK(me);
#endif
}

inline lease(me) {
#ifdef CALLER_CLOCKS
  s_c = (clock_high > sent[me] - 1 -> clock_high : sent[me] - 1); /* max(clock_high, s) */
  clock_high = s_c;
#endif
  if
  :: lw == 0 || CWIN > lw -> /* roll */
    for (s_k : 0 .. N - 1) {
      if
      :: rgranted[s_k] == 0 && rrelw[s_k] < lw -> rrel[s_k] = 0; rrelw[s_k] = 0 /* forgotten */
      :: else -> skip
      fi;
      rgranted[s_k] = 0
    }
    lw = CWIN;
    lgranted = 0;
    lreturned = 0
  :: else -> skip
  fi;
  s_g = 0;
  if
  :: lw <= origin -> skip /* state lost */
#ifdef CALLER_CLOCKS
  :: lw > origin && lw * P - s_c < U -> skip /* kWindowEnding: less than U of it left */
#endif
  :: else ->
    s_left = L - (lgranted - (lreturned < lgranted -> lreturned : lgranted));
    if
#ifdef NEED
    :: s_left > 0 && s_left < B -> skip /* short: less left than the need (a batch) */
    :: s_left >= B ->
#else
    :: s_left > 0 ->
#endif
      s_regions = (rgranted[me] == 0 -> 1 : 0);
      for (s_k : 0 .. N - 1) {
        if :: rgranted[s_k] > 0 -> s_regions++ :: else -> skip fi
      }
      s_taper = (s_left + 2 * s_regions - 1) / (2 * s_regions);
      if :: s_taper == 0 -> s_taper = 1 :: else -> skip fi;
      s_g = (B < s_left -> B : s_left);
      s_g = (s_taper < s_g -> s_taper : s_g);
#ifdef NEED
      s_g = (s_g < B -> B : s_g); /* never below the need */
#endif
      lgranted = lgranted + s_g;
      rgranted[me] = rgranted[me] + s_g
    :: else -> skip /* spent */
    fi
  fi
}

inline reconcile(me, w, total) {
  if
  :: lw == 0 || w > lw -> skip /* a window never leased */
  :: rrelw[me] > w -> skip /* older than one already reported */
  :: else ->
#ifdef BROKEN_RECONCILE
    s_before = 0;
#else
    s_before = (rrelw[me] == w -> rrel[me] : 0);
#endif
    if
    :: total <= s_before -> skip /* a repeat */
    :: else ->
      s_delta = total - s_before;
      rrelw[me] = w;
      rrel[me] = total;
      if
      :: w == lw && NOW < lw * P -> /* the current window: back into its budget */
        s_held = rgranted[me] - (s_before < rgranted[me] -> s_before : rgranted[me]);
        s_delta = (s_delta < s_held -> s_delta : s_held);
        lreturned = lreturned + s_delta
      :: else -> /* ended: forfeited */
#ifdef BROKEN_CARRY
        if
        :: lw != CWIN -> /* the roll the next lease would do */
          lw = CWIN; lgranted = 0; lreturned = 0;
          for (s_k : 0 .. N - 1) { rgranted[s_k] = 0 }
        :: else -> skip
        fi;
        lreturned = lreturned + s_delta
#else
        skip
#endif
      fi
    fi
  fi
}

/* Values that behave alike from now on become one (as in the twin): the ledger's granted and
 * returned only by their difference (the only thing read); an expiry already passed
 * on the region's clock becomes EXPIRED; empty escrow of an ended window with no reply of that
 * window or an older one coming becomes no escrow (the next grant replaces either, losing
 * nothing). Without -DBROKEN_CARRY also: a ledger whose window has ended becomes empty (the
 * next lease rolls it; a reconcile of it only forfeits), and a region's running total for a
 * window before the ledger's is forgotten (a reconcile of such a window changes nothing).
 * With -DCALLER_CLOCKS the ended window above is one below the lowest window the region can
 * still be granted in (a grant below it would be at or before the origin), and the ledger's
 * window has ended once no lease can be decided in it (every reading a lease can still carry is
 * past it). Also: a reply's expiry already passed becomes EXPIRED; a reconcile in transit that
 * can change nothing (a total of 0, or a window at or before the origin, or before the ledger's)
 * becomes an empty one in its slot; a reconcile's reading at or below clock_high, of a window at
 * or before the one t + U is in, becomes clock_high (its c is clock_high either way, and after a
 * loss it can change nothing); clock_high at or below every reading still to come becomes 0; and
 * a region's running totals shift down (below: a grant with exactly U left expires at s, goes
 * back and is leased again without the clock moving, so the totals would grow without end). */
inline normalise() {
  /* Only granted - returned is ever read: kept as that difference. */
  s_k = (lgranted < lreturned -> lgranted : lreturned);
  lgranted = lgranted - s_k;
  lreturned = lreturned - s_k;
  for (s_k : 0 .. N - 1) {
    if :: eexp[s_k] != EXPIRED && eexp[s_k] <= CLOCK(s_k) -> eexp[s_k] = EXPIRED :: else -> skip fi;
#ifdef CHARGE
    /* settle_owed: past its time, what is owed is forgiven (the core does it lazily, before
     * anything reads it: the same). */
    if :: owed[s_k] > 0 && oexp[s_k] <= CLOCK(s_k) -> owed[s_k] = 0; oexp[s_k] = 0 :: else -> skip fi;
#endif
    if
    :: ew[s_k] != 0 && ew[s_k] < FLOOR(s_k) && eunits[s_k] == 0 && !(rep[s_k] && rwin[s_k] <= ew[s_k]) ->
      ew[s_k] = 0; eexp[s_k] = 0; erel[s_k] = 0
    :: else -> skip
    fi
  }
#ifndef BROKEN_CARRY
#ifdef CALLER_CLOCKS
  s_lo = LOW(0);
  for (s_k : 1 .. N - 1) { if :: LOW(s_k) < s_lo -> s_lo = LOW(s_k) :: else -> skip fi }
#else
  s_lo = t;
#endif
  if
  :: lw != 0 && lw * P <= s_lo -> /* no lease can be decided in it any more */
    lw = 0; lgranted = 0; lreturned = 0;
    for (s_k : 0 .. N - 1) { rgranted[s_k] = 0 }
  :: else -> skip
  fi;
  for (s_k : 0 .. N - 1) {
    if :: rrelw[s_k] < lw || lw == 0 -> rrelw[s_k] = 0; rrel[s_k] = 0 :: else -> skip fi
  }
#endif
#if defined(CALLER_CLOCKS) && !defined(BROKEN_CARRY) && !defined(BROKEN_RECONCILE)
  /* A region's running totals for the ledger's window (one at or before the window t + U is
   * in: after a loss they change nothing), when it holds escrow of that window and has reported
   * in it: a reconcile in transit that is a repeat becomes one of 0, and the region's and the
   * ledger's totals, the ones in transit and what the region was granted there go down
   * together (keeping the grant above 0): only their differences are read. */
  for (s_k : 0 .. N - 1) {
    if
    :: lw != 0 && lw <= AWIN && ew[s_k] == lw && rrelw[s_k] == lw && rgranted[s_k] > 0 ->
      s_lo = (rrel[s_k] < rgranted[s_k] - 1 -> rrel[s_k] : rgranted[s_k] - 1);
      for (s_j : 0 .. NET - 1) {
        if
        :: mused[s_j] && mreg[s_j] == s_k && mwin[s_j] == lw ->
          mtot[s_j] = (mtot[s_j] <= rrel[s_k] -> 0 : mtot[s_j] - s_lo)
        :: else -> skip
        fi
      }
      erel[s_k] = erel[s_k] - s_lo;
      rrel[s_k] = rrel[s_k] - s_lo;
      rgranted[s_k] = rgranted[s_k] - s_lo
    :: else -> skip
    fi
  }
#endif
#ifdef CALLER_CLOCKS
  for (s_k : 0 .. N - 1) {
    if :: rep[s_k] && rexp[s_k] <= CLOCK(s_k) -> rexp[s_k] = EXPIRED :: else -> skip fi
  }
#ifndef BROKEN_CARRY
  for (s_j : 0 .. NET - 1) {
    if
    :: mused[s_j] && (mtot[s_j] == 0 || mwin[s_j] <= origin || (lw != 0 && mwin[s_j] < lw)) ->
      mreg[s_j] = 0; mwin[s_j] = 0; mtot[s_j] = 0; mclk[s_j] = 0
    :: else ->
      if
      :: mused[s_j] && mwin[s_j] <= AWIN && mclk[s_j] <= clock_high -> mclk[s_j] = clock_high + 1
      :: else -> skip
      fi
    fi
  }
#endif
  s_lo = LOW(0);
  for (s_k : 1 .. N - 1) { if :: LOW(s_k) < s_lo -> s_lo = LOW(s_k) :: else -> skip fi }
  for (s_j : 0 .. NET - 1) {
    if
    :: mused[s_j] && mtot[s_j] != 0 && mclk[s_j] - 1 < s_lo -> s_lo = mclk[s_j] - 1
    :: else -> skip
    fi
  }
  if :: clock_high <= s_lo -> clock_high = 0 :: else -> skip fi;
#endif
}

inline check() {
  normalise();
  assert(admitted <= L);            /* Admitted */
#ifdef REACH_LIMIT
  assert(admitted < L);             /* fails: a window's whole budget can be admitted */
#endif
  assert(lgranted <= L + lreturned) /* Ledger */
}

proctype Region(byte me) {
end:
  do
  :: d_step { /* send: it leases when it has nothing usable */
      !req[me] && !rep[me] && (eunits[me] == 0 || eexp[me] == EXPIRED) ->
      req[me] = 1;
      sent[me] = CLOCK(me);
      check()
    }
  :: d_step { /* process: the coordinator decides */
      req[me] && !outage ->
#ifdef SKEW_REFUSAL
      if
      :: clock_high + 1 > sent[me] + U -> s_g = 0 /* refused: clock_high - s > U */
      :: else -> lease(me)
      fi;
#else
      lease(me);
#endif
      req[me] = 0;
      if
      :: s_g > 0 ->
        rep[me] = 1;
        rgr[me] = s_g;
        rwin[me] = lw;
#if defined(CALLER_CLOCKS) && defined(BROKEN_UNCERTAINTY)
        rexp[me] = sent[me] + lw * P - s_c /* s + (E - c): not shortened by U */
#elif defined(CALLER_CLOCKS)
        rexp[me] = sent[me] + lw * P - s_c - U /* s + (E - c) - U */
#else
        rexp[me] = sent[me] + lw * P - t /* escrow_expiry, drift 0 */
#endif
#ifdef CHARGE
      :: else -> owed[me] = 0; oexp[me] = 0 /* spent or lost: what is owed is forgiven */
#else
      :: else -> skip
#endif
      fi;
      sent[me] = 0;
      check()
    }
  :: d_step { /* drop: lost in an outage */
      outage && (req[me] || rep[me]) ->
      req[me] = 0; sent[me] = 0;
      rep[me] = 0; rgr[me] = 0; rwin[me] = 0; rexp[me] = 0;
      check()
    }
  :: d_step { /* deliver: add_grant */
      rep[me] ->
      if
      :: rwin[me] > ew[me] ->
        if :: eunits[me] > 0 -> post(me, ew[me], erel[me] + eunits[me]) :: else -> skip fi;
        ew[me] = rwin[me]; eexp[me] = rexp[me]; eunits[me] = rgr[me]; erel[me] = 0
      :: rwin[me] == ew[me] ->
        eexp[me] = (rexp[me] > eexp[me] -> rexp[me] : eexp[me]);
        eunits[me] = eunits[me] + rgr[me]
      :: else -> skip /* a window already over here: lost */
      fi;
#ifdef CHARGE
      /* pay_owed: what is owed first, from escrow still usable on the region's clock */
      s_pay = 0;
      if
      :: owed[me] > 0 && eunits[me] > 0 && eexp[me] > CLOCK(me) ->
        s_pay = (owed[me] < eunits[me] -> owed[me] : eunits[me]);
        eunits[me] = eunits[me] - s_pay;
        owed[me] = owed[me] - s_pay;
        admitted = admitted + s_pay;
        if :: owed[me] == 0 -> oexp[me] = 0 :: else -> skip fi
      :: else -> skip
      fi;
#ifdef REACH_PAID
      assert(s_pay == 0); /* fails: a grant can pay what a charge owed */
#endif
#endif
      rep[me] = 0; rgr[me] = 0; rwin[me] = 0; rexp[me] = 0;
      check()
    }
  :: d_step { /* spend: one admission */
#ifdef BROKEN_ESCROW
      eunits[me] > 0 && NOTHING_OWED(me) ->
#else
      eunits[me] > 0 && eexp[me] != EXPIRED && NOTHING_OWED(me) ->
#endif
      eunits[me]--;
      admitted++;
      check()
    }
#ifdef CHARGE
  :: d_step { /* charge: one hit after the fact (charge_key) */
      charged < C ->
      charged++;
      if
      :: owed[me] == 0 && eunits[me] > 0 && eexp[me] != EXPIRED ->
        eunits[me]--; /* spent from escrow */
        admitted++
      :: else ->
#ifdef BROKEN_CHARGE
        admitted++ /* counted as spent, no lease */
#else
        if /* owed until the end of the window it last heard of, or a period from now */
        :: owed[me] == 0 && eexp[me] != EXPIRED -> oexp[me] = eexp[me]
        :: owed[me] == 0 && eexp[me] == EXPIRED -> oexp[me] = CLOCK(me) + P
        :: else -> skip
        fi;
        owed[me]++
#endif
      fi;
      check()
    }
#endif
  :: d_step { /* expire: relinquish and reconcile */
      eunits[me] > 0 && eexp[me] == EXPIRED ->
      erel[me] = erel[me] + eunits[me];
      eunits[me] = 0;
      post(me, ew[me], erel[me]);
      check()
    }
  od
}

/* A reconcile in transit (slot k) reaches the coordinator; `keep`: a copy stays in transit. */
inline arrive(k, keep) {
  mused[k] && !outage ->
#ifdef CALLER_CLOCKS
  s_c = (clock_high > mclk[k] - 1 -> clock_high : mclk[k] - 1); /* max(clock_high, s) */
#endif
  s_w = mwin[k];
  s_tot = mtot[k];
  reconcile(mreg[k], s_w, s_tot);
  if
#ifdef CALLER_CLOCKS
  :: !keep -> mused[k] = 0; mreg[k] = 0; mwin[k] = 0; mtot[k] = 0; mclk[k] = 0
#else
  :: !keep -> mused[k] = 0; mreg[k] = 0; mwin[k] = 0; mtot[k] = 0
#endif
  :: else -> skip
  fi;
  check()
}

proctype World() {
end:
  do
  :: d_step { arrive(0, 0) }
  :: d_step { arrive(1, 0) }
  :: d_step { arrive(0, 1) }
  :: d_step { arrive(1, 1) }
  :: d_step { /* tick */
      t + 1 < T ->
      s_w = AWIN; /* the window admissions were counted in */
      t++;
#ifdef CHARGE
      if :: AWIN != s_w -> admitted = 0; charged = 0 :: else -> skip fi;
#else
      if :: AWIN != s_w -> admitted = 0 :: else -> skip fi;
#endif
      check()
    }
  :: d_step { /* outage: starts or ends */
      outage = !outage;
      check()
    }
  :: d_step { /* loss: the coordinator's state is gone */
      lw = 0; lgranted = 0; lreturned = 0;
      for (s_k : 0 .. N - 1) { rgranted[s_k] = 0; rrel[s_k] = 0; rrelw[s_k] = 0 }
#ifdef CALLER_CLOCKS
      clock_high = 0;
#endif
#ifndef BROKEN_RESTART
      origin = AWIN; /* with CALLER_CLOCKS: the window of the latest reading any clock has */
#endif
      check()
    }
  od
}

init {
  byte n;
  atomic {
#ifdef CALLER_CLOCKS
    /* The offsets, any in [0, U]: in ascending order by region (the regions are alike). */
    for (n : 0 .. N - 1) {
      d[n] = (n > 0 -> d[n - 1] : 0);
      do
      :: d[n] < U -> d[n]++
      :: break
      od
    }
#ifdef BROKEN_SKEW
    d[N - 1] = U + 1; /* outside the bound */
#endif
#endif
    for (n : 0 .. N - 1) {
      run Region(n)
    }
    run World()
  }
}
