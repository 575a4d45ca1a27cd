#!/bin/sh
# Regenerates syscall_names.inc: every syscall name of x86_64 and of the
# generic table (aarch64), each guarded so that only the compiled
# architecture's numbers end up in the addon. Run from native/:
#   ./gen_syscall_names.sh > syscall_names.inc
set -eu
inc=/usr/include
{
  sed -n 's/^#define __NR_\([a-z0-9_]*\)[[:space:]].*/\1/p' "$inc"/x86_64-linux-gnu/asm/unistd_64.h
  sed -n 's/^#define __NR\(3264\)\{0,1\}_\([a-z0-9_]*\)[[:space:]].*/\2/p' "$inc"/asm-generic/unistd.h
} | grep -v -e '^syscalls$' -e '^arch_specific_syscall$' | sort -u | while read -r name; do
  printf '#ifdef __NR_%s\n    {"%s", __NR_%s},\n#endif\n' "$name" "$name" "$name"
done
# Syscalls newer than these headers: from 424 on, every architecture shares
# one numbering, so the number is known without the header.
for entry in cachestat:451 fchmodat2:452 map_shadow_stack:453 futex_wake:454 futex_wait:455 \
    futex_requeue:456 statmount:457 listmount:458 lsm_get_self_attr:459 lsm_set_self_attr:460 \
    lsm_list_modules:461 mseal:462 setxattrat:463 getxattrat:464 listxattrat:465 removexattrat:466 \
    open_tree_attr:467 file_getattr:468 file_setattr:469; do
  name=${entry%%:*}
  printf '#ifndef __NR_%s\n    {"%s", %s},\n#endif\n' "$name" "$name" "${entry#*:}"
done
