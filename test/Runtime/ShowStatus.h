/*===- ShowStatus.h - printing runtime answers in the C test programs ---===*\
|*                                                                            *|
|* One line a call, "what: status N: message" (or "ok"), for FileCheck; the  *|
|* message is freed.                                                          *|
|*                                                                            *|
\*===----------------------------------------------------------------------===*/

#ifndef ATTNRES_TEST_RUNTIME_SHOWSTATUS_H
#define ATTNRES_TEST_RUNTIME_SHOWSTATUS_H

#include "attnres-c/Runtime.h"

#include <stdio.h>

static void show(const char *what, AttnresStatus status, char *error) {
  printf("%s: status %d: %s\n", what, (int)status, error ? error : "ok");
  attnresFreeString(error);
}

/* The call must run before `error` is read: argument evaluation order is
 * unspecified in C. */
#define SHOW(what, call)                                                       \
  do {                                                                         \
    error = NULL;                                                              \
    AttnresStatus shown = (call);                                              \
    show(what, shown, error);                                                  \
  } while (0)

#endif /* ATTNRES_TEST_RUNTIME_SHOWSTATUS_H */
