import { collectGarbage, defaultStateDir } from '../../sandbox/state.js';

export const GC_HELP = `Usage: minisandbox gc [--state-dir DIR] [--json]

Removes the private directories of sandboxes whose owning process is gone
(killed, crashed). Sandboxes of live processes are left alone; the check
uses the owner's pid and start time, so a reused pid is not mistaken for
the owner. Nothing outside the state directory is touched.
Default state directory: ${defaultStateDir()}`;

export async function gcCommand(args: string[]): Promise<number> {
  const i = args.indexOf('--state-dir');
  const dir = i >= 0 ? args[i + 1] : defaultStateDir();
  if (!dir) {
    process.stderr.write('minisandbox gc: --state-dir needs a directory\n');
    return 2;
  }
  const r = await collectGarbage(dir);
  if (args.includes('--json')) {
    process.stdout.write(JSON.stringify(r, null, 2) + '\n');
  } else {
    for (const d of r.removed) process.stdout.write(`removed ${d}\n`);
    for (const f of r.failed) process.stdout.write(`FAILED  ${f.dir}: ${f.reason}\n`);
    process.stdout.write(`${r.removed.length} removed, ${r.kept.length} in use, ${r.failed.length} failed\n`);
  }
  return r.failed.length ? 1 : 0;
}
