// File: malloc_settings.h
// glibc malloc settings for a process that streams large gRPC messages:
// the server, and a client process that runs many transfers at once.
//
// gRPC reads each socket into fresh buffers from malloc (up to 4 MiB) and
// frees them once the message is consumed. With glibc's defaults those
// buffers are mapped afresh (above the mmap threshold), or taken from the
// top of a heap that the previous free trimmed back to the system, and
// with several threads in per-thread arenas whose top is trimmed on its
// own: every 4 KiB of every message then costs a page fault and the
// zeroing of a page. One transfer at a time mostly reuses its memory; many
// at once in one process (threads fetching in parallel) mostly do not:
// figures in README.md, "Where issue 20 stands".
//
// Example (first thing in main, before any thread starts):
//   if (!modelstate::ReuseMessageMemory()) { /* malloc refused: warn */ }
#ifndef MODELSTATE_BASE_MALLOC_SETTINGS_H_
#define MODELSTATE_BASE_MALLOC_SETTINGS_H_

namespace modelstate {

// Blocks below 32 MiB (the largest mmap threshold glibc accepts) come from
// the heap, freed memory stays there for the next messages (no trimming on
// free: call malloc_trim(0) to give it back, as the server does every 2 s)
// and every thread allocates from the one main arena, whose free top
// malloc_trim can return (it does not reach per-thread arenas). Affects
// the whole process; arenas made before the call stay in use, so call it
// before threads start. The same as the environment variable
// GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:
// glibc.malloc.trim_threshold=1073741824:glibc.malloc.arena_max=1
// (one line). Returns false if malloc refused a setting.
bool ReuseMessageMemory();

}  // namespace modelstate

#endif  // MODELSTATE_BASE_MALLOC_SETTINGS_H_
