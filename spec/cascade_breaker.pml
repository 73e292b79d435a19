/* cascade_breaker.pml: one cascade node's circuit breaker and concurrency limit, for spin.
 *
 * The protocol of src/local/circuit_breaker.cpp as src/local/fallback_cascade.cpp drives it:
 * N callers, ITER calls each, on one node with a concurrency limit of LIMIT and a breaker that
 * opens after F failures in a row and lets PROBES probes through at once while half-open. A
 * call: enter the breaker (closed: a load of the state, then of the spell number, two steps;
 * otherwise under the mutex: an open breaker whose spell is over turns half-open, and a
 * half-open one hands out a probe place if one is free), then take a permit of the node's limit
 * (one atomic step); with no room, the breaker's ticket is cancelled (a probe's place given
 * back under the mutex). A call made ends with success, failure or neutral, in any order with
 * the others: the permit is released, then the breaker told. A closed-spell ticket: neutral or a
 * ticket of another spell counts for nothing; a success resets the run of failures (a load,
 * then a store); a failure is a fetch_add, and the one that reaches F locks the mutex and opens
 * the breaker if it is still in that spell. A probe ticket, under the mutex, if of the current
 * spell: gives its place back, then a success closes the breaker after SUCC of them and a
 * failure reopens it. Time passes nondeterministically: an open spell may end at any moment.
 *
 * Checked: Cap (assertions at every admission: the permits held never exceed LIMIT; the probe
 * tickets held of the current half-open spell never exceed PROBES), NoLeak (the final
 * assertion: every permit is back, and a half-open breaker has every probe place free, so it is
 * never stuck refusing every call), and no invalid end state.
 *
 * Two deliberately broken variants spin must catch: -DBROKEN_NO_CANCEL (a probe refused by a
 * full node keeps its place: the breaker can be left half-open with no place free, refusing the
 * node forever), -DBROKEN_STALE_PROBE (a probe's end is counted whatever its spell: a probe of an
 * earlier spell gives back a place of the current one, letting one probe too many through; run
 * with -DLIMIT=3, since a limit of 2 would itself stop the third probe -- which is the point of
 * probes taking the node's permits).
 * tests/spec/run_spin.sh runs them in the test suite.
 */
#ifndef N
#define N 3
#endif
#ifndef ITER
#define ITER 2
#endif
#ifndef LIMIT
#define LIMIT 2
#endif
#ifndef F
#define F 2
#endif
#define PROBES 2
#define SUCC 1

#define CLOSED 0
#define OPEN 1
#define HALF 2

#define REFUSED 0
#define NORMAL 1
#define PROBE 2

byte state = CLOSED;
byte spell = 0;       /* bumped at every state change */
byte failures = 0;    /* in a row, while closed */
byte probes = 0;      /* probe places taken in this half-open spell */
byte probe_ok = 0;
bool spell_over = false;  /* an open spell's time is up */
byte held = 0;        /* permits of the node's limit held */
byte kind[N];         /* each caller's ticket: REFUSED (none), NORMAL, PROBE */
byte tspell[N];       /* its spell */
byte finished = 0;

/* The probe tickets held of the current spell: at most PROBES. */
inline check_probes() {
  k = 0; c = 0;  /* (locals are declared once per process, so set here) */
  do
  :: k < N -> if :: kind[k] == PROBE && tspell[k] == spell -> c++ :: else -> skip fi; k++
  :: else -> break
  od;
  assert(c <= PROBES)
}

inline open_breaker() {
  state = OPEN; spell++; failures = 0; spell_over = false
}

proctype Caller(byte me) {
  byte i = 0, st, f, outcome, k, c;
  bool ok;
  do
  :: i < ITER ->
    i++;
    /* enter */
    st = state;
    if
    :: st == CLOSED -> kind[me] = NORMAL; tspell[me] = spell
    :: else ->
      atomic {
        if
        :: state == CLOSED -> kind[me] = NORMAL; tspell[me] = spell
        :: state == OPEN && !spell_over -> kind[me] = REFUSED
        :: else ->
          if
          :: state == OPEN -> state = HALF; spell++; probes = 0; probe_ok = 0
          :: else -> skip
          fi;
          if
          :: probes < PROBES -> probes++; kind[me] = PROBE; tspell[me] = spell; check_probes()
          :: else -> kind[me] = REFUSED
          fi
        fi
      }
    fi;
    if
    :: kind[me] == REFUSED -> goto next
    :: else -> skip
    fi;
    /* the node's permit */
    atomic {
      ok = (held < LIMIT);
      if :: ok -> held++; assert(held <= LIMIT) :: else -> skip fi
    }
    if
    :: !ok ->
      /* cancel: a probe gives its place back */
#ifndef BROKEN_NO_CANCEL
      atomic {
        if
        :: kind[me] == PROBE && tspell[me] == spell && probes > 0 -> probes--
        :: else -> skip
        fi;
        kind[me] = REFUSED  /* the ghost, with the place */
      }
#else
      kind[me] = REFUSED;
#endif
      goto next
    :: else -> skip
    fi;
    /* the call ends: success (0), failure (1) or neutral (2); the permit goes back */
    if :: outcome = 0 :: outcome = 1 :: outcome = 2 fi;
    atomic { held-- }
    if
    :: kind[me] == NORMAL ->
      if
      :: outcome == 2 || spell != tspell[me] -> skip
      :: else ->
        if
        :: outcome == 0 ->
          f = failures;
          if :: f != 0 -> failures = 0 :: else -> skip fi
        :: outcome == 1 ->
          atomic { failures++; f = failures }
          if
          :: f >= F ->
            atomic {
              if
              :: state == CLOSED && spell == tspell[me] && failures >= F -> open_breaker()
              :: else -> skip
              fi
            }
          :: else -> skip
          fi
        fi
      fi
    :: kind[me] == PROBE ->
      atomic {
#ifndef BROKEN_STALE_PROBE
        if
        :: spell == tspell[me] ->
#endif
          if :: probes > 0 -> probes-- :: else -> skip fi
#ifndef BROKEN_STALE_PROBE
        :: else -> skip
        fi
#endif
        ;
        if
        :: spell != tspell[me] || outcome == 2 -> skip
        :: else ->
          if
          :: outcome == 1 -> open_breaker()
          :: else ->
            probe_ok++;
            if
            :: probe_ok >= SUCC -> failures = 0; spell++; state = CLOSED
            :: else -> skip
            fi
          fi
        fi;
        kind[me] = REFUSED  /* the ghost, with the place */
      }
    fi;
    kind[me] = REFUSED;
next:
    skip
  :: else -> break
  od;
  finished++
}

/* Time: an open spell may be over at any moment. */
proctype Clock() {
end:
  do
  :: state == OPEN && !spell_over -> spell_over = true
  od
}

init {
  byte k;
  atomic {
    k = 0;
    do
    :: k < N -> run Caller(k); k++
    :: else -> break
    od;
    run Clock()
  }
  finished == N;
  assert(held == 0);
  assert(state != HALF || probes == 0)
}
