/**
 * Output floods against a real `minisandbox serve` process: what a request
 * keeps is bounded per stream, the reply says what was cut, the server's
 * peak memory (VmHWM) stays bounded, and it keeps serving afterwards.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServer } from '../../lib/server/index.js';
import { ConfigError } from '../../lib/sandbox/errors.js';
import { DEFAULT_MAX_OUTPUT_BYTES } from '../../lib/shell/index.js';
import { bashAction, commandReq, createSessionReq, get, peakRssMiB, post, resetPeakRss, serveSync, startServe, type ServeProcess } from './helpers.js';

const MiB = 1024 * 1024;
const MARKER = /\n\[\.\.\. (\d+) bytes truncated \.\.\.\]\n/;

/**
 * What one flooding request may add to the server's peak memory. Per kept
 * byte, the server holds the raw bytes, their concatenation, the decoded
 * string, the JSON-escaped reply with its builder's slack, and the HTTP
 * body: about 9-13 copies measured (the session path cleans the terminal
 * text too). On top, the stream chunks read at several hundred MB/s pile up
 * until V8 collects them: about 35 MiB measured. Both doubled for noise,
 * this is still a tenth of what the unbounded server took (~780 MiB).
 */
const floodAllowanceMiB = (capBytes: number) => (2 * 13 * capBytes) / MiB + 70;

const h = (token: string) => ({ 'x-api-key': token });

describe('a flood through the default cap', () => {
  let s: ServeProcess;
  const token = 'flood-' + process.pid;

  beforeAll(async () => {
    s = await startServe(['--auth-token', token]);
    // Warm up: the default sandbox, a session, one command of each kind.
    expect((await post(`${s.url}/execute`, commandReq('true', { shell: true }), h(token))).status).toBe(200);
    expect((await post(`${s.url}/create_session`, createSessionReq(), h(token))).status).toBe(200);
    expect((await post(`${s.url}/run_in_session`, bashAction('true'), h(token))).status).toBe(200);
  });

  afterAll(async () => {
    await s?.stop();
  });

  it('/execute keeps the head and tail of each stream, runs to the end, and memory stays bounded', async () => {
    resetPeakRss(s.pid);
    const before = peakRssMiB(s.pid);
    // 400 MB on stdout and 300 MB on stderr, then a last line on each and an exit code.
    const flood = 'yes | head -c 400000000; yes e | head -c 300000000 >&2; echo TAIL-OUT; echo TAIL-ERR >&2; exit 3';
    const r = await post(`${s.url}/execute`, commandReq(flood, { shell: true }), h(token));
    const grew = peakRssMiB(s.pid) - before;
    console.log(`/execute flood of 700 MB: server VmHWM ${before.toFixed(0)} -> ${(before + grew).toFixed(0)} MiB`);
    expect(r.status).toBe(200);
    expect(r.body.exit_code).toBe(3);
    for (const [text, line, total] of [
      [r.body.stdout as string, 'y\n', 400_000_000 + 'TAIL-OUT\n'.length],
      [r.body.stderr as string, 'e\n', 300_000_000 + 'TAIL-ERR\n'.length],
    ] as const) {
      const m = MARKER.exec(text);
      expect(m, 'the reply says the output was cut').not.toBeNull();
      const [head, tail] = text.split(m![0]);
      expect(head!.startsWith(line.repeat(100))).toBe(true);
      expect(tail!.endsWith(`${line}${line}TAIL-${line === 'y\n' ? 'OUT' : 'ERR'}\n`)).toBe(true);
      expect(head!.length + Number(m![1]) + tail!.length).toBe(total);
      expect(head!.length + tail!.length).toBe(DEFAULT_MAX_OUTPUT_BYTES);
    }
    expect(grew).toBeLessThan(floodAllowanceMiB(DEFAULT_MAX_OUTPUT_BYTES));
    // Still serving, the flooded sandbox included.
    expect((await get(`${s.url}/is_alive`, h(token))).body).toEqual({ is_alive: true, message: '' });
    expect((await post(`${s.url}/execute`, commandReq('echo ok', { shell: true }), h(token))).body).toEqual({ stdout: 'ok\n', stderr: '', exit_code: 0 });
  });

  it('run_in_session keeps the head and tail of a flood, and memory stays bounded', async () => {
    resetPeakRss(s.pid);
    const before = peakRssMiB(s.pid);
    // The terminal turns each \n into \r\n in the kernel at ~9 MB/s on our
    // VM (`yes` would take a minute for 500 MB); long lines pass at ~100 MB/s.
    const flood = "head -c 300000000 /dev/zero | tr '\\0' a; echo; echo END";
    const r = await post(`${s.url}/run_in_session`, bashAction(flood, { timeout: 120 }), h(token));
    const grew = peakRssMiB(s.pid) - before;
    console.log(`run_in_session flood of 300 MB: server VmHWM ${before.toFixed(0)} -> ${(before + grew).toFixed(0)} MiB`);
    expect(r.status).toBe(200);
    expect(r.body.exit_code).toBe(0);
    const out = r.body.output as string;
    const m = MARKER.exec(out);
    expect(m, 'the reply says the output was cut').not.toBeNull();
    expect(out.startsWith('a'.repeat(1000))).toBe(true);
    expect(out.endsWith('aaaa\nEND\n')).toBe(true);
    expect(out.length).toBeLessThan(DEFAULT_MAX_OUTPUT_BYTES + 100);
    expect(grew).toBeLessThan(floodAllowanceMiB(DEFAULT_MAX_OUTPUT_BYTES));
    expect((await post(`${s.url}/run_in_session`, bashAction('echo ok'), h(token))).body.output).toBe('ok\n');
  });
});

describe('--max-output', () => {
  it('sets what /execute (each stream, merged or not) and a session run keep', async () => {
    const s = await startServe(['--auth-token', 'cap', '--max-output', '64k']);
    try {
      const seq = 'seq 1 100000; seq 1 100000 >&2';
      for (const merge of [false, true]) {
        const r = await post(`${s.url}/execute`, commandReq(seq, { shell: true, merge_output_streams: merge }), h('cap'));
        expect(r.body.exit_code).toBe(0);
        for (const text of merge ? [r.body.stdout] : [r.body.stdout, r.body.stderr]) {
          expect(text.length).toBeLessThan(64 * 1024 + 100);
          expect(text).toMatch(MARKER);
          expect(text.startsWith('1\n2\n3\n')).toBe(true);
          expect(text.endsWith('99999\n100000\n')).toBe(true);
        }
        if (merge) expect(r.body.stderr).toBe('');
      }
      expect((await post(`${s.url}/create_session`, createSessionReq(), h('cap'))).status).toBe(200);
      const run = await post(`${s.url}/run_in_session`, bashAction('seq 1 100000'), h('cap'));
      expect(run.body.output.length).toBeLessThan(64 * 1024 + 100);
      expect(run.body.output).toMatch(MARKER);
      expect(run.body.output.endsWith('99999\n100000\n')).toBe(true);
      // Under the cap nothing is cut and nothing is added.
      const small = await post(`${s.url}/execute`, commandReq('seq 1 1000', { shell: true }), h('cap'));
      expect(small.body.stdout).toBe(Array.from({ length: 1000 }, (_, i) => `${i + 1}\n`).join(''));
    } finally {
      await s.stop();
    }
  });

  it('refuses sizes it cannot honour, naming the option', async () => {
    for (const [v, message] of [
      ['lots', "--max-output: 'lots' must be bytes or a size like '512m'"],
      ['1000', '--max-output: 1000 is below the minimum of 16384 bytes'],
      ['0', '--max-output: 0 is below the minimum'],
    ]) {
      const r = serveSync(['--auth-token', '', '--max-output', v!]);
      expect(r.status).toBe(2);
      expect(r.stderr).toContain(message);
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
    }
    await expect(startServer({ port: 0, authToken: '', maxOutputBytes: 1000 })).rejects.toThrow(ConfigError);
    await expect(startServer({ port: 0, authToken: '', maxOutputBytes: 1000 })).rejects.toThrow(/^maxOutputBytes: expected an integer >= 16384, got 1000$/);
  });
});
