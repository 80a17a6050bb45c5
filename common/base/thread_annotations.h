// Clang's thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html), as
// LevelDB and Abseil use them: a member says which lock guards it, a function which locks it needs
// or takes, and `clang++ -Wthread-safety` checks every access (ctest `thread_safety`; g++ builds
// see empty macros). The locks themselves are common/base/mutex.h: libstdc++'s std::mutex carries
// no annotations, so annotated state is guarded by a trellis::Mutex.
#pragma once

// Abseil's internal header (reached through gRPC's headers) defines some of the same names
// unconditionally. It is included first here, so whichever order a file includes the two in,
// ours replace its definitions (the same attributes) once, without a redefinition warning.
#if __has_include(<absl/base/internal/thread_annotations.h>)
#include <absl/base/internal/thread_annotations.h>
#endif
#undef GUARDED_BY
#undef PT_GUARDED_BY
#undef ACQUIRED_BEFORE
#undef ACQUIRED_AFTER
#undef NO_THREAD_SAFETY_ANALYSIS

#if defined(__clang__)
#define TRELLIS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define TRELLIS_THREAD_ANNOTATION(x)
#endif

// The type is a lock ("mutex").
#define CAPABILITY(x) TRELLIS_THREAD_ANNOTATION(capability(x))
// An RAII object that holds a lock for its scope (MutexLock).
#define SCOPED_CAPABILITY TRELLIS_THREAD_ANNOTATION(scoped_lockable)
// The member is read and written only with `x` held.
#define GUARDED_BY(x) TRELLIS_THREAD_ANNOTATION(guarded_by(x))
// What the pointer points to is read and written only with `x` held.
#define PT_GUARDED_BY(x) TRELLIS_THREAD_ANNOTATION(pt_guarded_by(x))
// Lock order: this lock is taken before / after the named ones.
#define ACQUIRED_BEFORE(...) TRELLIS_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) TRELLIS_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
// The caller must hold the locks (the function's name usually ends in "Locked").
#define REQUIRES(...) TRELLIS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// The caller must not hold the locks (the function takes them itself).
#define EXCLUDES(...) TRELLIS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// The function takes / releases the locks and returns still holding / no longer holding them.
#define ACQUIRE(...) TRELLIS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) TRELLIS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
// The same for a reader's (shared) hold of a SharedMutex; REQUIRES_SHARED: at least a reader's.
#define ACQUIRE_SHARED(...) TRELLIS_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) TRELLIS_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) TRELLIS_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
// Releases the locks however they are held (a scoped lock's destructor).
#define RELEASE_GENERIC(...) TRELLIS_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) TRELLIS_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// Tells the analysis the lock is held here (checked at run time by nobody: use sparingly).
#define ASSERT_CAPABILITY(x) TRELLIS_THREAD_ANNOTATION(assert_capability(x))
// The function returns a reference to the named lock.
#define RETURN_CAPABILITY(x) TRELLIS_THREAD_ANNOTATION(lock_returned(x))
// Turns the analysis off for one function; every use says why next to it.
#define NO_THREAD_SAFETY_ANALYSIS TRELLIS_THREAD_ANNOTATION(no_thread_safety_analysis)
