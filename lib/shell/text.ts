/** Text helpers for terminal output and for typing commands into bash. */

// CSI (colours, cursor moves, bracketed-paste toggles), OSC (window titles)
// terminated by BEL or ST, DCS/SOS/PM/APC strings, charset selection, and
// the remaining two-byte escapes. Order matters: longest forms first.
const ANSI_RE =
  /\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[PX^_][^\x1b]*(?:\x1b\\)?|\x1b[()*+][0-9A-Za-z]|\x1b[@-Z\\-_]|\x1b[=>]/g;

/** Strip ANSI escapes and turn the pty's `\r\n` (ONLCR) back into `\n`. */
export function cleanTerminalText(text: string): string {
  // `\r+\n`: a program that prints "\r\n" itself comes out as "\r\r\n".
  return text.replace(ANSI_RE, '').replace(/\r+\n/g, '\n');
}

/**
 * Quote arbitrary text as a bash ANSI-C string `$'...'` made only of
 * printable ASCII. Typed into a terminal, such a line cannot trigger the
 * line discipline's controls (^C, ^U, ^S, CR read as NL), completion (tabs)
 * or key bindings under readline, history expansion (`!`) or meta-key
 * handling (non-ASCII bytes), and it is a single line however many lines
 * the command has.
 */
export function ansiCQuote(text: string): string {
  let out = '';
  for (const b of Buffer.from(text, 'utf8')) out += escapeByte(b);
  return `$'${out}'`;
}

/**
 * The same quoting cut into strings of at most `maxLength` characters
 * each, which bash concatenates back into the text's exact bytes (a cut
 * may fall inside a multi-byte character: bash strings are bytes).
 */
export function ansiCQuoteChunks(text: string, maxLength: number): string[] {
  const room = maxLength - 3; // $' and '
  if (room < 4) throw new RangeError(`ansiCQuoteChunks: maxLength ${maxLength} cannot hold one escaped byte`);
  const chunks: string[] = [];
  let cur = '';
  for (const b of Buffer.from(text, 'utf8')) {
    const e = escapeByte(b);
    if (cur.length + e.length > room) {
      chunks.push(`$'${cur}'`);
      cur = '';
    }
    cur += e;
  }
  chunks.push(`$'${cur}'`);
  return chunks;
}

function escapeByte(b: number): string {
  if (b === 0x5c) return '\\\\';
  if (b === 0x27) return "\\'";
  if (b === 0x0a) return '\\n';
  if (b === 0x00) return ''; // bash strings cannot hold NUL
  if (b >= 0x20 && b < 0x7f && b !== 0x21) return String.fromCharCode(b);
  return '\\x' + b.toString(16).padStart(2, '0');
}

/** Quote one word for POSIX sh: as it is when it has nothing sh would read specially, else in single quotes. */
export function shQuote(word: string): string {
  if (/^[A-Za-z0-9_./=:@%+-]+$/.test(word)) return word;
  return `'${word.replace(/'/g, `'\\''`)}'`;
}

export function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}
