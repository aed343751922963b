#ifndef MATERIALIZER_SERVER_COMMON_HAPPENS_BEFORE_H_
#define MATERIALIZER_SERVER_COMMON_HAPPENS_BEFORE_H_

// Orderings that ThreadSanitizer cannot see, stated for it.
//
// gRPC runs a callback reactor's reactions on its own threads and orders
// them (a read's OnReadDone after the StartRead that asked for it, OnDone
// after every other reaction) through its completion queues, inside a
// library that is not instrumented. Reactors mark each reaction with a
// ReactionScope so that TSan knows what gRPC guarantees, and still checks
// everything else they touch. Under --config=tsan (MATERIALIZER_TSAN) these
// are __tsan_release / __tsan_acquire; otherwise they compile to nothing.
//
//   void OnReadDone(bool ok) override {
//     ReactionScope reaction(this);
//     ...
//   }
//   void OnDone() override {
//     HappensAfter(this);
//     delete this;
//   }

#ifdef MATERIALIZER_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace materializer {

// Everything before this call happens before whatever follows a later
// HappensAfter(p) on any thread.
inline void HappensBefore(const void* p) {
#ifdef MATERIALIZER_TSAN
  __tsan_release(const_cast<void*>(p));
#else
  (void)p;
#endif
}

inline void HappensAfter(const void* p) {
#ifdef MATERIALIZER_TSAN
  __tsan_acquire(const_cast<void*>(p));
#else
  (void)p;
#endif
}

// One reaction of a reactor: after the reactions before it, before the
// ones after it. The reactor must outlive the scope (gRPC calls OnDone
// only after every other reaction has returned).
class ReactionScope {
 public:
  explicit ReactionScope(const void* reactor) : reactor_(reactor) {
    HappensAfter(reactor_);
  }
  ~ReactionScope() { HappensBefore(reactor_); }

  ReactionScope(const ReactionScope&) = delete;
  ReactionScope& operator=(const ReactionScope&) = delete;

 private:
  const void* const reactor_;
};

}  // namespace materializer

#endif  // MATERIALIZER_SERVER_COMMON_HAPPENS_BEFORE_H_
