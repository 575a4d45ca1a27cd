/**
 * Output kept with bounded memory: a fixed head plus a rolling tail, with
 * whatever falls between them only counted. The shell session reads a
 * terminal through it, and the server reads /execute's pipes through it, so
 * `yes` costs the same few MiB everywhere and both ends of a long log (the
 * command, the test summary) survive.
 */

export interface BoundedOutputLimits {
  /** Total bytes of unconsumed output kept (default 1 MiB). */
  maxOutputBytes?: number;
  /** Which part to drop once over the limit: the middle (keep head and tail) or the head (keep the tail). */
  truncate?: 'middle' | 'head';
}

export const DEFAULT_MAX_OUTPUT_BYTES = 1024 * 1024;
// The tail must always hold a complete end marker, and the expecter's scan window.
const MIN_TAIL = 8 * 1024;
/** The smallest limit honoured; smaller ones are raised to it. */
export const MIN_OUTPUT_BYTES = 2 * MIN_TAIL;

/** What replaces the dropped middle, in sessions and /execute alike. */
export function truncationMarker(droppedBytes: number): string {
  return `\n[... ${droppedBytes} bytes truncated ...]\n`;
}

/**
 * How many bytes at the end of `b` begin a UTF-8 character that `b` does
 * not complete. Cutting there instead keeps the text on both sides of a
 * marker decodable, not `\xe2\x94` debris next to it.
 */
function incompleteEnd(b: Buffer): number {
  for (let i = 1; i <= Math.min(3, b.length); i++) {
    const c = b[b.length - i]!;
    if ((c & 0xc0) === 0x80) continue;
    if (c < 0xc0) return 0;
    const need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
    return need > i ? i : 0;
  }
  return 0;
}

/** Continuation bytes at the start of `b`: the rest of a character cut off before it. */
function orphanStart(b: Buffer): number {
  let n = 0;
  while (n < 3 && n < b.length && (b[n]! & 0xc0) === 0x80) n++;
  return n;
}

/** Kept output around a cut, with the cut moved to character boundaries. */
export interface KeptOutput {
  head: Buffer;
  /** Bytes dropped between head and tail; 0 means `head` holds everything and `tail` is empty. */
  dropped: number;
  tail: Buffer;
}

function alignCut(head: Buffer, dropped: number, tail: Buffer): KeptOutput {
  if (dropped === 0) return { head: Buffer.concat([head, tail]), dropped: 0, tail: Buffer.alloc(0) };
  const cutHead = incompleteEnd(head);
  const cutTail = orphanStart(tail);
  return { head: head.subarray(0, head.length - cutHead), dropped: dropped + cutHead + cutTail, tail: tail.subarray(cutTail) };
}

/** Unconsumed output: `head` (fixed once full), `dropped` bytes skipped, rolling `tail`. */
export class BoundedBuffer {
  private head: Buffer[] = [];
  private headLen = 0;
  private tail: Buffer[] = [];
  private tailLen = 0;
  private dropped = 0;
  private readonly headLimit: number;
  private readonly tailLimit: number;

  constructor(limits: BoundedOutputLimits = {}) {
    const max = Math.max(limits.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES, MIN_OUTPUT_BYTES);
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

  /** Logical [0, end): what was kept of it, cut at character boundaries. */
  keptBefore(end: number): KeptOutput {
    const headPart = Buffer.concat(this.head).subarray(0, Math.min(end, this.headLen));
    if (end <= this.headLen) return { head: headPart, dropped: 0, tail: Buffer.alloc(0) };
    const tailStart = this.headLen + this.dropped;
    const tailPart = Buffer.concat(this.tail).subarray(0, Math.max(0, end - tailStart));
    return alignCut(headPart, Math.min(end, tailStart) - this.headLen, tailPart);
  }

  /** Everything kept so far. */
  kept(): KeptOutput {
    return this.keptBefore(this.length);
  }

  /** Decode logical [0, end) as UTF-8, with a marker where bytes were dropped. */
  textBefore(end: number): string {
    const k = this.keptBefore(end);
    if (k.dropped === 0) return k.head.toString('utf8');
    return k.head.toString('utf8') + truncationMarker(k.dropped) + k.tail.toString('utf8');
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
