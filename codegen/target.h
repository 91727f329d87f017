/* Targets as kernels are built for them (codegen/target.c). */
#ifndef KILN_TARGET_H
#define KILN_TARGET_H

#include "core.h"

/* The architecture a target name gives kernels: its row of the table, or,
 * for an "sm_NN" (or "sm_NNa") newer than the table, what every later
 * architecture keeps (kiln_target_from_cc names a live device so). No
 * product aliases, no SM count. Signatures name their target so, and a
 * plan for a live device builds its kernels so: any architecture NVRTC
 * compiles for can be planned, built and read back from a cache record.
 * KILN_ERR_NOT_FOUND, listing the known names, for anything else. */
kiln_status kiln_target_arch(const char *name, kiln_target *out);

#endif
