// Makes abseil's Mutex, CondVar, Notification, BlockingCounter and Barrier
// visible to ThreadSanitizer when abseil itself is not instrumented.
//
// Why: the system abseil is compiled without -fsanitize=thread, so its lock
// words and futex waits are invisible to TSan, which then reports every
// access to data guarded by an absl::Mutex as a race (and cannot check the
// code the mutexes protect at all). Building abseil from source is not an
// option offline. Instead, under --config=tsan this file defines the
// out-of-line entry points of those classes in the executable. Each wrapper
// calls the library's own implementation (looked up with dlsym(RTLD_NEXT))
// and tells TSan about the synchronization with __tsan_acquire/__tsan_release
// on the object's address: the happens-before edges a mutex creates. Because
// executables' symbols come first in dynamic lookup, calls from inside the
// abseil and gRPC shared libraries reach these wrappers as well.
//
// Conditions: abseil evaluates a waiter's Condition inside the library, on
// whichever thread holds the lock at that moment (often the unlocking one).
// The wrappers hand the library a Condition of their own that acquires the
// mutex's edge, evaluates the caller's Condition and releases again, so the
// caller's predicate is ordered with every critical section. A LockWhen
// caller releases before waiting so its Condition object is published.
//
// What it cannot do: detect lock-order inversions (TSan sees edges, not
// mutexes), and reader locks are modelled as full acquire/release. The
// release before LockWhen can hide a race between code before the LockWhen
// and another thread's critical section; it never invents one.

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/barrier.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

#define MAT_STRINGIFY_INNER(x) #x
#define MAT_STRINGIFY(x) MAT_STRINGIFY_INNER(x)

// The library's definition of `name` (the Itanium mangling after
// "_ZN4absl<ns>", or after "_ZNK4absl<ns>" for const members).
template <typename Fn>
Fn Real(const char* name, bool is_const = false) {
  const std::string ns = MAT_STRINGIFY(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string symbol = std::string(is_const ? "_ZNK4absl" : "_ZN4absl") +
                             std::to_string(ns.size()) + ns + name;
  void* fn = dlsym(RTLD_NEXT, symbol.c_str());
  if (fn == nullptr) {
    std::fprintf(stderr, "tsan annotations: %s not found: %s\n", symbol.c_str(),
                 dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

void Acquire(const void* p) { __tsan_acquire(const_cast<void*>(p)); }
void Release(const void* p) { __tsan_release(const_cast<void*>(p)); }

// A caller's Condition and its mutex, read by whichever thread evaluates
// it; atomics, so that reading them is never itself reported.
struct Annotated {
  std::atomic<const absl::Condition*> user;
  std::atomic<const absl::Mutex*> mu;
};

bool EvalAnnotated(void* arg) {
  const auto* annotated = static_cast<const Annotated*>(arg);
  const absl::Mutex* mu = annotated->mu.load(std::memory_order_relaxed);
  Acquire(mu);
  const bool result = annotated->user.load(std::memory_order_relaxed)->Eval();
  Release(mu);
  return result;
}

// Builds `name`, a Condition the library may evaluate anywhere, for `cond`.
#define MAT_ANNOTATED_CONDITION(name, cond, mutex)             \
  Annotated name##_state;                                      \
  name##_state.user.store(&(cond), std::memory_order_relaxed); \
  name##_state.mu.store((mutex), std::memory_order_relaxed);   \
  const absl::Condition name(&EvalAnnotated, &name##_state)

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

// --- Mutex ---------------------------------------------------------------

void Mutex::Lock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex4LockEv");
  real(this);
  Acquire(this);
}

void Mutex::Unlock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex6UnlockEv");
  Release(this);
  real(this);
}

bool Mutex::TryLock() {
  static auto real = Real<bool (*)(Mutex*)>("5Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

void Mutex::ReaderLock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex10ReaderLockEv");
  real(this);
  Acquire(this);
}

void Mutex::ReaderUnlock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex12ReaderUnlockEv");
  Release(this);
  real(this);
}

bool Mutex::ReaderTryLock() {
  static auto real = Real<bool (*)(Mutex*)>("5Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

// LockWhen: the caller does not hold the mutex yet; its release publishes
// the Condition to the thread that will evaluate it.
void Mutex::LockWhen(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>(
      "5Mutex8LockWhenERKNS0_9ConditionE");
  Release(this);
  MAT_ANNOTATED_CONDITION(annotated, cond, this);
  real(this, annotated);
  Acquire(this);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Release(this);
  MAT_ANNOTATED_CONDITION(annotated, cond, this);
  const bool result = real(this, annotated, timeout);
  Acquire(this);
  return result;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Release(this);
  MAT_ANNOTATED_CONDITION(annotated, cond, this);
  const bool result = real(this, annotated, deadline);
  Acquire(this);
  return result;
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>(
      "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Release(this);
  MAT_ANNOTATED_CONDITION(annotated, cond, this);
  real(this, annotated);
  Acquire(this);
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Release(this);
  MAT_ANNOTATED_CONDITION(annotated, cond, this);
  const bool result = real(this, annotated, timeout);
  Acquire(this);
  return result;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Release(this);
  MAT_ANNOTATED_CONDITION(annotated, cond, this);
  const bool result = real(this, annotated, deadline);
  Acquire(this);
  return result;
}

// Await releases the mutex while it waits and holds it again on return.
void Mutex::Await(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>(
      "5Mutex5AwaitERKNS0_9ConditionE");
  Release(this);
  MAT_ANNOTATED_CONDITION(annotated, cond, this);
  real(this, annotated);
  Acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Release(this);
  MAT_ANNOTATED_CONDITION(annotated, cond, this);
  const bool result = real(this, annotated, timeout);
  Acquire(this);
  return result;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Release(this);
  MAT_ANNOTATED_CONDITION(annotated, cond, this);
  const bool result = real(this, annotated, deadline);
  Acquire(this);
  return result;
}

// --- CondVar -------------------------------------------------------------

void CondVar::Wait(Mutex* mu) {
  static auto real =
      Real<void (*)(CondVar*, Mutex*)>("7CondVar4WaitEPNS0_5MutexE");
  Release(mu);
  real(this, mu);
  Acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, Duration)>(
      "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Release(mu);
  const bool result = real(this, mu, timeout);
  Acquire(mu);
  return result;
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, Time)>(
      "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Release(mu);
  const bool result = real(this, mu, deadline);
  Acquire(mu);
  return result;
}

// --- Notification, BlockingCounter, Barrier ------------------------------
// Their waits may return without taking the inner mutex (an atomic fast
// path), so they synchronize on the object itself.

void Notification::Notify() {
  static auto real = Real<void (*)(Notification*)>("12Notification6NotifyEv");
  Release(this);
  real(this);
}

void Notification::WaitForNotification() const {
  static auto real = Real<void (*)(const Notification*)>(
      "12Notification19WaitForNotificationEv", /*is_const=*/true);
  real(this);
  Acquire(this);
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  static auto real = Real<bool (*)(const Notification*, Duration)>(
      "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE",
      /*is_const=*/true);
  const bool notified = real(this, timeout);
  if (notified) Acquire(this);
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  static auto real = Real<bool (*)(const Notification*, Time)>(
      "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE",
      /*is_const=*/true);
  const bool notified = real(this, deadline);
  if (notified) Acquire(this);
  return notified;
}

bool BlockingCounter::DecrementCount() {
  static auto real =
      Real<bool (*)(BlockingCounter*)>("15BlockingCounter14DecrementCountEv");
  Release(this);
  const bool zero = real(this);
  if (zero) Acquire(this);
  return zero;
}

void BlockingCounter::Wait() {
  static auto real =
      Real<void (*)(BlockingCounter*)>("15BlockingCounter4WaitEv");
  real(this);
  Acquire(this);
}

bool Barrier::Block() {
  static auto real = Real<bool (*)(Barrier*)>("7Barrier5BlockEv");
  Release(this);
  const bool last = real(this);
  Acquire(this);
  return last;
}

ABSL_NAMESPACE_END
}  // namespace absl
