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

#include <utility>

#ifdef MATERIALIZER_TSAN
#include <sanitizer/tsan_interface.h>

// ThreadSanitizer's dynamic annotations (exported by its runtime).
extern "C" {
void AnnotateIgnoreReadsBegin(const char* file, int line);
void AnnotateIgnoreReadsEnd(const char* file, int line);
void AnnotateIgnoreWritesBegin(const char* file, int line);
void AnnotateIgnoreWritesEnd(const char* file, int line);
}
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

// Runs `op`, one reactor operation that hands something to gRPC (Finish,
// StartWrite, StartRead), with TSan ignoring the plain memory accesses made
// inside it:
//
//   grpc::Status status = observer_.End(result);  // our code: checked
//   HandOffToGrpc([&] { Finish(std::move(status)); });
//
// Why: the operation's inline header code stores the op and its completion
// callback in gRPC's own objects (a tag's std::function), and one of
// gRPC's threads runs that callback after a completion-queue handoff in
// the uninstrumented library. TSan cannot see the handoff, so whenever the
// store and the run are on different threads (a fetch finished from a
// worker) it reports them as a race. Suppressing by the store's stack
// (CallbackWithSuccessTag::Set) was not enough: TSan keeps only so much
// history per thread, and once it could not restore that stack the report
// went through (CI, hardening_test's fetch cancelled before a worker took
// it). Ignoring the store itself cannot miss. Only gRPC's code runs inside
// `op`; evaluate anything of ours (the status, the buffer) before it.
template <typename Op>
void HandOffToGrpc(Op&& op) {
#ifdef MATERIALIZER_TSAN
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
  AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  std::forward<Op>(op)();
  AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#else
  std::forward<Op>(op)();
#endif
}

}  // namespace materializer

#endif  // MATERIALIZER_SERVER_COMMON_HAPPENS_BEFORE_H_
