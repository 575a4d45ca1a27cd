import { describe, expect, test } from 'vitest';
import { ChannelClosedError, Expecter, ExpectTimeoutError } from '../../lib/shell/expect.js';
import type { PtyChannel, PtyExitInfo } from '../../lib/shell/pty.js';
import { ansiCQuote, ansiCQuoteChunks, cleanTerminalText } from '../../lib/shell/text.js';

/** In-memory channel: the test pushes "terminal output" by hand. */
function fakeChannel() {
  const data: Array<(b: Buffer) => void> = [];
  const exits: Array<(i: PtyExitInfo) => void> = [];
  const channel: PtyChannel = {
    write: () => {},
    onData: (l) => (data.push(l), () => {}),
    onExit: (l) => void exits.push(l),
    kill: () => {},
  };
  return {
    channel,
    emit: (s: string | Buffer) => data.forEach((l) => l(Buffer.isBuffer(s) ? s : Buffer.from(s))),
    exit: () => exits.forEach((l) => l({ exitCode: 0, signal: null })),
  };
}

describe('Expecter', () => {
  test('finds a marker split across chunks, byte by byte, and keeps what follows', async () => {
    const f = fakeChannel();
    const e = new Expecter(f.channel);
    const p = e.expect([{ regex: /END_(\d+)__/, maxLength: 32 }]);
    for (const ch of Buffer.from('héllo END_42__tail')) f.emit(Buffer.from([ch]));
    const m = await p;
    expect(m).toMatchObject({ index: 0, before: 'héllo ', text: 'END_42__', groups: ['42'] });
    expect(e.peek()).toBe('tail');
  });

  test('earliest match wins among patterns; data that arrived earlier is searched', async () => {
    const f = fakeChannel();
    const e = new Expecter(f.channel);
    f.emit('aaa PROMPT bbb >>> ');
    const m = await e.expect(['>>> ', 'PROMPT']);
    expect(m.index).toBe(1);
    expect(m.before).toBe('aaa ');
    expect((await e.expect(['>>> '])).before).toBe(' bbb ');
  });

  test('memory is bounded: the middle is dropped with a marker', async () => {
    const f = fakeChannel();
    const e = new Expecter(f.channel, { maxOutputBytes: 32 * 1024 });
    const p = e.expect(['DONE']);
    const chunk = Buffer.alloc(4096, 'y');
    for (let i = 0; i < 1000; i++) f.emit(chunk);
    f.emit('DONE');
    const m = await p;
    expect(m.before.length).toBeLessThan(32 * 1024 + 100);
    expect(m.before).toMatch(/\[\.\.\. \d+ bytes truncated \.\.\.\]/);
    const dropped = Number(/(\d+) bytes truncated/.exec(m.before)![1]);
    const kept = m.before.replace(/\n\[.*\]\n/, '').split('').filter((c) => c === 'y').length;
    expect(dropped + kept).toBe(4096 * 1000);
  });

  test('cuts at character boundaries: no U+FFFD at the marker, none where head meets tail', async () => {
    const f = fakeChannel();
    const e = new Expecter(f.channel, { maxOutputBytes: 16 * 1024 });
    // Nothing dropped, but 'é' straddles the head (8 KiB) and the tail.
    f.emit('a'.repeat(8191) + 'é' + 'DONE');
    expect((await e.expect(['DONE'])).before).toBe('a'.repeat(8191) + 'é');
    // Both cuts would fall inside a character.
    const text = 'a' + 'é€'.repeat(20_000);
    f.emit(text + 'DONE');
    const m = await e.expect(['DONE']);
    expect(m.before).not.toContain('\ufffd');
    const [head, tail] = m.before.split(/\n\[\.\.\. \d+ bytes truncated \.\.\.\]\n/);
    const dropped = Number(/(\d+) bytes truncated/.exec(m.before)![1]);
    expect(text.startsWith(head!) && text.endsWith(tail!)).toBe(true);
    expect(Buffer.byteLength(head!) + dropped + Buffer.byteLength(tail!)).toBe(Buffer.byteLength(text));
  });

  test('timeout consumes nothing; exit rejects a pending expect', async () => {
    const f = fakeChannel();
    const e = new Expecter(f.channel);
    f.emit('partial');
    const err = await e.expect(['never'], 20).catch((x) => x);
    expect(err).toBeInstanceOf(ExpectTimeoutError);
    expect(err.before).toBe('partial');
    const p = e.expect(['never']).catch((x) => x);
    f.exit();
    expect(await p).toBeInstanceOf(ChannelClosedError);
  });
});

describe('text helpers', () => {
  test('cleanTerminalText strips ANSI and normalises \\r\\n', () => {
    expect(cleanTerminalText('\x1b[?2004h\x1b[1;31mred\x1b[0m\r\n\x1b]0;t\x07x\r\r\n')).toBe('red\nx\n');
  });

  test('ansiCQuote yields printable ASCII that bash decodes back', async () => {
    const { execFileSync } = await import('node:child_process');
    const text = "a'b\\c\td!e\nf ✓ $HOME `x`";
    const q = ansiCQuote(text);
    expect(q).toMatch(/^[\x20-\x7e]+$/);
    expect(execFileSync('bash', ['-c', `printf %s ${q}`]).toString()).toBe(text);
  });

  test('ansiCQuoteChunks cuts anywhere (inside a character too) and bash joins the exact bytes', async () => {
    const { execFileSync } = await import('node:child_process');
    const text = Array.from({ length: 400 }, (_, i) => `${i} ✓'\\!\t\x01\x7fé€😀`).join('\n');
    for (const max of [8, 13, 64, 1000]) {
      const chunks = ansiCQuoteChunks(text, max);
      for (const c of chunks) {
        expect(c.length).toBeLessThanOrEqual(max);
        expect(c).toMatch(/^\$'[\x20-\x7e]*'$/);
      }
      const script = `s=${chunks[0]}; ${chunks.slice(1).map((c) => `s+=${c}`).join('; ')}; printf %s "$s"`;
      expect(execFileSync('bash', ['-c', script], { maxBuffer: 64 << 20 }).toString()).toBe(text);
    }
    expect(() => ansiCQuoteChunks('x', 6)).toThrow(RangeError);
  });
});
