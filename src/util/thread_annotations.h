// Clang's thread-safety annotations (-Wthread-safety): which mutex guards a
// member, which a function needs held or must not hold. Under clang they are
// checked at compile time (the lint.thread_safety test); under other compilers
// they expand to nothing. util/mutex.h has the annotated Mutex to name.
//
// GUARDED_BY(mu)      a member read or written only with `mu` held
// PT_GUARDED_BY(mu)   the data a pointer member points to, likewise
// REQUIRES(mu)        a function its callers call with `mu` held
// EXCLUDES(mu)        a function that takes `mu` itself (callers must not hold it)
// ACQUIRE / RELEASE   functions that take or let go of a capability
// NO_THREAD_SAFETY_ANALYSIS   a function the analysis cannot follow (say why)
#pragma once

#if defined(__clang__)
#define GPUSNAP_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define GPUSNAP_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) GPUSNAP_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY GPUSNAP_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) GPUSNAP_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) GPUSNAP_THREAD_ANNOTATION(pt_guarded_by(x))
#define REQUIRES(...) GPUSNAP_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) GPUSNAP_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) GPUSNAP_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) GPUSNAP_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) GPUSNAP_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) GPUSNAP_THREAD_ANNOTATION(assert_capability(x))
#define RETURN_CAPABILITY(x) GPUSNAP_THREAD_ANNOTATION(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS GPUSNAP_THREAD_ANNOTATION(no_thread_safety_analysis)
