import { doctor } from '../../sandbox/doctor.js';

export const DOCTOR_HELP = `Usage: minisandbox doctor [--json]

Checks, by starting small sandboxes, which kernel features work here:
user namespaces (and the sysctls that disable them), pivot_root, pidfd,
fresh /proc and devpts, overlayfs with userxattr, cgroups. Explains why
wherever something fails. Exit code 1 if a required feature is missing.`;

export async function doctorCommand(args: string[]): Promise<number> {
  const checks = await doctor();
  if (args.includes('--json')) {
    process.stdout.write(JSON.stringify(checks, null, 2) + '\n');
  } else {
    for (const c of checks) process.stdout.write(`${c.ok ? 'ok  ' : 'FAIL'}  ${c.name}\n      ${c.detail}\n`);
  }
  const required = checks.filter((c) => c.name !== 'cgroups' && c.name !== '/dev/fuse');
  return required.every((c) => c.ok) ? 0 : 1;
}
