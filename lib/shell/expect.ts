/**
 * pexpect-like matching over a pty byte stream with bounded memory.
 *
 * Unconsumed output is kept in a BoundedBuffer (bounded.ts), so `yes`
 * cannot grow memory without bound. Matching is incremental: each chunk is scanned together with the
 * last few bytes before it (so a marker split across chunks is still found),
 * never the whole buffer again.
 */
import { MinisandboxError } from '../errors.js';
import { BoundedBuffer, type BoundedOutputLimits } from './bounded.js';
import type { PtyChannel } from './pty.js';

/** A literal string (matched as UTF-8 bytes) or a regex with a bound on the length of its matches. */
export type Pattern = string | { regex: RegExp; maxLength: number };

export interface ExpectMatch {
  /** Index into the patterns given to `expect`. */
  index: number;
  /** Raw output before the match (UTF-8 decoded, with a truncation marker if bytes were dropped). */
  before: string;
  /** Matched text. */
  text: string;
  /** Regex capture groups (empty for literals). */
  groups: string[];
}

/** No pattern appeared in time; `before` is what the terminal printed meanwhile. */
export class ExpectTimeoutError extends MinisandboxError {
  static override readonly code = 'MSBX_EXPECT_TIMEOUT';
  constructor(readonly before: string) {
    super('timed out waiting for output');
  }
}

/** The process on the terminal exited before a pattern appeared. */
export class ChannelClosedError extends MinisandboxError {
  static override readonly code = 'MSBX_CHANNEL_CLOSED';
  constructor(readonly before: string) {
    super('the process on the pty exited');
  }
}

interface Pending {
  patterns: Array<{ literal?: string; regex?: RegExp; maxLength: number }>;
  scanFrom: number;
  resolve: (m: ExpectMatch) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout | undefined;
}

/** One reader of a pty; at most one `expect` at a time (the session serialises callers). */
export class Expecter {
  private buffer: BoundedBuffer;
  private pending: Pending | null = null;
  private exited = false;
  private readonly unsubscribe: () => void;

  constructor(
    channel: PtyChannel,
    private readonly limits: BoundedOutputLimits = {},
  ) {
    this.buffer = new BoundedBuffer(limits);
    this.unsubscribe = channel.onData((chunk) => {
      this.buffer.append(chunk);
      if (this.pending) this.scan();
    });
    channel.onExit(() => {
      this.exited = true;
      const p = this.pending;
      if (!p) return;
      this.scan(); // output delivered just before exit may still match
      if (this.pending === p) this.settle(p, new ChannelClosedError(this.peek()));
    });
  }

  get closed(): boolean {
    return this.exited;
  }

  /** Everything unconsumed so far, decoded (not consumed). */
  peek(): string {
    return this.buffer.textBefore(this.buffer.length);
  }

  /** Forget unconsumed output (e.g. startup noise). */
  discard(): void {
    this.buffer = new BoundedBuffer(this.limits);
  }

  /**
   * Resolve with the earliest match of any pattern in the unconsumed output;
   * output up to the end of the match is consumed. On timeout nothing is
   * consumed (like pexpect), so a later expect still sees it.
   */
  expect(patterns: Pattern[], timeoutMs?: number): Promise<ExpectMatch> {
    if (this.pending) return Promise.reject(new Error('Expecter: concurrent expect'));
    return new Promise<ExpectMatch>((resolve, reject) => {
      const compiled = patterns.map((p) =>
        typeof p === 'string'
          ? // Compare bytes as latin1 so multi-byte text matches exactly.
            { literal: Buffer.from(p, 'utf8').toString('latin1'), maxLength: Buffer.byteLength(p) }
          : { regex: new RegExp(p.regex.source, p.regex.flags.replace('g', '')), maxLength: p.maxLength },
      );
      const pending: Pending = { patterns: compiled, scanFrom: 0, resolve, reject, timer: undefined };
      this.pending = pending;
      this.scan();
      if (this.pending !== pending) return;
      if (this.exited) return this.settle(pending, new ChannelClosedError(this.peek()));
      if (timeoutMs !== undefined && Number.isFinite(timeoutMs)) {
        pending.timer = setTimeout(() => this.settle(pending, new ExpectTimeoutError(this.peek())), Math.max(0, timeoutMs));
      }
    });
  }

  dispose(): void {
    this.unsubscribe();
  }

  private scan(): void {
    const p = this.pending;
    if (!p) return;
    const overlap = Math.max(1, ...p.patterns.map((x) => x.maxLength)) - 1;
    const from = Math.max(0, p.scanFrom - overlap);
    let best: { index: number; start: number; text: string; groups: string[] } | null = null;
    for (const seg of this.buffer.segmentsFrom(from)) {
      const hay = seg.bytes.toString('latin1');
      for (let index = 0; index < p.patterns.length; index++) {
        const pat = p.patterns[index]!;
        let at = -1;
        let text = '';
        let groups: string[] = [];
        if (pat.literal !== undefined) {
          at = pat.literal.length ? hay.indexOf(pat.literal) : -1;
          text = pat.literal;
        } else if (pat.regex) {
          const m = pat.regex.exec(hay);
          if (m) {
            at = m.index;
            text = m[0];
            groups = m.slice(1).map((g) => (g === undefined ? '' : Buffer.from(g, 'latin1').toString('utf8')));
          }
        }
        if (at >= 0 && (!best || seg.offset + at < best.start)) best = { index, start: seg.offset + at, text, groups };
      }
      if (best) break; // the head segment precedes the tail segment
    }
    p.scanFrom = this.buffer.length;
    if (!best) return;
    const found = best;
    const before = this.buffer.textBefore(found.start);
    this.buffer.consume(found.start + found.text.length);
    this.settle(p, {
      index: found.index,
      before,
      text: Buffer.from(found.text, 'latin1').toString('utf8'),
      groups: found.groups,
    });
  }

  private settle(p: Pending, result: ExpectMatch | Error): void {
    if (this.pending !== p) return;
    this.pending = null;
    if (p.timer) clearTimeout(p.timer);
    if (result instanceof Error) p.reject(result);
    else p.resolve(result);
  }
}
