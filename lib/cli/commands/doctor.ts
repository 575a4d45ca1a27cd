/** `minisandbox doctor`: which kernel features work here. */
import { ID_RANGE_CHECK, doctor } from '../../sandbox/doctor.js';
import type { Args, Command } from '../args.js';

const doctorCommand: Command = {
  spec: {
    name: 'doctor',
    about: `Checks, by starting small sandboxes, which kernel features work here:
user namespaces (and the sysctls that disable them), pivot_root, pidfd,
fresh /proc and devpts, overlayfs with userxattr, cgroups, an id range
for ids: 'range' (/etc/subuid and newuidmap). Explains why
wherever something fails.`,
    options: { '--json': { help: 'Print the checks as JSON' } },
    exitCodes: 'Exit code: 0 if every required feature works, 1 if one is missing.',
  },
  async run(args: Args) {
    const checks = await doctor();
    if (args.has('--json')) {
      process.stdout.write(JSON.stringify(checks, null, 2) + '\n');
    } else {
      for (const c of checks) process.stdout.write(`${c.ok ? 'ok  ' : 'FAIL'}  ${c.name}\n      ${c.detail}\n`);
    }
    // Optional: limits fall back to rlimits, and without an id range a
    // sandbox maps one id (images' owners squashed).
    const optional = new Set(['cgroups', '/dev/fuse', ID_RANGE_CHECK]);
    const required = checks.filter((c) => !optional.has(c.name));
    return required.every((c) => c.ok) ? 0 : 1;
  },
};

export const commands = [doctorCommand];
