#!/usr/bin/env bash
# thread_safety_check.py fails on an unguarded access (and a call without the lock a function
# requires, and a wait on a CondVar without its mutex) and passes the same code written right.
set -u
check=${1:?usage: thread_safety_catches.sh PATH/TO/thread_safety_check.py}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
cat > "$tmp/good.cc" <<'CC'
#include "common/base/mutex.h"
namespace {
class Counter {
 public:
  void Add() EXCLUDES(mu_) { trellis::MutexLock lock(&mu_); AddLocked(); changed_.SignalAll(); }
  int WaitNonZero() EXCLUDES(mu_) {
    trellis::MutexLock lock(&mu_);
    while (n_ == 0) changed_.Wait(&mu_);
    return n_;
  }
 private:
  void AddLocked() REQUIRES(mu_) { ++n_; }
  trellis::Mutex mu_;
  int n_ GUARDED_BY(mu_) = 0;
  trellis::CondVar changed_;
};
}  // namespace
int main() { Counter c; c.Add(); return c.WaitNonZero() == 1 ? 0 : 1; }
CC
expect() {  # expect WANT_RC WANT_TEXT FILE
  local out rc
  out=$(python3 "$check" --file "$3" 2>&1); rc=$?
  if [[ $rc -ne $1 || "$out" != *"$2"* ]]; then
    echo "FAIL $3: rc $rc (want $1), want text '$2' in:"; echo "$out"; fail=1
  else
    echo "ok   $3: rc $rc"
  fi
}
expect 0 "" "$tmp/good.cc"
sed 's/void Add() EXCLUDES(mu_) { trellis::MutexLock lock(&mu_); AddLocked();/void Add() { ++n_;/' "$tmp/good.cc" > "$tmp/unguarded.cc"
expect 1 "writing variable 'n_' requires holding mutex 'mu_'" "$tmp/unguarded.cc"
sed 's/trellis::MutexLock lock(&mu_); AddLocked();/AddLocked();/' "$tmp/good.cc" > "$tmp/no_lock_call.cc"
expect 1 "calling function 'AddLocked' requires holding mutex 'mu_'" "$tmp/no_lock_call.cc"
# WaitNonZero without its MutexLock: the CondVar's Wait itself must be refused (its reads of n_
# are refused too, which alone would not prove that Wait is checked).
awk '/int WaitNonZero/ {print; getline; next} {print}' "$tmp/good.cc" > "$tmp/wait_unlocked.cc"
expect 1 "calling function 'Wait' requires holding mutex 'mu_'" "$tmp/wait_unlocked.cc"
# Which files the build-wide run reads: every product file; a test only when it has locks.
sel=$(python3 - "$check" <<'PY'
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("tsc", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
root = m.ROOT
print(m.worth_checking(os.path.join(root, "worker-lib/src/server_connection.cc")),
      m.worth_checking(os.path.join(root, "tests/unit/worker-lib/progress_reporter_test.cc")),
      m.worth_checking(os.path.join(root, "tests/unit/common/job/job_spec_test.cc")))
PY
)
if [[ "$sel" != "True True False" ]]; then
  echo "FAIL selection: product, locking test, lock-free test -> '$sel' (want 'True True False')"; fail=1
else
  echo "ok   selection: product and locking tests checked, lock-free tests skipped"
fi
exit $fail
