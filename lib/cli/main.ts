#!/usr/bin/env node
/**
 * The `minisandbox` command: finds the command, reads its arguments by its
 * spec, runs it. Every error a command throws, or leaves unhandled, ends in
 * reportError: one message and an exit code, never a stack trace.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { packageRoot } from '../native/packageRoot.js';
import { parseArgs, renderHelp, UsageError, type Args, type Command } from './args.js';
import { DEBUG_ENV, reportError } from './boundary.js';
import { COMMANDS, loadCommand, type CommandEntry } from './commands/index.js';

const EXIT_CODES = `Exit codes:
  0     done
  1     failed: an error, or part of the work failed (each command's --help
        says which)
  2     usage error: the command line is wrong; nothing was done
  run:  the command's own exit code, 128+N when a signal N killed it, 125 when
        the sandbox could not be set up (or minisandbox failed otherwise)`;

function mainHelp(): string {
  const width = Math.max(...COMMANDS.map((c) => c.name.length)) + 2;
  const rows = COMMANDS.map((c) => `  ${c.name.padEnd(width)}${c.summary}${c.subcommands ? ` (${c.subcommands.join(', ')})` : ''}`);
  return `Usage: minisandbox COMMAND [OPTIONS]
       minisandbox --version

Container-free sandboxes for software-engineering agents.

Commands:
${rows.join('\n')}

Run 'minisandbox COMMAND --help' for a command's options.

${EXIT_CODES}

Errors are one line, without a stack trace; ${DEBUG_ENV}=1 adds the stack.
`;
}

function groupHelp(entry: CommandEntry, commands: readonly Command[]): string {
  const usage = commands.map((c) => renderHelp(c.spec).split('\n\n')[0]!.replace(/^Usage: /, '').replace(/^ {7}/gm, ''));
  return `Usage: ${usage.join('\n').replace(/\n/g, '\n       ')}

${entry.summary}.

Run 'minisandbox ${entry.name} SUBCOMMAND --help' for what each does and its options.
`;
}

function version(): string {
  return (JSON.parse(readFileSync(join(packageRoot(), 'package.json'), 'utf8')) as { version: string }).version;
}

/** Runs the command line `argv` (without node and the script); resolves to the exit code. */
export async function main(argv: readonly string[]): Promise<number> {
  const [first, ...rest] = argv;
  if (first === '-h' || first === '--help' || first === 'help') {
    process.stdout.write(mainHelp());
    return 0;
  }
  if (first === '--version') {
    process.stdout.write(`minisandbox ${version()}\n`);
    return 0;
  }
  if (first === undefined) {
    process.stderr.write(mainHelp());
    return 2;
  }
  const entry = COMMANDS.find((c) => c.name === first);
  if (!entry) {
    const what = first.startsWith('-') ? 'option' : 'command';
    process.stderr.write(`minisandbox: unknown ${what} '${first}' (commands: ${COMMANDS.map((c) => c.name).join(', ')}; see 'minisandbox --help')\n`);
    return 2;
  }
  let name = entry.name;
  let args = rest;
  let command: Command | undefined;
  let parsed: Args | undefined;
  // Anything thrown from here on, and anything left unhandled while the
  // command runs (an 'error' event nobody listened to), ends here.
  const fail = (e: unknown) => reportError(name, e, parsed?.origins ?? new Map(), entry.failureExit ?? 1);
  const uncaught = (e: unknown) => {
    process.exitCode = fail(e);
    process.exit();
  };
  process.on('uncaughtException', uncaught);
  process.on('unhandledRejection', uncaught);
  try {
    if (entry.subcommands) {
      const [sub, ...subArgs] = rest;
      if (sub === '-h' || sub === '--help') {
        process.stdout.write(groupHelp(entry, (await entry.load()).commands));
        return 0;
      }
      if (sub === undefined || !entry.subcommands.includes(sub)) {
        const list = entry.subcommands.length === 1 ? entry.subcommands[0] : `one of ${entry.subcommands.join(', ')}`;
        throw new UsageError(`${sub === undefined ? 'no subcommand' : `unknown subcommand '${sub}'`}: expected ${list} (see 'minisandbox ${entry.name} --help')`);
      }
      name = `${entry.name} ${sub}`;
      args = subArgs;
    }
    command = await loadCommand(entry, name);
    const read = parseArgs(command.spec, args);
    if (read === 'help') {
      process.stdout.write(renderHelp(command.spec));
      return 0;
    }
    parsed = read;
    return await command.run(parsed);
  } catch (e) {
    return fail(e);
  }
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (e: unknown) => {
    // main catches what commands throw: this is a bug of main itself.
    process.exitCode = reportError(undefined, e, new Map(), 1);
  },
);
