/* shared_rate_loss.pml: a shared rate limit's key through losses of the coordinator's state, for
 * spin.
 *
 * The rule of sluice/core/shared_rate.h (apply: raise) and its exhaustive twin
 * tests/model/shared_rate_model_test.cpp: one key at one coordinator, which serialises every call
 * (how many servers send them does not matter). Time is ticks 0 .. MAXT on the coordinator's
 * clock. The key's rule is GCRA of one hit every E ticks with a burst of B (admit at t iff
 * max(tat, t) + E <= t + B x E; then tat = max(tat, t) + E), or with -DFIXED a fixed window of L
 * hits per P ticks.
 *
 * The coordinator's storage holds the key's state and when it was last written. In every order:
 *   check     a check of one hit at t: the state, raised first when it was written at or before
 *             the origin (GCRA: tat >= origin + B x E, a whole burst spent at the origin; fixed:
 *             the origin's window counted full), decides it; an admission writes it;
 *   tick      t moves on;
 *   snapshot  the storage is saved (an RDB snapshot, what an AOF had synced);
 *   restore   the storage goes back to the last snapshot, and the coordinator finds it has lost
 *             writes (a restart that reloads it, a failover to a replica): the origin is t;
 *   empty     the storage is lost entirely (a restart without persistence): the origin is t.
 * Checked at every admission: a limiter that never lost anything, fed the same admissions at
 * the same times, admits it too (GCRA: the admitted sequence conforms; fixed: no window admits
 * more than L).
 *
 * -DREACH_LIMIT asserts that the exact limiter is never at its limit after an admission, which
 * must fail: the bound is reached, so the model is not vacuous. -DBROKEN_RAISE leaves out the
 * raise: spin must find an admission the exact limiter refuses.
 */

#ifndef MAXT
#define MAXT 7
#endif
#ifndef E
#define E 2
#endif
#ifndef B
#define B 2
#endif
#ifndef L
#define L 2
#endif
#ifndef P
#define P 3
#endif
#define NONE 255

byte t = 0;
byte origin = NONE;       /* NONE: no loss known */
/* The storage: the state and when it was written (NONE: never). */
byte tat = NONE;          /* GCRA: the theoretical arrival time; NONE: never used */
byte ws = NONE;           /* fixed: the window start; NONE: none */
byte count = 0;
byte written = NONE;
/* The last snapshot of it. */
byte s_tat = NONE;
byte s_ws = NONE;
byte s_count = 0;
byte s_written = NONE;
/* The exact limiter, which never loses anything. */
byte e_tat = NONE;
byte e_ws = NONE;
byte e_count = 0;

inline max2(a, b, out) {
  if
  :: a == NONE -> out = b
  :: a != NONE && a >= b -> out = a
  :: a != NONE && a < b -> out = b
  fi
}

inline raise() {
#ifdef BROKEN_RAISE
  skip
#else
  if
  :: origin != NONE && (written == NONE || written <= origin) ->
#ifdef FIXED
     if
     :: ws == (origin / P) * P -> count = L
     :: ws == NONE || ws < (origin / P) * P -> ws = (origin / P) * P; count = L
     :: else -> skip
     fi
#else
     spent = origin + B * E;
     if
     :: tat == NONE || tat < spent -> tat = spent
     :: else -> skip
     fi
#endif
  :: else -> skip
  fi
#endif
}

inline check() {
  raise();
#ifdef FIXED
  if
  :: ws == (t / P) * P -> admit = (count + 1 <= L)
  :: else -> admit = true
  fi;
  if
  :: admit ->
     if
     :: ws == (t / P) * P -> count++
     :: else -> ws = (t / P) * P; count = 1
     fi;
     written = t;
     /* the exact limiter */
     if
     :: e_ws == (t / P) * P -> e_count++
     :: else -> e_ws = (t / P) * P; e_count = 1
     fi;
     assert(e_count <= L);
#ifdef REACH_LIMIT
     assert(e_count < L);
#endif
  :: else -> skip
  fi
#else
  max2(tat, t, base);
  admit = (base + E <= t + B * E);
  if
  :: admit ->
     tat = base + E;
     written = t;
     /* the exact limiter: the same admission must conform */
     max2(e_tat, t, base);
     assert(base + E <= t + B * E);
     e_tat = base + E;
#ifdef REACH_LIMIT
     assert(e_tat < t + B * E);
#endif
  :: else -> skip
  fi
#endif
}

active proctype world() {
  byte base, spent;
  bool admit;
  do
  :: atomic { check() }
  :: atomic { t < MAXT -> t++ }
  :: atomic { s_tat = tat; s_ws = ws; s_count = count; s_written = written }
  :: atomic { tat = s_tat; ws = s_ws; count = s_count; written = s_written; origin = t }
  :: atomic { tat = NONE; ws = NONE; count = 0; written = NONE; origin = t }
  :: t == MAXT -> break
  od
}
