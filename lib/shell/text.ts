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
 * printable ASCII. Typed through readline, such a line cannot trigger
 * completion (tabs), key bindings (control bytes), history expansion (`!`)
 * or meta-key handling (non-ASCII bytes), and it is a single line however
 * many lines the command has.
 */
export function ansiCQuote(text: string): string {
  const bytes = Buffer.from(text, 'utf8');
  let out = "$'";
  for (const b of bytes) {
    if (b === 0x5c) out += '\\\\';
    else if (b === 0x27) out += "\\'";
    else if (b === 0x0a) out += '\\n';
    else if (b === 0x00) continue; // bash strings cannot hold NUL
    else if (b >= 0x20 && b < 0x7f && b !== 0x21) out += String.fromCharCode(b);
    else out += '\\x' + b.toString(16).padStart(2, '0');
  }
  return out + "'";
}

/** Quote one word for POSIX sh: as it is when it has nothing sh would read specially, else in single quotes. */
export function shQuote(word: string): string {
  if (/^[A-Za-z0-9_./=:@%+-]+$/.test(word)) return word;
  return `'${word.replace(/'/g, `'\\''`)}'`;
}

export function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}
