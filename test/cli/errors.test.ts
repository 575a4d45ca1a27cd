/**
 * The CLI's one error boundary, as users meet it: bad input ends in one
 * line naming the flag or argument and the reason, the documented exit
 * code, no stack trace, and nothing created on disk. Every command is
 * strict about its options and explains itself with --help.
 */
import { cpSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { COMMANDS, loadCommand } from '../../lib/cli/commands/index.js';
import type { Command } from '../../lib/cli/args.js';
import { tempDir } from '../helpers.js';
import { cli, confinedEnv, everything, expectError } from './helpers.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const tmp = tempDir('msbx-cli-errors-');
afterAll(() => tmp.remove());

let n = 0;
/** A fresh directory to run in, with `files` in it; what the command left is `left()`. */
function place(files: Record<string, string> = {}): { dir: string; env: NodeJS.ProcessEnv; left: () => string[] } {
  const dir = join(tmp.path, `case-${n++}`);
  mkdirSync(dir);
  for (const [name, content] of Object.entries(files)) writeFileSync(join(dir, name), content);
  return { dir, env: confinedEnv(dir), left: () => everything(dir).filter((f) => !(f in files)) };
}

/** Runs `args` in a fresh place ({dir} in them and in `message`); expects the error and that nothing was created. */
function expectRefused(args: string[], status: number, message: string, files: Record<string, string> = {}, extraEnv: NodeJS.ProcessEnv = {}): string {
  const p = place(files);
  const r = cli(args.map((a) => a.replaceAll('{dir}', p.dir)), { cwd: p.dir, env: { ...p.env, ...extraEnv } });
  expectError(r, status, message.replaceAll('{dir}', p.dir));
  expect(p.left()).toEqual([]);
  return r.stderr;
}

async function allCommands(): Promise<Command[]> {
  const out: Command[] = [];
  for (const entry of COMMANDS) {
    for (const name of entry.subcommands?.map((s) => `${entry.name} ${s}`) ?? [entry.name]) out.push(await loadCommand(entry, name));
  }
  return out;
}

describe('the cases of issue 10', () => {
  it('gc --stat-dir: an unknown option, not silently ignored', () => {
    expectRefused(['gc', '--stat-dir', '/x'], 2, "minisandbox gc: unknown option '--stat-dir' (see 'minisandbox gc --help')");
  });

  it('store ls --bogus: an unknown option, and no store made', () => {
    expectRefused(['store', 'ls', '--bogus'], 2, "minisandbox store ls: unknown option '--bogus'");
  });

  it('env bogus --store DIR: refused before the store is made', () => {
    expectRefused(['env', 'bogus', '--store', '{dir}/store'], 2, "minisandbox env: unknown subcommand 'bogus': expected one of build, ls");
  });

  it('env build --python 9.9: the interpreter is looked for before the store is made, and the error names --python', () => {
    expectRefused(['env', 'build', '--python', '9.9', '--store', '{dir}/store'], 1, 'minisandbox env build: EnvError: --python 9.9: no usable interpreter found in ');
  });

  it('eval missing.jsonl: the file is checked first, named as the argument it is', () => {
    expectRefused(['eval', 'missing.jsonl', '--gold'], 2, 'minisandbox eval: TASKS missing.jsonl: no such file');
    expectRefused(['eval', 'tasks.jsonl', '--predictions', 'none.jsonl'], 2, 'minisandbox eval: --predictions none.jsonl: no such file', { 'tasks.jsonl': '' });
  });

  it('eval of a file whose every task is malformed: each named, then a failure, not "resolved 0/0"', () => {
    const stderr = expectRefused(['eval', 'bad.jsonl', '--gold'], 1, 'minisandbox eval: TASKS bad.jsonl: no valid task to work on (2 rejected, each named above)', {
      'bad.jsonl': '{"instance_id": "x"}\nnot json\n',
    });
    expect(stderr).toMatch(/^skipping task "x" \(line 1\): missing field "repo"/m);
    expect(stderr).toMatch(/^skipping task at line 2: /m);
    expectRefused(['prepare', 'empty.jsonl'], 1, 'minisandbox prepare: TASKS empty.jsonl: no valid task to work on (the file holds none)', { 'empty.jsonl': '' });
    expectRefused(['tasks', 'derive', 'bad.json'], 1, 'minisandbox tasks derive: TASKS bad.json: tasks JSON is not valid JSON', { 'bad.json': '[{' });
  });

  describe('serve on a busy port', () => {
    let busy: Server;
    let port: number;
    beforeAll(async () => {
      busy = createServer();
      await new Promise<void>((resolve) => busy.listen(0, '127.0.0.1', resolve));
      port = (busy.address() as { port: number }).port;
    });
    afterAll(() => new Promise<void>((resolve) => busy.close(() => resolve())));

    it('names the port and the reason, exit 1', () => {
      expectRefused(['serve', '--port', String(port)], 1, `minisandbox serve: --port ${port}: address already in use`, {}, { MINISANDBOX_AUTH_TOKEN: 'tok' });
    });

    it('MINISANDBOX_DEBUG=1 adds the stack, down to the listen error', () => {
      const p = place();
      const r = cli(['serve', '--port', String(port)], { cwd: p.dir, env: { ...p.env, MINISANDBOX_AUTH_TOKEN: 'tok', MINISANDBOX_DEBUG: '1' } });
      expect(r.status).toBe(1);
      expect(r.stderr).toMatch(/^minisandbox serve: --port \d+: address already in use\nCommandError: --port/);
      expect(r.stderr).toMatch(/^\s+at listenError /m);
      expect(r.stderr).toMatch(/^caused by: Error: listen EADDRINUSE/m);
    });
  });
});

describe('errors name the flag the user typed', () => {
  it('a library option is named by its flag, with the values as typed', () => {
    expectRefused(['run', '--ro-bind', '/etc', '/etc2', '--bind', '{dir}/nope', '/x', '--', 'true'], 125, 'minisandbox run: ConfigError: --bind ');
    const stderr = expectRefused(['run', '--ro-bind', '/etc', '/etc2', '--bind', '/no/such/dir', '/x', '--', 'true'], 125, 'bind source /no/such/dir does not exist');
    expect(stderr).toBe('minisandbox run: ConfigError: --bind /no/such/dir /x: bind source /no/such/dir does not exist\n');
    expectRefused(['run', '--size', '64x', '--tmpfs', '/scratch', '--', 'true'], 125, "minisandbox run: ConfigError: --size 64x --tmpfs /scratch: size '64x' must be bytes or a tmpfs size");
    expectRefused(['run', '--chdir', 'rel', '--', 'true'], 125, "minisandbox run: ConfigError: --chdir rel: 'rel' must be an absolute path");
    expectRefused(['run', '--rlimit', 'nofilex=3', '--', 'true'], 125, 'minisandbox run: ConfigError: --rlimit nofilex=3: unknown resource');
    expectRefused(['run', '--seccomp-deny', 'nosuch', '--', 'true'], 125, "minisandbox run: ConfigError: --seccomp-deny: unknown syscall 'nosuch'");
    // lib/env's messages begin with the recipe field they are about.
    expectRefused(['env', 'build', '--python', '3', '--venv-path', 'opt/venv', '--store', '{dir}/s'], 1, 'minisandbox env build: EnvError: --venv-path opt/venv: "opt/venv" must be an absolute path');
    expectRefused(['env', 'build', '--python', '3', '--run', 'true', '--package', 'nope', '--store', '{dir}/s'], 1, 'minisandbox env build: EnvError: --package nope: {dir}/nope is not a directory');
  });

  it('values are checked as they are read, each message naming its flag', () => {
    const cases: [string[], string][] = [
      [['serve', '--memory', '2x'], "minisandbox serve: --memory: '2x' must be bytes or a size like '512m'"],
      [['serve', '--max-output', '1k'], 'minisandbox serve: --max-output: 1k is below the minimum of 16384 bytes (16k)'],
      [['serve', '--port', '99999'], "minisandbox serve: --port: expected a port number (0-65535; 0 picks a free one), got '99999'"],
      [['serve', '--network', 'bridge'], "minisandbox serve: --network: expected none or host, got 'bridge'"],
      [['run', '--net', 'bridge', '--', 'true'], "minisandbox run: --net: expected none or host, got 'bridge'"],
      [['run', '--timeout', '0', '--', 'true'], "minisandbox run: --timeout: expected a positive number of seconds, got '0'"],
      [['run', '--env', '=x', '--', 'true'], "minisandbox run: --env: expected NAME=VALUE, got '=x'"],
      [['run', '--size', '1m', '--', 'true'], 'minisandbox run: --size 1m: no --tmpfs follows it'],
      [['run', '--seccomp', 'none', '--seccomp-deny', 'mkdir', '--', 'true'], 'minisandbox run: --seccomp none cannot be combined with --seccomp-deny'],
      [['run', '--ro-bind', '/etc'], 'minisandbox run: --ro-bind needs 2 values (SRC DST)'],
      [['run', '--tmpfs', '/x'], 'minisandbox run: no command given'],
      [['prepare', 't.jsonl', '--jobs', 'two'], "minisandbox prepare: --jobs: expected a positive integer, got 'two'"],
      [['eval', 't.jsonl', '--gold', '--timeout', '-1'], "minisandbox eval: --timeout: expected a positive number of seconds, got '-1'"],
      [['eval', 't.jsonl'], 'minisandbox eval: give exactly one of --predictions PREDS and --gold'],
      [['eval', 't.jsonl', '--gold', '--report', '/no/such/dir/r.json'], 'minisandbox eval: --report /no/such/dir/r.json: directory /no/such/dir: no such file'],
      [['eval', 't.jsonl', '--gold', '--store', '--json'], 'minisandbox eval: --store needs DIR, not the option --json (if it is the value, write --store=--json)'],
      [['eval', 't.jsonl', '--gold', '--store', '--help'], 'minisandbox eval: --store needs DIR, not the option --help'],
      [['eval', 't.jsonl', '--gold', '--jobs', '1', '--jobs', '2'], 'minisandbox eval: --jobs given twice'],
      [['eval', 't.jsonl', '--gold=yes'], 'minisandbox eval: --gold takes no value'],
      [['prepare'], "minisandbox prepare: expected TASKS (see 'minisandbox prepare --help')"],
      [['prepare', 't.jsonl', 'extra'], "minisandbox prepare: unexpected argument 'extra'"],
      [['tasks'], 'minisandbox tasks: no subcommand: expected derive'],
      [['tasks', 'derive', 't.jsonl', '--output', '.'], 'minisandbox tasks derive: --output .: is a directory'],
      [['env', 'build', '--store', '{dir}/s'], 'minisandbox env build: --python is required'],
      [['env', 'build', '--python', '3', '--repo', '.', '--store', '{dir}/s'], 'minisandbox env build: --repo needs --commit'],
      [['store', 'verify', 'zzz'], 'minisandbox store verify: LAYER "zzz": not a layer digest'],
      [['nosuch'], "minisandbox: unknown command 'nosuch'"],
    ];
    for (const [args, message] of cases) expectRefused(args, 2, message, { 't.jsonl': '' });
  });

  it('--name=value is read as --name value', () => {
    const p = place({ 't.jsonl': '' });
    expectError(cli(['prepare', 't.jsonl', '--jobs=0'], { cwd: p.dir, env: p.env }), 2, "--jobs: expected a positive integer, got '0'");
  });
});

describe('every command', () => {
  it('refuses an unknown option with exit 2, before doing anything', async () => {
    for (const command of await allCommands()) {
      expectRefused([...command.spec.name.split(' '), '--bogus'], 2, `minisandbox ${command.spec.name}: unknown option '--bogus' (see 'minisandbox ${command.spec.name} --help')`);
    }
  });

  it('explains each of its options in --help, and nothing else happens', async () => {
    for (const command of await allCommands()) {
      const p = place();
      const r = cli([...command.spec.name.split(' '), '--help'], { cwd: p.dir, env: p.env });
      expect(r.status, r.stderr).toBe(0);
      expect(r.stdout).toMatch(new RegExp(`^Usage: (\\S+=\\S+ )?minisandbox ${command.spec.name} `));
      for (const flag of Object.keys(command.spec.options)) expect(r.stdout).toMatch(new RegExp(`^  ${flag}\\b`, 'm'));
      expect(r.stdout).toMatch(/^Exit code/m);
      expect(p.left()).toEqual([]);
    }
  });

  it('a command with subcommands lists them', () => {
    const r = cli(['store', '--help']);
    expect(r.status).toBe(0);
    for (const sub of ['ls', 'du', 'gc', 'verify']) expect(r.stdout).toContain(`minisandbox store ${sub} `);
  });
});

describe('minisandbox --version and --help', () => {
  const version = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;

  it('--version prints the package version', () => {
    const r = cli(['--version']);
    expect(r).toEqual({ status: 0, stdout: `minisandbox ${version}\n`, stderr: '' });
  });

  it('--help lists every command and the exit codes; no command is a usage error', () => {
    const r = cli(['--help']);
    expect(r.status).toBe(0);
    for (const c of COMMANDS) expect(r.stdout).toMatch(new RegExp(`^  ${c.name} +\\S`, 'm'));
    expect(r.stdout).toContain('125 when\n        the sandbox could not be set up');
    expect(r.stdout).toContain('MINISANDBOX_DEBUG=1');
    const none = cli([]);
    expect(none.status).toBe(2);
    expect(none.stdout).toBe('');
    expect(none.stderr).toMatch(/^Usage: minisandbox COMMAND/);
  });

  it('work without the addon, and a command that needs it fails in one line', () => {
    // The built package without build/ or prebuilds/: the addon cannot load.
    const pkg = join(tmp.path, 'no-addon');
    mkdirSync(join(pkg, 'dist'), { recursive: true });
    for (const f of ['package.json', 'binding.gyp']) cpSync(join(ROOT, f), join(pkg, f));
    cpSync(join(ROOT, 'lib', 'native', 'addon.cjs'), join(pkg, 'lib', 'native', 'addon.cjs'));
    cpSync(join(ROOT, 'dist', 'lib'), join(pkg, 'dist', 'lib'), { recursive: true });
    symlinkSync(join(ROOT, 'node_modules'), join(pkg, 'node_modules'));
    const run = (...args: string[]) => cli(args, { script: join(pkg, 'dist', 'lib', 'cli', 'main.js') });
    expect(run('--version').stdout).toBe(`minisandbox ${version}\n`);
    expect(run('--help').status).toBe(0);
    const r = run('run', '--', 'true');
    expectError(r, 125, 'minisandbox run: ');
    expect(r.stderr).not.toContain('    at ');
  });
});
