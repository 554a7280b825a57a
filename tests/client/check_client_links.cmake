# Fails if a C++ client links more than it should: the layer library
# (modelstate_nn), the server's libraries or OpenBLAS. Run by the
# client_links_no_layers test:
#   cmake -DCLOSURE_FILE=<file> -DBINARY=<modelstatectl> -P check_client_links.cmake
# CLOSURE_FILE lists, one per line, "<target>: <item>" for every target and
# library in the link closure of modelstate_client and modelstatectl (written
# at configure time by tests/CMakeLists.txt).
cmake_minimum_required(VERSION 3.25)

# The modelstate libraries a client may link: the layers below nn/, the
# audit log (for `audit verify --file`), the protos and their shared
# conversions, and the client's own.
set(ALLOWED modelstate_base modelstate_core modelstate_audit modelstate_proto
    modelstate_health_proto modelstate_convert modelstate_client
    modelstate_cli modelstatectl)

file(STRINGS "${CLOSURE_FILE}" lines)
set(problems "")
foreach(line IN LISTS lines)
  string(REGEX REPLACE "^([^:]+): (.*)$" "\\1" root "${line}")
  string(REGEX REPLACE "^([^:]+): (.*)$" "\\2" item "${line}")
  string(TOLOWER "${item}" lower)
  if(item MATCHES "^modelstate" AND NOT item IN_LIST ALLOWED)
    list(APPEND problems "${root} links ${item}")
  elseif(lower MATCHES "blas|lapack")
    list(APPEND problems "${root} links ${item}")
  endif()
endforeach()

execute_process(COMMAND ldd "${BINARY}" OUTPUT_VARIABLE ldd_output
                RESULT_VARIABLE ldd_result)
if(NOT ldd_result EQUAL 0)
  list(APPEND problems "ldd ${BINARY} failed")
endif()
string(TOLOWER "${ldd_output}" ldd_lower)
if(ldd_lower MATCHES "lib[a-z]*blas|liblapack")
  list(APPEND problems "${BINARY} loads BLAS:\n${ldd_output}")
endif()

list(LENGTH lines count)
if(problems)
  list(JOIN problems "\n" text)
  message(FATAL_ERROR "a C++ client must not link the layer library, the "
                      "server's libraries or OpenBLAS:\n${text}")
endif()
message(STATUS "checked ${count} link items and ldd ${BINARY}: fine")
