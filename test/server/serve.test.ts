/**
 * `minisandbox serve` in its own process: where the auth token comes from,
 * and that it shows up nowhere another user or a sandbox could read it.
 */
import { chmodSync, chownSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { isRoot, tempDir, waitFor } from '../helpers.js';
import { bashAction, call, cleanEnv, commandReq, createSessionReq, post, serveSync, startServe, type ServeProcess } from './helpers.js';

const dir = tempDir('msbx-serve-test-');
afterAll(() => dir.remove());

const newToken = () => `tok-${Math.random().toString(36).slice(2)}-${process.pid}`;

function tokenFile(content: string, mode = 0o600): string {
  const path = join(dir.path, `token-${Math.random().toString(36).slice(2)}`);
  writeFileSync(path, content);
  chmodSync(path, mode);
  return path;
}

const cmdline = (pid: number) => readFileSync(`/proc/${pid}/cmdline`, 'utf8');

/** 200 with the token, 401 with another, 403 without. */
async function expectAuth(url: string, token: string): Promise<void> {
  expect((await call(`${url}/is_alive`, 'GET', undefined, { 'x-api-key': token })).status).toBe(200);
  expect((await call(`${url}/is_alive`, 'GET', undefined, { 'x-api-key': token + 'x' })).status).toBe(401);
  expect((await call(`${url}/is_alive`, 'GET', undefined, {})).status).toBe(403);
}

/**
 * What a sandbox created through the server can read: its environment,
 * a session's environment, and every /proc/<pid>/{cmdline,environ} it sees
 * (its PID 1 and the monitors are copies of the server process).
 */
async function sandboxSees(s: ServeProcess, token: string): Promise<string> {
  const h = { 'x-api-key': token };
  const { body } = await post(`${s.url}/sandboxes`, {}, h);
  const probe = 'env; for f in /proc/[0-9]*/cmdline /proc/[0-9]*/environ; do tr "\\0" " " < "$f"; echo; done 2>/dev/null';
  const ex = await post(`${body.url}/execute`, commandReq(probe, { shell: true }), h);
  expect(ex.status).toBe(200);
  expect(ex.body.stdout).toContain('PATH=');
  expect((await post(`${body.url}/create_session`, createSessionReq(), h)).status).toBe(200);
  const run = await post(`${body.url}/run_in_session`, bashAction(probe, { check: 'silent' }), h);
  expect(run.status).toBe(200);
  return ex.body.stdout + ex.body.stderr + run.body.output;
}

/** Host processes whose parent is `pid`. */
function childrenOf(pid: number): number[] {
  const out: number[] = [];
  for (const e of readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    try {
      if (new RegExp(`^PPid:\\s+${pid}$`, 'm').test(readFileSync(`/proc/${e}/status`, 'utf8'))) out.push(Number(e));
    } catch {
      // gone while we looked
    }
  }
  return out;
}

describe('minisandbox serve: the auth token', () => {
  it('--auth-token-file: its content without the newline is the token, and it is in no command line', async () => {
    const token = newToken();
    const s = await startServe(['--auth-token-file', tokenFile(token + '\n')]);
    try {
      await expectAuth(s.url, token);
      expect(cmdline(s.pid)).not.toContain(token);
      expect(await sandboxSees(s, token)).not.toContain(token);
      expect(s.stderr()).not.toContain('warning');
    } finally {
      await s.stop();
    }
  });

  it(`MINISANDBOX_AUTH_TOKEN: read once, then gone from the server's children and its sandboxes`, async () => {
    const token = newToken();
    const s = await startServe([], cleanEnv({ MINISANDBOX_AUTH_TOKEN: token }));
    try {
      await expectAuth(s.url, token);
      expect(cmdline(s.pid)).not.toContain(token);
      const seen = await sandboxSees(s, token);
      expect(seen).not.toContain(token);
      expect(seen).not.toContain('MINISANDBOX_AUTH_TOKEN');

      // A host child: the sessions' syntax checker, a long-lived bash the
      // first non-trivial command starts (this one does not parse, so it is
      // never typed into the shell). Its environ is what it inherited.
      const h = { 'x-api-key': token };
      expect((await post(`${s.url}/create_session`, createSessionReq(), h)).status).toBe(200);
      const r = await post(`${s.url}/run_in_session`, bashAction('echo "unclosed'), h);
      expect(r.body.swerexception?.class_path).toMatch(/BashIncorrectSyntaxError$/);
      let caught: string | null = null;
      for (const pid of childrenOf(s.pid)) {
        try {
          if (cmdline(pid).startsWith('bash\0--norc\0--noprofile\0-O\0extglob\0-c')) caught = readFileSync(`/proc/${pid}/environ`, 'utf8');
        } catch {
          // it exited
        }
      }
      expect(caught, 'the syntax checker is not a child of the server').not.toBeNull();
      expect(caught).toContain('PATH=');
      expect(caught).not.toContain('MINISANDBOX_AUTH_TOKEN');
      expect(caught).not.toContain(token);
    } finally {
      await s.stop();
    }
  });

  it('--auth-token: still works (as swerex-remote), hidden from ps and from sandboxes once started, with a warning', async () => {
    const token = newToken();
    const s = await startServe(['--auth-token', token]);
    try {
      await expectAuth(s.url, token);
      expect(cmdline(s.pid)).not.toContain(token);
      expect(cmdline(s.pid)).toContain('serve --port 0 --auth-token ***');
      expect(await sandboxSees(s, token)).not.toContain(token);
      expect(s.stderr()).toMatch(/warning: --auth-token showed the token .*--auth-token-file or MINISANDBOX_AUTH_TOKEN/);
    } finally {
      await s.stop();
    }
  });

  it('--auth-token=TOKEN: hidden from ps as well', async () => {
    const token = newToken();
    const s = await startServe([`--auth-token=${token}`]);
    try {
      await expectAuth(s.url, token);
      expect(cmdline(s.pid)).not.toContain(token);
      expect(cmdline(s.pid)).toContain('serve --port 0 --auth-token=***');
    } finally {
      await s.stop();
    }
  });

  it("an explicit --auth-token '' still turns authentication off", async () => {
    const s = await startServe(['--auth-token', '']);
    try {
      expect((await call(`${s.url}/is_alive`, 'GET', undefined, {})).status).toBe(200);
      expect(s.stderr()).toContain('authentication disabled');
    } finally {
      await s.stop();
    }
  });

  it('refuses more than one source, naming them, and none at all', () => {
    const file = tokenFile('x\n');
    const cases: Array<[string[], NodeJS.ProcessEnv, string]> = [
      [['--auth-token', 'a', '--auth-token-file', file], cleanEnv(), '--auth-token and --auth-token-file both give the auth token'],
      [['--auth-token-file', file], cleanEnv({ MINISANDBOX_AUTH_TOKEN: 'a' }), '--auth-token-file and MINISANDBOX_AUTH_TOKEN both give the auth token'],
      [['--auth-token', ''], cleanEnv({ MINISANDBOX_AUTH_TOKEN: 'a' }), '--auth-token and MINISANDBOX_AUTH_TOKEN both give the auth token'],
      [['--auth-token', 'a', '--auth-token', 'b'], cleanEnv(), '--auth-token given twice'],
      [[], cleanEnv(), 'an auth token is required: --auth-token-file FILE, MINISANDBOX_AUTH_TOKEN, or --auth-token TOKEN'],
    ];
    for (const [args, env, message] of cases) {
      const r = serveSync(args, env);
      expect(r.status, r.stderr).toBe(2);
      expect(r.stderr).toMatch(/^minisandbox serve: /);
      expect(r.stderr).toContain(message);
    }
  });

  it('explains a bad token file or variable in one line, never with a stack', () => {
    const open = tokenFile('x\n', 0o640);
    const cases: Array<[string[], NodeJS.ProcessEnv, string]> = [
      [['--auth-token-file', '/no/such/token'], cleanEnv(), '--auth-token-file /no/such/token: no such file'],
      [['--auth-token-file', dir.path], cleanEnv(), `--auth-token-file ${dir.path}: not a regular file`],
      [['--auth-token-file', open], cleanEnv(), `--auth-token-file ${open}: mode 0640 lets group or others read or replace the token; chmod 600 ${open}`],
      [['--auth-token-file', tokenFile('')], cleanEnv(), "the file is empty (to turn authentication off, pass --auth-token '')"],
      [['--auth-token-file', tokenFile('\n')], cleanEnv(), 'the file is empty'],
      [['--auth-token-file', tokenFile('a\nb\n')], cleanEnv(), 'no client could send this token: it contains a line break'],
      [['--auth-token-file', tokenFile('tok \n')], cleanEnv(), 'no client could send this token: it starts or ends with whitespace'],
      [['--auth-token-file', tokenFile('x'.repeat(5000))], cleanEnv(), '5000 bytes is too much for a token'],
      [[], cleanEnv({ MINISANDBOX_AUTH_TOKEN: '' }), "MINISANDBOX_AUTH_TOKEN is set but empty (to turn authentication off, pass --auth-token '')"],
      [['--auth-token-file'], cleanEnv(), '--auth-token-file needs 1 value'],
    ];
    for (const [args, env, message] of cases) {
      const r = serveSync(args, env);
      expect(r.status, r.stderr).toBe(2);
      expect(r.stderr).toContain(message);
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
      expect(r.stderr).toMatch(/^minisandbox serve: /);
    }
  });

  it.skipIf(!isRoot)("accepts a readable file another user owns (a secret mounted for the service), as ssh does", async () => {
    const token = newToken();
    const file = tokenFile(token + '\n', 0o644);
    chownSync(file, 65534, 65534);
    const s = await startServe(['--auth-token-file', file]);
    try {
      await expectAuth(s.url, token);
    } finally {
      await s.stop();
    }
  });

  it('--help describes the three sources and recommends the file or the variable', () => {
    const r = serveSync(['--help']);
    expect(r.status).toBe(0);
    for (const source of ['--auth-token-file FILE', 'MINISANDBOX_AUTH_TOKEN', '--auth-token TOKEN']) expect(r.stdout).toContain(source);
    expect(r.stdout).toContain('Prefer the file or the variable');
  });
});

describe('the request log', () => {
  it('writes one line per request: time, method, path, status, duration; --quiet writes none', async () => {
    const token = newToken();
    const s = await startServe(['--auth-token-file', tokenFile(token)]);
    try {
      await call(`${s.url}/is_alive`, 'GET', undefined, { 'x-api-key': token });
      await call(`${s.url}/no/such/route`, 'GET', undefined, { 'x-api-key': token });
      await call(`${s.url}/is_alive`, 'GET', undefined, { 'x-api-key': 'wrong' });
      const logged = () => s.stderr().split('\n').filter((l) => / \/(is_alive|no\/such\/route) /.test(l));
      // The line follows the reply: it may reach us just after it.
      await waitFor(() => logged().length === 3);
      const lines = logged();
      expect(lines).toHaveLength(3);
      expect(lines[0]).toMatch(/^\d{4}-\d\d-\d\dT[\d:.]+Z GET \/is_alive 200 \d+\.\dms$/);
      expect(lines[1]).toMatch(/ GET \/no\/such\/route 404 /);
      expect(lines[2]).toMatch(/ GET \/is_alive 401 /);
      expect(s.stderr()).not.toContain(token);
    } finally {
      await s.stop();
    }
    const quiet = await startServe(['--auth-token-file', tokenFile(token), '--quiet']);
    try {
      await call(`${quiet.url}/is_alive`, 'GET', undefined, { 'x-api-key': token });
      expect(quiet.stderr()).not.toMatch(/ GET \/is_alive /);
    } finally {
      await quiet.stop();
    }
  });
});
