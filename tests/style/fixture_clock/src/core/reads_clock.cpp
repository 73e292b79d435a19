// Deliberately wrong: a decision reading the OS clock. check_clock_reads.py must fail on this
// fixture (ctest style.catches_clock_read).
#include <chrono>
long long age() { return std::chrono::steady_clock::now().time_since_epoch().count(); }
