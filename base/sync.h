// File: sync.h
// Mutex, lock guards and a condition variable with Abseil's thread-safety
// annotations, built on pthreads.
//
// Why not absl::Mutex: Debian ships Abseil prebuilt without ThreadSanitizer
// instrumentation, so TSan cannot see absl::Mutex's lock operations and
// reports races on data it protects. pthread calls are intercepted by every
// sanitizer. The read-write lock prefers writers, so a steady stream of
// readers (state_dict downloads) cannot starve a writer.
//
// Example:
//   class Counter {
//    public:
//     void Add() { MutexLock lock(&mu_); ++n_; }
//    private:
//     Mutex mu_;
//     int n_ ABSL_GUARDED_BY(mu_) = 0;
//   };
#ifndef MODELSTATE_BASE_SYNC_H_
#define MODELSTATE_BASE_SYNC_H_

#include <pthread.h>

#include <chrono>
#include <condition_variable>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace modelstate {

// A reader-writer mutex (writer-preferring). Not recursive.
class ABSL_LOCKABLE Mutex {
 public:
  Mutex();
  ~Mutex();
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION();
  void Unlock() ABSL_UNLOCK_FUNCTION();
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION();
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION();

  // BasicLockable, for std::condition_variable_any.
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { Lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { Unlock(); }

 private:
  pthread_rwlock_t rw_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(Mutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->ReaderLock();
  }
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  Mutex* const mu_;
};

using WriterMutexLock = MutexLock;

// A condition variable used with a Mutex held exclusively.
class CondVar {
 public:
  // Atomically releases `mu`, waits for a signal, and re-acquires `mu`.
  // May wake spuriously: always re-check the condition.
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { cv_.wait(*mu); }
  // Like Wait, but returns true if `deadline` passed first.
  bool WaitWithDeadline(Mutex* mu, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return cv_.wait_until(*mu, absl::ToChronoTime(deadline)) ==
           std::cv_status::timeout;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

}  // namespace modelstate

#endif  // MODELSTATE_BASE_SYNC_H_
