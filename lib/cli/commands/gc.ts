/** `minisandbox gc`: what sandboxes of dead processes left behind. */
import { collectGarbage, defaultStateDir } from '../../sandbox/state.js';
import { absolutePath, type Args, type Command } from '../args.js';

const gcCommand: Command = {
  spec: {
    name: 'gc',
    about: `Removes the private directories of sandboxes whose owning process is gone
(killed, crashed). Sandboxes of live processes are left alone; the check
uses the owner's pid and start time, so a reused pid is not mistaken for
the owner. Nothing outside the state directory is touched.`,
    options: {
      '--state-dir': { values: ['DIR'], check: absolutePath, default: defaultStateDir(), option: 'stateDir', help: 'The state directory' },
      '--json': { help: 'Print what was removed, kept and not removed as JSON' },
    },
    exitCodes: 'Exit code: 0, or 1 if a directory could not be removed.',
  },
  async run(args: Args) {
    const r = await collectGarbage(args.get('--state-dir')!);
    if (args.has('--json')) {
      process.stdout.write(JSON.stringify(r, null, 2) + '\n');
    } else {
      for (const d of r.removed) process.stdout.write(`removed ${d}\n`);
      for (const f of r.failed) process.stdout.write(`FAILED  ${f.dir}: ${f.reason}\n`);
      process.stdout.write(`${r.removed.length} removed, ${r.kept.length} in use, ${r.failed.length} failed\n`);
    }
    return r.failed.length ? 1 : 0;
  },
};

export const commands = [gcCommand];
