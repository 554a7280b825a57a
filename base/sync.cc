#include "base/sync.h"

#include <pthread.h>

#include "base/log.h"

namespace modelstate {

Mutex::Mutex() {
  pthread_rwlockattr_t attr;
  pthread_rwlockattr_init(&attr);
  // glibc's default prefers readers, which can starve writers forever.
  pthread_rwlockattr_setkind_np(&attr,
                                PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  MODELSTATE_CHECK(pthread_rwlock_init(&rw_, &attr) == 0)
      << "pthread_rwlock_init failed";
  pthread_rwlockattr_destroy(&attr);
}

Mutex::~Mutex() { pthread_rwlock_destroy(&rw_); }

// Lock failures (EDEADLK, EINVAL) are programming errors.
void Mutex::Lock() {
  MODELSTATE_CHECK(pthread_rwlock_wrlock(&rw_) == 0) << "wrlock failed";
}
void Mutex::Unlock() {
  MODELSTATE_CHECK(pthread_rwlock_unlock(&rw_) == 0) << "unlock failed";
}
void Mutex::ReaderLock() {
  MODELSTATE_CHECK(pthread_rwlock_rdlock(&rw_) == 0) << "rdlock failed";
}
void Mutex::ReaderUnlock() {
  MODELSTATE_CHECK(pthread_rwlock_unlock(&rw_) == 0) << "unlock failed";
}

}  // namespace modelstate
