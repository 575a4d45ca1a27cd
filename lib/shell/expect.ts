/**
 * pexpect-like matching over a pty byte stream with bounded memory.
 *
 * Unconsumed output is kept as a fixed head plus a rolling tail; whatever
 * falls between them is only counted, so `yes` cannot grow memory without
 * bound. Matching is incremental: each chunk is scanned together with the
 * last few bytes before it (so a marker split across chunks is still found),
 * never the whole buffer again.
 */
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

export class ExpectTimeoutError extends Error {
  constructor(readonly before: string) {
    super('timed out waiting for output');
  }
}

export class ChannelClosedError extends Error {
  constructor(readonly before: string) {
    super('the process on the pty exited');
  }
}

export interface BoundedOutputLimits {
  /** Total bytes of unconsumed output kept (default 1 MiB). */
  maxOutputBytes?: number;
  /** Which part to drop once over the limit: the middle (keep head and tail) or the head (keep the tail). */
  truncate?: 'middle' | 'head';
}

export const DEFAULT_MAX_OUTPUT_BYTES = 1024 * 1024;
// The tail must always hold a complete end marker, and the scan window below.
const MIN_TAIL = 8 * 1024;

/** Unconsumed output: `head` (fixed once full), `dropped` bytes skipped, rolling `tail`. */
class BoundedBuffer {
  private head: Buffer[] = [];
  private headLen = 0;
  private tail: Buffer[] = [];
  private tailLen = 0;
  private dropped = 0;
  private readonly headLimit: number;
  private readonly tailLimit: number;

  constructor(limits: BoundedOutputLimits) {
    const max = Math.max(limits.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES, 2 * MIN_TAIL);
    this.headLimit = limits.truncate === 'head' ? 0 : Math.floor(max / 2);
    this.tailLimit = max - this.headLimit;
  }

  /** Logical length: every byte appended since the last reset, dropped ones included. */
  get length(): number {
    return this.headLen + this.dropped + this.tailLen;
  }

  append(chunk: Buffer): void {
    let rest = chunk;
    if (this.headLen < this.headLimit && this.dropped === 0 && this.tailLen === 0) {
      const take = Math.min(rest.length, this.headLimit - this.headLen);
      this.head.push(rest.subarray(0, take));
      this.headLen += take;
      rest = rest.subarray(take);
    }
    if (rest.length === 0) return;
    this.tail.push(rest);
    this.tailLen += rest.length;
    // Trim whole chunks where possible: O(1) amortised, no copying.
    while (this.tailLen > this.tailLimit) {
      const first = this.tail[0]!;
      const excess = this.tailLen - this.tailLimit;
      if (first.length <= excess) {
        this.tail.shift();
        this.tailLen -= first.length;
        this.dropped += first.length;
      } else {
        this.tail[0] = first.subarray(excess);
        this.tailLen -= excess;
        this.dropped += excess;
      }
    }
  }

  /** Contiguous stored segments overlapping [from, length), with their logical offsets. */
  segmentsFrom(from: number): Array<{ offset: number; bytes: Buffer }> {
    if (this.dropped === 0) {
      // Head and tail are contiguous: one segment, so a match may span them.
      const all = [...this.head, ...this.tail];
      const total = this.headLen + this.tailLen;
      return from < total ? [{ offset: from, bytes: suffix(all, total, from) }] : [];
    }
    const out: Array<{ offset: number; bytes: Buffer }> = [];
    if (from < this.headLen) out.push({ offset: from, bytes: suffix(this.head, this.headLen, from) });
    const tailStart = this.headLen + this.dropped;
    const skip = Math.max(0, from - tailStart);
    if (skip < this.tailLen) out.push({ offset: tailStart + skip, bytes: suffix(this.tail, this.tailLen, skip) });
    return out;
  }

  /** Decode logical [0, end) with a marker where bytes were dropped. */
  textBefore(end: number): string {
    const headPart = Buffer.concat(this.head).subarray(0, Math.min(end, this.headLen));
    const tailStart = this.headLen + this.dropped;
    if (end <= this.headLen) return headPart.toString('utf8');
    const tailPart = Buffer.concat(this.tail).subarray(0, Math.max(0, end - tailStart));
    const skipped = Math.min(end, tailStart) - this.headLen;
    const marker = skipped > 0 ? `\n[... ${skipped} bytes truncated ...]\n` : '';
    return headPart.toString('utf8') + marker + tailPart.toString('utf8');
  }

  /** Drop logical [0, end); what follows is in the tail (or head) and is kept. */
  consume(end: number): void {
    const rest = this.segmentsFrom(end).map((s) => s.bytes);
    this.head = [];
    this.headLen = 0;
    this.tail = [];
    this.tailLen = 0;
    this.dropped = 0;
    for (const b of rest) this.append(Buffer.from(b)); // copy: do not pin the old chunks
  }
}

/** Bytes [from, total) of a chunk list, copying only the chunks involved (scans stay O(chunk)). */
function suffix(chunks: Buffer[], total: number, from: number): Buffer {
  let pos = total;
  let i = chunks.length;
  while (i > 0 && pos > from) pos -= chunks[--i]!.length;
  const parts = chunks.slice(i);
  if (parts.length > 0) parts[0] = parts[0]!.subarray(from - pos);
  return parts.length === 1 ? parts[0]! : Buffer.concat(parts);
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
