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
