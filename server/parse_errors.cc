#include "server/parse_errors.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "grpcpp/support/interceptor.h"
#include "grpcpp/support/status.h"

namespace modelstate {
namespace {

using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::InterceptorBatchMethods;
using grpc::experimental::ServerRpcInfo;

class ParseErrorInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit ParseErrorInterceptor(ServerRpcInfo* info)
      : method_(info->method() != nullptr ? info->method() : ""),
        // Only these calls parse their one request before the handler runs;
        // a stream's handler sees an unparsable message as a failed Read.
        single_request_(info->type() == ServerRpcInfo::Type::UNARY ||
                        info->type() == ServerRpcInfo::Type::SERVER_STREAMING) {
  }

  void Intercept(InterceptorBatchMethods* methods) override {
    if (single_request_ && methods->QueryInterceptionHookPoint(
                               InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      // Every status this service sends has a message; gRPC's own parse
      // failure has none.
      if (status.error_code() == grpc::StatusCode::INTERNAL &&
          status.error_message().empty()) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("request: the server could not parse the request "
                         "of ",
                         method_,
                         ": its bytes are not that message, or it nests "
                         "messages deeper than protobuf's limit of 100 (a "
                         "spec with more than about 48 nested Sequential "
                         "levels, or 32 of custom modules)")));
      }
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  const bool single_request_;
};

class ParseErrorInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      ServerRpcInfo* info) override {
    return new ParseErrorInterceptor(info);
  }
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
ParseErrorInterceptorCreator() {
  return std::make_unique<ParseErrorInterceptorFactory>();
}

}  // namespace modelstate
