// File: parse_errors.h
// A request gRPC could not parse gets a status that says so. gRPC 1.51's
// server answers a request its protobuf parser refuses with INTERNAL and an
// empty message before any handler runs: malformed bytes, or messages
// nested deeper than protobuf's limit of 100 (a spec of about 50 Sequential
// levels, or 33 levels of custom modules). That is the client's error, so
// it becomes INVALID_ARGUMENT naming the request and the limit.
//
// Example:
//   auto creators = metrics.InterceptorCreators();
//   creators.insert(creators.begin(), ParseErrorInterceptorCreator());
//   builder.experimental().SetInterceptorCreators(std::move(creators));
#ifndef MODELSTATE_SERVER_PARSE_ERRORS_H_
#define MODELSTATE_SERVER_PARSE_ERRORS_H_

#include <memory>

#include "grpcpp/support/server_interceptor.h"

namespace modelstate {

// Put it first: interceptors after it (the metrics) then count and log the
// status the client gets.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
ParseErrorInterceptorCreator();

}  // namespace modelstate

#endif  // MODELSTATE_SERVER_PARSE_ERRORS_H_
