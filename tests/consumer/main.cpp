// Uses the installed headers and library the way a user's program would; exits non-zero if
// the semaphore does not behave.
#include <sluice/semaphore.h>

#include <cstdio>

int main() {
  sluice::Semaphore sem(1);
  auto first = sem.try_acquire();
  auto second = sem.try_acquire();
  if (!first || second || sem.in_flight() != 1) return 1;
  first->release();
  if (sem.in_flight() != 0) return 2;
  std::puts("consumer: sluice::sluice found and working");
  return 0;
}
