/* gateway_queue.pml: the gateway's admission protocol, for spin.
 *
 * The same protocol as src/local/gateway.cpp and its exhaustive twin
 * tests/model/gateway_model_test.cpp: N callers, ITER calls each, through a tenant level, an
 * upstream pool with the queue strategy and a route level. Each level is a fetch_add-then-check
 * semaphore (one atomic step, a separate rollback step when refused). A refused pool takes the
 * slow path: lock, waiters++, retry when the queue is empty, else queue (or reject when full),
 * and drain before unlocking. Every decrement of the pool's count (a release, or the rollback
 * of a refused claim) is followed by a read of `waiters` and, if non-zero, a drain of the queue
 * under the lock, which takes each served waiter's route on its behalf.
 *
 * Checked: Cap (assertions: admitted holders of a level never exceed its max, at the instant of
 * every admission), Progress (no invalid end state: no caller is left waiting forever, i.e. no
 * lost wake-up), NoLeak (the final assertion: every count is back at zero).
 *
 * Two deliberately broken variants spin must catch (a stranded waiter): -DBROKEN_EARLY_READ
 * makes a releaser read `waiters` before giving its unit back; -DBROKEN_SILENT_ROLLBACK makes a
 * refused claim roll back without reading `waiters` (a refused acquirer's transient increment
 * can make the pool look full to an arrival whose releaser already left). Run: spin -a gateway_queue.pml && gcc -DSAFETY -o pan pan.c &&
 * ./pan (tests/spec/run_spin.sh does this in the test suite).
 */
#ifndef N
#define N 3
#endif
#ifndef ITER
#define ITER 2
#endif
#define TMAX 3
#define PMAX 1
#define RMAX 1
#define DEPTH 2
#define FREE 255

byte rawT, rawP, rawR;    /* raw semaphore counts, refused acquirers included */
byte heldT, heldP, heldR; /* admitted holders */
byte waiters;
byte mutex = FREE;
chan queue = [DEPTH] of { byte };
byte handed[N];           /* 0: not yet, 1: admitted, 2: rejected */
byte finished;

/* One atomic admission attempt: fetch_add, admitted iff the old count was below max. */
inline acq(raw, held, max, ok) {
  atomic {
    ok = (raw < max);
    raw++;
    if
    :: ok -> held++; assert(held <= max)
    :: else -> skip
    fi
  }
}

/* Under the mutex: hands free pool units to the head waiters, taking each one's route on its
 * behalf. A refused claim is rolled back and ends the loop: whoever holds the count up (a
 * holder, or a refused acquirer mid-rollback) gives it back later and drains then. */
inline drain_locked() {
  do
  :: len(queue) == 0 -> break
  :: len(queue) > 0 ->
    acq(rawP, heldP, PMAX, ok);
    if
    :: !ok -> rawP--; break
    :: else -> skip
    fi;
    queue?w;
    waiters--;
    acq(rawR, heldR, RMAX, ok);
    if
    :: ok -> handed[w] = 1
    :: else ->
      rawR--;
      atomic { heldP--; rawP-- };
      atomic { heldT--; rawT-- };
      handed[w] = 2
    fi
  od
}

/* Every decrement of the pool's count (a release, or the rollback of a refused claim outside
 * the mutex) is followed by a read of `waiters` and, if non-zero, a drain. */
inline pool_decremented() {
  if
  :: waiters != 0 ->
    atomic { mutex == FREE -> mutex = me };
    drain_locked();
    mutex = FREE
  :: else -> skip
  fi
}

proctype Caller(byte me) {
  byte iter = 0;
  byte w;
  bool ok;
  bool queuing;
  do
  :: iter == ITER -> break
  :: else ->
    acq(rawT, heldT, TMAX, ok);
    if
    :: !ok -> rawT--; goto next
    :: else -> skip
    fi;
    /* fast path: only when nobody waits. A call either queues when refused (acquire_async)
     * or is rejected (try_acquire); spin explores both for every call. */
    if
    :: true -> queuing = true
    :: true -> queuing = false
    fi;
    if
    :: waiters == 0 ->
      acq(rawP, heldP, PMAX, ok);
      if
      :: ok -> goto route
      :: else ->
        rawP--;
#ifndef BROKEN_SILENT_ROLLBACK
        pool_decremented()
#endif
      fi
    :: else -> skip
    fi;
    if
    :: !queuing -> atomic { heldT--; rawT-- }; goto next
    :: else -> skip
    fi;
    /* slow path */
    atomic { mutex == FREE -> mutex = me };
    waiters++;
    if
    :: len(queue) == 0 ->
      acq(rawP, heldP, PMAX, ok);
      if
      :: ok -> waiters--; mutex = FREE; goto route
      :: else -> rawP--   /* under the mutex: the drain below covers it */
      fi
    :: else -> skip
    fi;
    if
    :: len(queue) >= DEPTH ->
      waiters--;
      drain_locked();
      mutex = FREE;
      atomic { heldT--; rawT-- };
      goto next
    :: else ->
      queue!me;
      drain_locked();
      mutex = FREE
    fi;
    (handed[me] != 0);
    if
    :: handed[me] == 1 -> handed[me] = 0; goto hold
    :: else -> handed[me] = 0; goto next
    fi;
route:
    acq(rawR, heldR, RMAX, ok);
    if
    :: ok -> goto hold
    :: else -> rawR--; goto relP
    fi;
hold:
    atomic { heldR--; rawR-- };
relP:
#ifdef BROKEN_EARLY_READ
    if
    :: waiters != 0 ->
      atomic { heldP--; rawP-- };
      atomic { mutex == FREE -> mutex = me };
      drain_locked();
      mutex = FREE
    :: else -> atomic { heldP--; rawP-- }
    fi;
#else
    atomic { heldP--; rawP-- };
    pool_decremented();
#endif
    atomic { heldT--; rawT-- };
next:
    iter++
  od;
  finished++
}

init {
  byte i;
  atomic {
    for (i : 0 .. N - 1) {
      run Caller(i)
    }
  }
  finished == N;
  assert(rawT == 0 && rawP == 0 && rawR == 0);
  assert(heldT == 0 && heldP == 0 && heldR == 0);
  assert(waiters == 0 && len(queue) == 0 && mutex == FREE)
}
