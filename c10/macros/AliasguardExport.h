#pragma once

// Note [Symbol visibility]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// libaliasguard_core is compiled with -fvisibility=hidden: everything it
// defines, including the copies of torch's inline functions and templates it
// instantiates, stays private to it, and only declarations marked
// ALIASGUARD_API (all in namespace aliasguard) are exported for the Python
// bindings and the C++ tests. Everything aliasguard defines lives in
// namespace aliasguard, so the day torch adds a function of the same name the
// process still has exactly one definition of each.
// (The name is not Export.h: the repository root is on the include path and
// must not shadow torch's <c10/macros/Export.h>.)
#define ALIASGUARD_API __attribute__((visibility("default")))

// Note [Hot path layout]
// ~~~~~~~~~~~~~~~~~~~~~~
// Every corrected __torch_dispatch__ call runs a few dozen small functions of
// both libraries between two stretches of the interpreter and of torch, which
// evict them from the instruction cache each time: what the call costs beyond
// its instructions is mostly the cache lines, pages and branch-predictor
// entries it touches (bench/bench_clients.py --instructions --simulate counts
// them). The functions of that path are marked ALIASGUARD_HOT, which GCC
// places together in .text.hot, and the rare branches inside them (first
// use, a cache flush) are ALIASGUARD_COLD functions of their own, placed in
// .text.unlikely, so the lines the common case runs are few and adjacent.
// The boxed kernels selective checkpointing's fast path runs for every op of
// a region (fast_path_kernel, write_guard_kernel) are marked the same way,
// their registration sweeps cold.
#define ALIASGUARD_HOT __attribute__((hot))
#define ALIASGUARD_COLD __attribute__((cold, noinline))
