/**
 * The SWE-ReX endpoints over real HTTP, at the root (default sandbox) and
 * under /sandboxes/<id>, with requests shaped like the Python client's.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../../lib/server/index.js';
import { tempDir } from '../helpers.js';
import {
  bashAction,
  closeSessionReq,
  commandReq,
  createSessionReq,
  get,
  interruptAction,
  post,
  readFileReq,
  start,
  upload,
  uploadForm,
  writeFileReq,
} from './helpers.js';

let server: RunningServer;
let base: string; // a per-sandbox base URL
const host = tempDir('msbx-server-test-');

beforeAll(async () => {
  server = await start();
  const created = await post(`${server.url}/sandboxes`, {});
  expect(created.status).toBe(200);
  base = created.body.url;
});

afterAll(async () => {
  await server.close();
  host.remove();
});

describe('basics', () => {
  it('answers hello world and is_alive at the root and per sandbox', async () => {
    for (const url of [server.url, base]) {
      expect((await get(`${url}/`)).body).toEqual({ message: 'hello world' });
      expect((await get(`${url}/is_alive`)).body).toEqual({ is_alive: true, message: '' });
    }
  });
});

describe('sessions', () => {
  it('keeps cd and export between runs, at the root (default sandbox)', async () => {
    const created = await post(`${server.url}/create_session`, createSessionReq());
    expect(created).toMatchObject({ status: 200, body: { output: '', session_type: 'bash' } });
    await post(`${server.url}/run_in_session`, bashAction('cd /tmp && export GREETING=hello'));
    const r = await post(`${server.url}/run_in_session`, bashAction('pwd; echo $GREETING'));
    expect(r.status).toBe(200);
    expect(r.body).toEqual({ output: '/tmp\nhello\n', exit_code: 0, failure_reason: '', expect_string: 'SHELLPS1PREFIX', session_type: 'bash' });
    // A second create of the same name is SessionExistsError.
    const again = await post(`${server.url}/create_session`, createSessionReq());
    expect(again.status).toBe(511);
    expect(again.body.swerexception.class_path).toBe('swerex.exceptions.SessionExistsError');
    expect((await post(`${server.url}/close_session`, closeSessionReq())).body).toEqual({ session_type: 'bash' });
  });

  it('sources startup files and reports their output', async () => {
    await post(`${base}/write_file`, writeFileReq('/work/rc.sh', 'echo from-rc\nexport FROM_RC=1\n'));
    const r = await post(`${base}/create_session`, createSessionReq({ session: 'rc', startup_source: ['/work/rc.sh'] }));
    expect(r.status).toBe(200);
    expect(r.body.output).toContain('from-rc');
    expect((await post(`${base}/run_in_session`, bashAction('echo $FROM_RC', { session: 'rc' }))).body.output).toBe('1\n');
    await post(`${base}/close_session`, closeSessionReq('rc'));
  });

  it('handles a failing command under each check mode', async () => {
    await post(`${base}/create_session`, createSessionReq({ session: 'checks' }));
    const run = (check: string) => post(`${base}/run_in_session`, bashAction('echo out; exit_with() { return $1; }; exit_with 3', { session: 'checks', check, error_msg: 'step failed' }));

    const raised = await run('raise');
    expect(raised.status).toBe(511);
    expect(raised.body.swerexception).toMatchObject({ class_path: 'swerex.exceptions.NonZeroExitCodeError' });
    expect(raised.body.swerexception.message).toMatch(/^step failed: Command '.*' failed with exit code 3\. Here is the output:\n'out\\n'$/);
    expect(typeof raised.body.swerexception.traceback).toBe('string');

    expect((await run('silent')).body).toMatchObject({ output: 'out\n', exit_code: 3 });
    expect((await run('ignore')).body).toMatchObject({ output: 'out\n', exit_code: null });

    const syntax = await post(`${base}/run_in_session`, bashAction('echo "unclosed', { session: 'checks' }));
    expect(syntax.status).toBe(511);
    expect(syntax.body.swerexception.class_path).toBe('swerex.exceptions.BashIncorrectSyntaxError');
    expect(syntax.body.swerexception.extra_info).toHaveProperty('bash_stderr');
    await post(`${base}/close_session`, closeSessionReq('checks'));
  });

  it('raises CommandTimeoutError, then bash_interrupt brings the session back', async () => {
    await post(`${base}/create_session`, createSessionReq({ session: 'slow' }));
    await post(`${base}/run_in_session`, bashAction('export KEPT=yes', { session: 'slow' }));
    const t = await post(`${base}/run_in_session`, bashAction('sleep 30', { session: 'slow', timeout: 0.5 }));
    expect(t.status).toBe(511);
    expect(t.body.swerexception.class_path).toBe('swerex.exceptions.CommandTimeoutError');
    expect(t.body.swerexception.message).toBe("timeout after 0.5 seconds while running command 'sleep 30'");

    const i = await post(`${base}/run_in_session`, interruptAction({ session: 'slow' }));
    expect(i.status).toBe(200);
    expect(i.body).toMatchObject({ exit_code: 0, session_type: 'bash' });

    const after = await post(`${base}/run_in_session`, bashAction('echo $KEPT', { session: 'slow', timeout: 5 }));
    expect(after.body).toMatchObject({ output: 'yes\n', exit_code: 0 });
    await post(`${base}/close_session`, closeSessionReq('slow'));
  });

  it('stops at an expect string and drives an interactive program', async () => {
    await post(`${base}/create_session`, createSessionReq({ session: 'inter' }));
    const r = await post(
      `${base}/run_in_session`,
      bashAction('read -p "name? " N', { session: 'inter', expect: ['name? '], timeout: 5, check: 'ignore' }),
    );
    expect(r.body).toMatchObject({ expect_string: 'name? ', exit_code: null });
    const q = await post(`${base}/run_in_session`, bashAction('world', { session: 'inter', is_interactive_quit: true, timeout: 5 }));
    expect(q.body).toMatchObject({ exit_code: 0 });
    expect((await post(`${base}/run_in_session`, bashAction('echo $N', { session: 'inter', timeout: 5 }))).body.output).toBe('world\n');
    await post(`${base}/close_session`, closeSessionReq('inter'));
  });

  it('reports unknown sessions as SessionDoesNotExistError', async () => {
    for (const [path, body] of [
      ['run_in_session', bashAction('true', { session: 'nope' })],
      ['run_in_session', interruptAction({ session: 'nope' })],
      ['close_session', closeSessionReq('nope')],
    ] as const) {
      const r = await post(`${base}/${path}`, body);
      expect(r.status).toBe(511);
      expect(r.body.swerexception).toMatchObject({ class_path: 'swerex.exceptions.SessionDoesNotExistError', message: "session 'nope' does not exist" });
    }
  });

  it('POST /close closes every session but keeps the sandbox', async () => {
    await post(`${base}/create_session`, createSessionReq({ session: 'c1' }));
    await post(`${base}/write_file`, writeFileReq('/work/kept.txt', 'kept'));
    const r = await post(`${base}/close`);
    expect(r).toMatchObject({ status: 200, body: {} });
    expect((await post(`${base}/run_in_session`, bashAction('true', { session: 'c1' }))).body.swerexception.class_path).toBe(
      'swerex.exceptions.SessionDoesNotExistError',
    );
    expect((await post(`${base}/read_file`, readFileReq('/work/kept.txt'))).body).toEqual({ content: 'kept' });
  });
});

describe('execute', () => {
  it('runs the shell form with cwd and env replacing the environment', async () => {
    const r = await post(
      `${base}/execute`,
      commandReq('pwd; echo "A=$A HOME=${HOME:-unset}"; echo err >&2; exit 4', { shell: true, cwd: '/tmp', env: { A: '1' } }),
    );
    expect(r.body).toEqual({ stdout: '/tmp\nA=1 HOME=unset\n', stderr: 'err\n', exit_code: 4 });
  });

  it('runs the argv form, and a string without shell=True is one program name', async () => {
    expect((await post(`${base}/execute`, commandReq(['printf', '%s|', 'a b', 'c']))).body).toEqual({ stdout: 'a b|c|', stderr: '', exit_code: 0 });
    const r = await post(`${base}/execute`, commandReq('echo hi'));
    expect(r.status).toBe(511);
    expect(r.body.swerexception).toMatchObject({ class_path: 'builtins.FileNotFoundError', message: "[Errno 2] No such file or directory: 'echo hi'" });
  });

  it('merges the output streams in order', async () => {
    const r = await post(`${base}/execute`, commandReq(['/bin/sh', '-c', 'echo 1; echo 2 >&2; echo 3'], { merge_output_streams: true }));
    expect(r.body).toEqual({ stdout: '1\n2\n3\n', stderr: '', exit_code: 0 });
    const withEnv = await post(`${base}/execute`, commandReq(['missing-program'], { merge_output_streams: true, env: {} }));
    expect(withEnv.body.swerexception.class_path).toBe('builtins.FileNotFoundError');
  });

  it('raises NonZeroExitCodeError with check=true, CommandTimeoutError on timeout', async () => {
    const r = await post(`${base}/execute`, commandReq('exit 2', { shell: true, check: true, error_msg: 'oops' }));
    expect(r.status).toBe(511);
    expect(r.body.swerexception.class_path).toBe('swerex.exceptions.NonZeroExitCodeError');
    expect(r.body.swerexception.message).toBe("oops: Command 'exit 2' failed with exit code 2. Stdout:\n''\nStderr:\n''");
    const t0 = Date.now();
    const t = await post(`${base}/execute`, commandReq('sleep 20', { shell: true, timeout: 0.3 }));
    expect(t.body.swerexception).toMatchObject({ class_path: 'swerex.exceptions.CommandTimeoutError', message: 'Timeout (0.3s) exceeded while running command' });
    expect(Date.now() - t0).toBeLessThan(5000);
  });

  it('reports a missing cwd as FileNotFoundError', async () => {
    const r = await post(`${base}/execute`, commandReq(['pwd'], { cwd: '/no/such/dir' }));
    expect(r.body.swerexception).toMatchObject({ class_path: 'builtins.FileNotFoundError', message: "[Errno 2] No such file or directory: '/no/such/dir'" });
  });
});

describe('files', () => {
  it('writes (creating parents) and reads back, with encodings and errors', async () => {
    expect((await post(`${base}/write_file`, writeFileReq('/work/deep/er/f.txt', 'héllo\n'))).body).toEqual({});
    expect((await post(`${base}/read_file`, readFileReq('/work/deep/er/f.txt'))).body).toEqual({ content: 'héllo\n' });
    expect((await post(`${base}/read_file`, readFileReq('deep/er/f.txt', 'latin-1'))).body).toEqual({ content: 'hÃ©llo\n' });
    await post(`${base}/execute`, commandReq(['/bin/sh', '-c', "printf 'a\\377b' > /work/bin.dat"]));
    const strict = await post(`${base}/read_file`, readFileReq('/work/bin.dat'));
    expect(strict.body.swerexception.class_path).toBe('builtins.UnicodeDecodeError');
    expect((await post(`${base}/read_file`, readFileReq('/work/bin.dat', 'utf-8', 'backslashreplace'))).body).toEqual({ content: 'a\\xffb' });
    expect((await post(`${base}/read_file`, readFileReq('/work/bin.dat', 'utf-8', 'replace'))).body).toEqual({ content: 'a\ufffdb' });
  });

  it('maps missing files and directories to Python OSErrors', async () => {
    expect((await post(`${base}/read_file`, readFileReq('/work/none.txt'))).body.swerexception).toMatchObject({
      class_path: 'builtins.FileNotFoundError',
      message: "[Errno 2] No such file or directory: '/work/none.txt'",
    });
    expect((await post(`${base}/read_file`, readFileReq('/work'))).body.swerexception.class_path).toBe('builtins.IsADirectoryError');
  });

  it('keeps traversal attempts inside the sandbox', async () => {
    const marker = join(host.path, 'escape.txt');
    const sneaky = `/work/../../../..${marker}`;
    expect((await post(`${base}/write_file`, writeFileReq(sneaky, 'pwned'))).status).toBe(200);
    expect(existsSync(marker)).toBe(false); // the host path was never touched
    // It landed in the sandbox's own (private) view of that path.
    expect((await post(`${base}/read_file`, readFileReq(marker))).body).toEqual({ content: 'pwned' });

    const secret = join(host.path, 'secret.txt');
    writeFileSync(secret, 'host secret');
    const r = await post(`${base}/read_file`, readFileReq(`../../../../..${secret}`));
    expect(r.body.swerexception.class_path).toBe('builtins.FileNotFoundError');
    expect((await post(`${base}/read_file`, readFileReq('/etc/shadow'))).body.swerexception.class_path).toBe('builtins.FileNotFoundError');
  });
});

describe('upload', () => {
  it('unpacks a zipped directory (zip -r) into target_path', async () => {
    const src = join(host.path, 'proj');
    mkdirSync(join(src, 'pkg', 'sub'), { recursive: true });
    writeFileSync(join(src, 'README.md'), '# proj\n');
    writeFileSync(join(src, 'pkg', 'sub', 'mod.py'), 'print(1)\n');
    const zip = join(host.path, 'proj.zip');
    execFileSync('zip', ['-qr', zip, '.'], { cwd: src });
    const r = await upload(base, uploadForm(readFileSync(zip), '/work/uploaded/proj', true));
    expect(r).toMatchObject({ status: 200, body: {} });
    const ls = await post(`${base}/execute`, commandReq('cd /work/uploaded/proj && find . -type f | sort && cat pkg/sub/mod.py', { shell: true }));
    expect(ls.body.stdout).toBe('./README.md\n./pkg/sub/mod.py\nprint(1)\n');
  });

  it('writes a single file at target_path, creating parents', async () => {
    const data = Buffer.from([0, 1, 2, 255, 10]);
    const r = await upload(base, uploadForm(data, '/work/single/dir/blob.bin', false, 'blob.bin'));
    expect(r).toMatchObject({ status: 200, body: {} });
    const od = await post(`${base}/execute`, commandReq(['od', '-An', '-tu1', '/work/single/dir/blob.bin']));
    expect(od.body.stdout.trim().split(/\s+/)).toEqual(['0', '1', '2', '255', '10']);
  });

  it('refuses zip entries escaping target_path and non-zips', async () => {
    const evil = join(host.path, 'evil.zip');
    execFileSync('python3', ['-c', 'import sys, zipfile\nz = zipfile.ZipFile(sys.argv[1], "w")\nz.writestr("ok.txt", "ok")\nz.writestr("../../escaped.txt", "bad")\nz.close()', evil]);
    const r = await upload(base, uploadForm(readFileSync(evil), '/work/evil', true));
    expect(r.status).toBe(511);
    expect(r.body.swerexception.class_path).toBe('builtins.ValueError');
    expect(r.body.swerexception.message).toContain('outside the target directory');
    const nothing = await post(`${base}/execute`, commandReq('ls /work/evil /escaped.txt /work/escaped.txt 2>&1 | wc -l', { shell: true }));
    expect(nothing.body.stdout.trim()).not.toBe('0'); // ls only printed errors
    expect((await post(`${base}/read_file`, readFileReq('/escaped.txt'))).status).toBe(511);

    const bad = await upload(base, uploadForm(Buffer.from('not a zip'), '/work/x', true));
    expect(bad.body.swerexception.class_path).toBe('zipfile.BadZipFile');
  });

  it('validates the form fields (422)', async () => {
    const form = new FormData();
    form.append('target_path', '/work/x');
    const r = await upload(base, form);
    expect(r.status).toBe(422);
    expect(r.body.detail[0].loc).toEqual(['body', 'file']);
  });
});
