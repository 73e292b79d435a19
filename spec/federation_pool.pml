/* federation_pool.pml: federation's regional pool (fail-closed mode), for spin.
 *
 * The pool rules of src/core/escrow.cpp (sluice::pool_take, pool_refill, pool_release,
 * pool_expiry, taken_expiry) and FederatedLimiter's use of them (lease_through_pool, on_lease,
 * forfeit), beside the escrow protocol of federation_escrow.pml; the exhaustive twin is
 * tests/model/federation_pool_model_test.cpp. Two processes of one region share a pool of one
 * key of L units per window of P ticks. One global clock t (0 .. T - 1) is the coordinator's; the
 * pool reads t + 1, process 0 reads t + 2, process 1 reads t + 3 (constant skews, all shifted so
 * that 0 can mean EXPIRED). Windows are numbered from 1 (0: none).
 *
 * The coordinator's ledger is federation_escrow.pml's for one region (the processes lease as
 * their region; what they give up goes back to the pool, never to the coordinator): a new window
 * starts with the whole budget, a window at or before the origin window (a state loss) is spent,
 * a grant is min(ask, left, taper), taper = max(1, ceil(left / 2)).
 *
 * The pool (times on its clock): P1 take(want) grants min(want, balance) before the expiry and
 * makes the asker the refiller if it is left short and no refill is in flight (for HOLD ticks);
 * P2 refill(w, units, expiry) ends the refill in flight and adds the units unless w is older than
 * the pool's window or the expiry has passed (a later w replaces the balance); P3 release(w,
 * units) takes them back only for the pool's window before its expiry.
 *
 * Each process, in every interleaving, every message taking its time (the clock may tick between
 * a request and its processing and between a reply and its delivery): take (when it has nothing
 * usable: pool_take(1), noting its clock), pool-take, taken (what the pool granted joins the
 * escrow until taken_expiry = send time + the pool's time left; a process left short leases 1
 * from the coordinator, RB as the refiller, keeping the pool's reading and the time it saw it),
 * lease (the coordinator decides), leased (a process that is not the refiller adds the grant,
 * escrow_expiry from the lease's send time; the refiller keeps 1 and refills the pool with the
 * rest at pool_expiry = pool reading + (escrow expiry - seen), or sends refill(0) when nothing
 * is left over), refill (the pool decides), refilled (what the pool accepted leaves the
 * refiller's grant, the rest joins its escrow), spend (one admission before the expiry on its
 * clock), expire (past it, the units are released to the pool; so is what is left of an older
 * window when a later one's units arrive), release (the pool decides). The world: tick.
 *
 * Failures, each behind a flag (together they make the space too big for the suite's seconds):
 * -DLOSSY, any message may be lost (an outage of the pool or of the coordinator, or a call that
 * failed before it was applied): a lost take makes the process lease 1 directly, a lost refill
 * leaves the refiller its whole grant (the limiter's rule on a failed refill), a lost lease
 * ends the refill in flight with refill(0), a lost release is forfeited; -DLOSSES, a process
 * restarts (it loses its escrow and what it waited for) and the pool loses its state;
 * -DCOORD_LOSS, the coordinator loses its state (an empty ledger, the origin window the current
 * one).
 *
 * Checked, as an assertion at the end of every step: Admitted (the admissions of the real window
 * t is in never exceed L).
 *
 * -DREACH_LIMIT adds the assertion that fewer than L are admitted in a window, which must fail
 * (the model is not vacuous); -DREACH_POOL asserts that no unit taken from the pool is ever
 * spent, which must fail too.
 *
 * Deliberately broken variants spin must catch: -DBROKEN_PAST_EXPIRY (fail-closed serves the
 * pool past its expiry, as regional-only does), -DBROKEN_REFILL_FROM_TAKE (the refill's expiry
 * counts the time left from the take's send time, not from when the pool's reading was seen),
 * -DBROKEN_REFILL_AS_POOL_TIME (the escrow's expiry stamped on the pool as if it were pool
 * time), -DBROKEN_TAKER_FROM_RECEIPT (a taker's expiry counts from when the take's reply
 * arrived), -DBROKEN_RELEASE_LATER (a release is accepted into a later window than its units').
 *
 * -DREFILL_TIMEOUT lets a refill's reply be lost after the pool applied it (a call that timed
 * out); the refiller then gives up what it sent, as the limiter does on any failed refill (had
 * it kept its grant, the units would be both in the pool and in its escrow: a window went over).
 */
#ifndef L
#define L 3
#endif
#ifndef RB
#define RB 2 /* the regional batch */
#endif
#ifndef P
#define P 2
#endif
#ifndef T
#define T 4
#endif
#ifndef HOLD
#define HOLD 2
#endif
#define NP 2
#define EXPIRED 0
#define WIN (t / P + 1)
#define PCLOCK (t + 1)
#define CLOCK(i) (t + 2 + i)

/* phases */
#define IDLE 0
#define TAKE_SENT 1
#define TAKE_REPLY 2
#define LEASE_SENT 3
#define LEASE_REPLY 4
#define REFILL_SENT 5
#define REFILL_REPLY 6

byte t;
byte admitted;  /* admissions in the window t is in */

/* The coordinator's ledger. */
byte lw;
byte lgranted;
byte origin;

/* The pool. */
byte pw;        /* its window; 0: none */
byte pexp;      /* its expiry on the pool's clock; EXPIRED: passed */
byte pbal;
byte prefill;   /* a refill is in flight until then (pool clock); 0: none */

/* The processes. */
byte ew[NP];
byte eexp[NP];
byte eunits[NP];
bit epool[NP];  /* some of the escrow was taken from the pool (REACH_POOL) */
byte phase[NP];
byte sent[NP];  /* the take's (or a direct lease's) send time */
bit refiller[NP];
byte pnow[NP];  /* refiller: the pool's reading, and when it was seen */
byte seen[NP];
byte gr[NP];    /* the reply in transit, or the grant kept aside during a refill */
byte gw[NP];
byte gexp[NP];  /* take: taken_expiry (BROKEN_TAKER_FROM_RECEIPT: the pool's time left) */
byte gnow[NP];  /* take: the pool's reading */
bit gflag[NP];  /* take: the reply makes it the refiller; refill: accepted */
byte extra[NP];
byte fexp[NP];  /* refill: its expiry on the pool's clock */
byte relw[NP];  /* a release in transit; 0: none */
byte relu[NP];

hidden byte s_a, s_g, s_left, s_taper, s_x, s_w;

inline lease() { /* asks for s_a */
  if
  :: lw == 0 || WIN > lw -> lw = WIN; lgranted = 0
  :: else -> skip
  fi;
  s_g = 0;
  if
  :: lw <= origin -> skip /* state lost */
  :: else ->
    s_left = L - lgranted;
    s_taper = (s_left + 1) / 2;
    if :: s_taper == 0 -> s_taper = 1 :: else -> skip fi;
    s_g = (s_a < s_left -> s_a : s_left);
    s_g = (s_taper < s_g -> s_taper : s_g);
    lgranted = lgranted + s_g
  fi
}

/* The process gives up its escrow, back to the pool (a newer release pushes out the older). */
inline release_escrow(me) {
  if
  :: eunits[me] > 0 -> relw[me] = ew[me]; relu[me] = eunits[me]; eunits[me] = 0; epool[me] = 0
  :: else -> skip
  fi
}

/* on_lease / add_grant: `n` units of window `w` usable until `x` on the process's clock. */
inline add_units(me, n, w, x) {
  if
  :: n == 0 -> skip
  :: n > 0 && w > ew[me] ->
    release_escrow(me);
    ew[me] = w; eexp[me] = x; eunits[me] = n
  :: n > 0 && w == ew[me] ->
    eexp[me] = (x > eexp[me] -> x : eexp[me]);
    eunits[me] = eunits[me] + n
  :: else -> skip /* a window already over here: lost */
  fi
}

/* The refiller's lease is over (`n` granted of `w`, escrow expiry `x`): it keeps 1 and sends
 * the rest to the pool, or refill(0) to end the refill in flight. */
inline after_lease(me, n, w, x) {
  phase[me] = REFILL_SENT;
  gr[me] = n; gw[me] = w; gexp[me] = x;
  extra[me] = (n > 1 -> n - 1 : 0);
  fexp[me] = 0;
  if
  :: extra[me] > 0 ->
#if defined(BROKEN_REFILL_FROM_TAKE)
    s_x = sent[me];
#else
    s_x = seen[me];
#endif
#ifdef BROKEN_REFILL_AS_POOL_TIME
    fexp[me] = x
#else
    fexp[me] = pnow[me] + (x > s_x -> x - s_x : 0) /* pool_expiry, drift 0 */
#endif
  :: else -> skip
  fi
}

inline clear(me) {
  phase[me] = IDLE; sent[me] = 0; refiller[me] = 0; pnow[me] = 0; seen[me] = 0;
  gr[me] = 0; gw[me] = 0; gexp[me] = 0; gnow[me] = 0; gflag[me] = 0; extra[me] = 0; fexp[me] = 0
}

/* The refill call is over: units the pool accepted leave the grant, the rest is kept. */
inline after_refill(me, accepted) {
  s_g = (accepted -> gr[me] - extra[me] : gr[me]);
  s_w = gw[me];
  s_x = gexp[me];
  clear(me);
  add_units(me, s_g, s_w, s_x)
}

/* Values that behave alike from now on become one: passed expiries, a refill hold that is
 * over, a ledger whose window has ended (the next lease rolls it). */
inline normalise() {
  if :: pexp != EXPIRED && pexp <= PCLOCK -> pexp = EXPIRED :: else -> skip fi;
  if :: prefill != 0 && prefill <= PCLOCK -> prefill = 0 :: else -> skip fi;
  if :: lw != 0 && lw < WIN -> lw = 0; lgranted = 0 :: else -> skip fi;
  if :: eexp[0] != EXPIRED && eexp[0] <= CLOCK(0) -> eexp[0] = EXPIRED :: else -> skip fi;
  if :: eexp[1] != EXPIRED && eexp[1] <= CLOCK(1) -> eexp[1] = EXPIRED :: else -> skip fi
}

inline check() {
  normalise();
  assert(admitted <= L); /* Admitted */
#ifdef REACH_LIMIT
  assert(admitted < L);
#endif
}

proctype Proc(byte me) {
end:
  do
  :: d_step { /* take: it leases when it has nothing usable, through the pool */
      phase[me] == IDLE && (eunits[me] == 0 || eexp[me] == EXPIRED) ->
      phase[me] = TAKE_SENT;
      sent[me] = CLOCK(me);
      check()
    }
  :: d_step { /* pool-take: P1 */
      phase[me] == TAKE_SENT ->
#ifdef BROKEN_PAST_EXPIRY
      s_g = (pbal > 0 -> 1 : 0);
#else
      s_g = (pbal > 0 && PCLOCK < pexp -> 1 : 0);
#endif
      pbal = pbal - s_g;
      gr[me] = s_g;
      gw[me] = (s_g > 0 -> pw : 0);
      gflag[me] = 0;
      gnow[me] = 0;
      if
      :: s_g == 0 && PCLOCK >= prefill -> gflag[me] = 1; gnow[me] = PCLOCK; prefill = PCLOCK + HOLD
      :: else -> skip
      fi;
      gexp[me] = 0;
      if
      :: s_g > 0 ->
#ifdef BROKEN_TAKER_FROM_RECEIPT
        gexp[me] = (pexp > PCLOCK -> pexp - PCLOCK : 0)
#else
        gexp[me] = sent[me] + (pexp > PCLOCK -> pexp - PCLOCK : 0) /* taken_expiry */
#endif
      :: else -> skip
      fi;
      phase[me] = TAKE_REPLY;
      check()
    }
  :: d_step { /* taken */
      phase[me] == TAKE_REPLY ->
      if
      :: gr[me] > 0 ->
#if defined(BROKEN_TAKER_FROM_RECEIPT)
        s_x = CLOCK(me) + gexp[me];
#elif defined(BROKEN_PAST_EXPIRY)
        s_x = (gexp[me] > CLOCK(me) + P -> gexp[me] : CLOCK(me) + P); /* as regional-only */
#else
        s_x = gexp[me];
#endif
        /* on_lease: units of an older window join the escrow's window */
        s_w = (gw[me] > ew[me] -> gw[me] : ew[me]);
        add_units(me, gr[me], s_w, s_x);
        epool[me] = 1;
        clear(me)
      :: else ->
        s_x = gflag[me];
        s_w = gnow[me];
        s_g = sent[me];
        clear(me);
        phase[me] = LEASE_SENT;
        if
        :: s_x -> refiller[me] = 1; pnow[me] = s_w; seen[me] = CLOCK(me);
#ifdef BROKEN_REFILL_FROM_TAKE
          sent[me] = s_g
#else
          skip
#endif
        :: else -> sent[me] = CLOCK(me) /* the lease goes out now */
        fi
      fi;
      check()
    }
  :: d_step { /* lease: the coordinator decides */
      phase[me] == LEASE_SENT ->
      s_a = (refiller[me] -> RB : 1);
      lease();
      gr[me] = s_g;
      gw[me] = (s_g > 0 -> lw : 0);
      /* escrow_expiry, drift 0: from the lease's send time (the refiller's: when it saw the
       * take's reply; a direct lease's: when the take failed, its `sent`) */
      s_x = (refiller[me] -> seen[me] : sent[me]);
      gexp[me] = (s_g > 0 -> s_x + lw * P - t : 0);
      phase[me] = LEASE_REPLY;
      check()
    }
  :: d_step { /* leased */
      phase[me] == LEASE_REPLY ->
      if
      :: refiller[me] -> after_lease(me, gr[me], gw[me], gexp[me])
      :: else ->
        s_g = gr[me]; s_w = gw[me]; s_x = gexp[me];
        clear(me);
        add_units(me, s_g, s_w, s_x)
      fi;
      check()
    }
  :: d_step { /* refill: P2 */
      phase[me] == REFILL_SENT ->
      prefill = 0;
      gflag[me] = 0;
      if
      :: extra[me] > 0 && PCLOCK < fexp[me] && gw[me] >= pw ->
        if
        :: gw[me] > pw -> pw = gw[me]; pexp = fexp[me]; pbal = 0
        :: else -> pexp = (fexp[me] > pexp -> fexp[me] : pexp)
        fi;
        pbal = pbal + extra[me];
        gflag[me] = 1
      :: else -> skip
      fi;
      phase[me] = REFILL_REPLY;
      check()
    }
  :: d_step { /* refilled */
      phase[me] == REFILL_REPLY ->
      after_refill(me, gflag[me]);
      check()
    }
  :: d_step { /* spend: one admission */
      eunits[me] > 0 && eexp[me] != EXPIRED ->
#ifdef REACH_POOL
      assert(!epool[me]);
#endif
      eunits[me]--;
      admitted++;
      check()
    }
  :: d_step { /* expire: give the escrow back to the pool */
      eunits[me] > 0 && eexp[me] == EXPIRED ->
      release_escrow(me);
      check()
    }
  :: d_step { /* release: P3 */
      relw[me] != 0 ->
#ifdef BROKEN_RELEASE_LATER
      s_w = (pw > relw[me] -> pw : relw[me]);
#else
      s_w = relw[me];
#endif
      if
      :: s_w == pw && PCLOCK < pexp -> pbal = pbal + relu[me]
      :: else -> skip
      fi;
      relw[me] = 0; relu[me] = 0;
      check()
    }
#ifdef LOSSY
  :: d_step { /* drop: the pool fails a take (lease 1 directly) */
      (phase[me] == TAKE_SENT || phase[me] == TAKE_REPLY) ->
      clear(me);
      phase[me] = LEASE_SENT;
      sent[me] = CLOCK(me);
      check()
    }
  :: d_step { /* drop: the coordinator fails a lease */
      (phase[me] == LEASE_SENT || phase[me] == LEASE_REPLY) ->
      if
      :: refiller[me] -> after_lease(me, 0, 0, 0)
      :: else -> clear(me)
      fi;
      check()
    }
  :: d_step { /* drop: the pool fails a refill (the refiller gives up what it sent: the call
              * may have been applied) */
      phase[me] == REFILL_SENT ->
      after_refill(me, 1);
      check()
    }
#endif
#ifdef REFILL_TIMEOUT
  :: d_step { /* a refill the pool applied whose reply comes too late: taken as failed, what
              * it sent given up */
      phase[me] == REFILL_REPLY ->
      after_refill(me, 1);
      check()
    }
#endif
#ifdef LOSSY
  :: d_step { /* drop: a release is lost */
      relw[me] != 0 ->
      relw[me] = 0; relu[me] = 0;
      check()
    }
#endif
#ifdef LOSSES
  :: d_step { /* restart: escrow and whatever it waited for are gone */
      phase[me] != IDLE || ew[me] != 0 ->
      clear(me);
      ew[me] = 0; eexp[me] = 0; eunits[me] = 0; epool[me] = 0;
      check()
    }
#endif
  od
}

proctype World() {
end:
  do
  :: d_step { /* tick */
      t + 1 < T ->
      if :: (t + 1) / P != t / P -> admitted = 0 :: else -> skip fi;
      t++;
      check()
    }
#ifdef COORD_LOSS
  :: d_step { /* the coordinator's state is lost */
      lw = 0; lgranted = 0; origin = WIN; check()
    }
#endif
#ifdef LOSSES
  :: d_step { /* the pool's state is lost */
      pw = 0; pexp = EXPIRED; pbal = 0; prefill = 0; check()
    }
#endif
  od
}

init {
  atomic {
    run Proc(0);
    run Proc(1);
    run World()
  }
}
