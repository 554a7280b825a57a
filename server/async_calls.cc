#include "server/async_calls.h"

namespace modelstate::server {

AsyncCallQueue::AsyncCallQueue(grpc::ServerBuilder& builder)
    : cq_(builder.AddCompletionQueue()) {}

AsyncCallQueue::~AsyncCallQueue() { Shutdown(); }

void AsyncCallQueue::Start(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

void AsyncCallQueue::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  {
    MutexLock lock(&mu_);
    while (open_calls_ > 0) all_closed_.Wait(&mu_);
  }
  cq_->Shutdown();
  if (threads_.empty()) {
    Run();  // never started: the tags left still free what they hold
    return;
  }
  for (std::thread& thread : threads_) thread.join();
}

void AsyncCallQueue::CallOpened() {
  MutexLock lock(&mu_);
  ++open_calls_;
}

void AsyncCallQueue::CallClosed() {
  MutexLock lock(&mu_);
  if (--open_calls_ == 0) all_closed_.SignalAll();
}

void AsyncCallQueue::Run() {
  void* tag;
  bool ok;
  // Next waits without a deadline: a thread here is always one gRPC may
  // hand the polling of the server's sockets to.
  while (cq_->Next(&tag, &ok)) static_cast<AsyncOp*>(tag)->Completed(ok);
}

}  // namespace modelstate::server
