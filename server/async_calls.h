// File: async_calls.h
// Streaming RPCs served on gRPC's completion-queue API by threads of the
// server's own, through reactors shaped like the callback API's: a reactor
// starts reads, writes and the finish, and gRPC's threads run its
// OnReadDone / OnWriteDone / OnCancel, then OnDone once all is over.
//
// Why not the callback API itself: gRPC 1.51 on Linux runs every callback
// reaction on one process-wide completion queue whose threads, after each
// second without a callback event, sleep 100 ms without polling. Such a
// thread is often the one polling every socket of the process, and while it
// sleeps no other takes over: any call that arrives then, synchronous or
// not, waits until the sleep ends. With one callback method registered,
// about one GetStateDict in ten reached its handler 50 to 110 ms late; with
// none, no call did. So the servers register no callback method (a test
// checks that no "nexting_thread" runs in a server process).
//
// Rules, as for gRPC's reactors: at most one read and one write in flight;
// Finish once, never while a StartWrite call is being made (a write may be
// in flight); OnDone comes once every operation has completed and the call
// is over, and the reactor usually deletes itself there.
//
// Example:
//   grpc::ServerBuilder builder;
//   builder.RegisterService(&service);  // WithAsyncMethod_Chat<...>
//   AsyncCallQueue queue(builder);      // before BuildAndStart
//   std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
//   queue.Start(2);
//   using Reactor = AsyncBidiReactor<ChatRequest, ChatResponse>;
//   ServeStreams<Reactor>(
//       &queue,
//       [&](Reactor::Call* call, grpc::ServerCompletionQueue* cq, void* tag) {
//         service.RequestChat(call->context(), call->responder(), cq, cq,
//                             tag);
//       },
//       [](Reactor::Call* call) { return new ChatReactor(call); });
//   ...
//   server->Shutdown();
//   queue.Shutdown();  // after the server's
#ifndef MODELSTATE_SERVER_ASYNC_CALLS_H_
#define MODELSTATE_SERVER_ASYNC_CALLS_H_

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "base/sync.h"
#include "grpcpp/grpcpp.h"

namespace modelstate::server {

// A completion queue's tag: what to do when its operation completes.
class AsyncOp {
 public:
  virtual void Completed(bool ok) = 0;

 protected:
  ~AsyncOp() = default;
};

// The tag that calls `owner->*on_completed(ok)`.
template <class Owner>
class MemberOp final : public AsyncOp {
 public:
  MemberOp(Owner* owner, void (Owner::*on_completed)(bool))
      : owner_(owner), on_completed_(on_completed) {}
  void Completed(bool ok) override { (owner_->*on_completed_)(ok); }

 private:
  Owner* const owner_;
  void (Owner::*const on_completed_)(bool);
};

// A grpc::Server's completion queue and the threads that run what
// completes on it.
class AsyncCallQueue {
 public:
  // Adds the queue to `builder` (before its BuildAndStart).
  explicit AsyncCallQueue(grpc::ServerBuilder& builder);
  ~AsyncCallQueue();  // Shutdown()
  AsyncCallQueue(const AsyncCallQueue&) = delete;
  AsyncCallQueue& operator=(const AsyncCallQueue&) = delete;

  // Once the server is built.
  void Start(int threads);
  // Once the server's Shutdown has returned: waits until every call served
  // here is over (the server has cancelled them, and each reactor's last
  // operation may still start), then stops the threads.
  void Shutdown();

  grpc::ServerCompletionQueue* cq() const { return cq_.get(); }

  // Calls alive on the queue (AsyncStreamCall counts itself): none may
  // start an operation once the queue is shut down.
  void CallOpened();
  void CallClosed();

 private:
  void Run();

  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  std::vector<std::thread> threads_;
  bool shut_down_ = false;
  Mutex mu_;
  CondVar all_closed_;
  int open_calls_ ABSL_GUARDED_BY(mu_) = 0;
};

template <class Responder, class Request, class Response>
class AsyncStreamReactor;

// One call of a streaming method: its context, its responder and (for a
// server-streaming method) the client's request. Owned by the serving
// machinery; alive until its reactor's OnDone has returned.
template <class Responder, class Request, class Response>
class AsyncStreamCall {
 public:
  using Reactor = AsyncStreamReactor<Responder, Request, Response>;
  // Asks gRPC for the next call of the method: calls the generated
  // Request<Method> with `call`'s parts, `cq` twice and `tag`.
  using RequestFn = std::function<void(
      AsyncStreamCall* call, grpc::ServerCompletionQueue* cq, void* tag)>;
  // Makes the reactor of a call that has arrived.
  using Handler = std::function<Reactor*(AsyncStreamCall* call)>;

  grpc::ServerContext* context() { return &context_; }
  Responder* responder() { return &responder_; }
  Request* request() { return &request_; }

  // Asks for calls of one method until the server shuts down, each served
  // by the reactor `handler` makes for it.
  static void ServeAll(AsyncCallQueue* queue, RequestFn request,
                       Handler handler) {
    auto method = std::make_shared<const Method>(
        Method{queue, std::move(request), std::move(handler)});
    AcceptNext(std::move(method));
  }

 private:
  friend Reactor;
  struct Method {
    AsyncCallQueue* queue;
    RequestFn request;
    Handler handler;
  };

  // Counts a call open on its queue from before its first member to after
  // its last.
  class Counted {
   public:
    explicit Counted(AsyncCallQueue* queue) : queue_(queue) {
      queue_->CallOpened();
    }
    ~Counted() { queue_->CallClosed(); }

   private:
    AsyncCallQueue* const queue_;
  };

  explicit AsyncStreamCall(std::shared_ptr<const Method> method)
      : counted_(method->queue), method_(std::move(method)) {}

  static void AcceptNext(std::shared_ptr<const Method> method) {
    auto* call = new AsyncStreamCall(std::move(method));
    // Must come before the request; its tag returns only if a call arrives.
    call->context_.AsyncNotifyWhenDone(&call->call_over_);
    call->method_->request(call, call->method_->queue->cq(),
                           static_cast<AsyncOp*>(&call->arrived_));
  }

  void Arrived(bool ok) {
    if (!ok) {  // the server is shutting down: no call came
      delete this;
      return;
    }
    AcceptNext(method_);
    // One reference for the handler and one for the call's end, so that
    // OnDone cannot come before the handler has returned.
    refs_.store(2);
    Reactor* reactor = method_->handler(this);
    bool cancelled;
    {
      MutexLock lock(&mu_);
      reactor_ = reactor;
      cancelled = over_ && context_.IsCancelled();
    }
    if (cancelled) reactor->OnCancel();
    Unref();
  }

  void Over(bool) {
    Reactor* reactor;
    {
      MutexLock lock(&mu_);
      over_ = true;
      reactor = reactor_;
    }
    // Before the reactor is known, Arrived tells it.
    if (reactor != nullptr && context_.IsCancelled()) reactor->OnCancel();
    Unref();
  }

  void Ref() { refs_.fetch_add(1); }
  void Unref() {
    if (refs_.fetch_sub(1) != 1) return;
    Reactor* reactor;
    {
      MutexLock lock(&mu_);
      reactor = reactor_;
    }
    reactor->OnDone();  // the reactor may use the context until it returns
    delete this;
  }

  const Counted counted_;
  const std::shared_ptr<const Method> method_;
  grpc::ServerContext context_;
  Responder responder_{&context_};
  Request request_;
  MemberOp<AsyncStreamCall> arrived_{this, &AsyncStreamCall::Arrived};
  MemberOp<AsyncStreamCall> call_over_{this, &AsyncStreamCall::Over};
  // Operations in flight, plus the two references Arrived takes.
  std::atomic<int> refs_{0};
  Mutex mu_;
  Reactor* reactor_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool over_ ABSL_GUARDED_BY(mu_) = false;
};

// Serves one call; see the rules at the top of this file.
template <class Responder, class Request, class Response>
class AsyncStreamReactor {
 public:
  using Call = AsyncStreamCall<Responder, Request, Response>;

  virtual ~AsyncStreamReactor() = default;

  // Bidirectional streams only.
  void StartRead(Request* request) {
    call_->Ref();
    call_->responder_.Read(request, static_cast<AsyncOp*>(&read_done_));
  }
  // `response` must stay alive and unchanged until OnWriteDone.
  void StartWrite(const Response* response) {
    call_->Ref();
    call_->responder_.Write(*response, static_cast<AsyncOp*>(&write_done_));
  }
  void Finish(const grpc::Status& status) {
    call_->Ref();
    call_->responder_.Finish(status, static_cast<AsyncOp*>(&finish_done_));
  }

  virtual void OnReadDone(bool /*ok*/) {}
  virtual void OnWriteDone(bool /*ok*/) {}
  // The client went away or the deadline passed. Operations in flight
  // fail; one that starts after fails at once.
  virtual void OnCancel() {}
  // Every operation has completed and the call is over.
  virtual void OnDone() = 0;

 protected:
  // The reactor of `call`, from the Handler (on one of the queue's threads).
  explicit AsyncStreamReactor(Call* call) : call_(call) {}
  grpc::ServerContext* context() { return call_->context(); }

 private:
  void ReadDone(bool ok) {
    OnReadDone(ok);
    call_->Unref();
  }
  void WriteDone(bool ok) {
    OnWriteDone(ok);
    call_->Unref();
  }
  void FinishDone(bool) { call_->Unref(); }

  Call* const call_;
  MemberOp<AsyncStreamReactor> read_done_{this, &AsyncStreamReactor::ReadDone};
  MemberOp<AsyncStreamReactor> write_done_{this,
                                           &AsyncStreamReactor::WriteDone};
  MemberOp<AsyncStreamReactor> finish_done_{this,
                                            &AsyncStreamReactor::FinishDone};
};

template <class Request, class Response>
using AsyncBidiReactor =
    AsyncStreamReactor<grpc::ServerAsyncReaderWriter<Response, Request>,
                       Request, Response>;
template <class Request, class Response>
using AsyncWriterReactor =
    AsyncStreamReactor<grpc::ServerAsyncWriter<Response>, Request, Response>;

// Serves every call of one streaming method with `Reactor`s (made by
// `handler`) until the server shuts down.
template <class Reactor>
void ServeStreams(AsyncCallQueue* queue,
                  typename Reactor::Call::RequestFn request,
                  typename Reactor::Call::Handler handler) {
  Reactor::Call::ServeAll(queue, std::move(request), std::move(handler));
}

}  // namespace modelstate::server

#endif  // MODELSTATE_SERVER_ASYNC_CALLS_H_
