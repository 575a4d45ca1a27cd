/**
 * docs/architecture.md's diagram of lib/'s rooms is the truth about what
 * imports what: every import from one room into another (static, dynamic,
 * type-only) must be an arrow of the diagram, and every arrow must be used
 * by some import, so the diagram can neither fall behind the code nor keep
 * arrows the code no longer has.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const LIB = join(ROOT, 'lib');
const HEADING = "## lib/'s rooms, and what each imports";

interface Diagram {
  /** room -> the rooms its arrow names. */
  arrows: Map<string, Set<string>>;
  /** What every room may import (the `*` line). */
  shared: Set<string>;
}

/** The fenced block under HEADING: `room ──> a, b (commentary)` per line. */
function readDiagram(): Diagram {
  const doc = readFileSync(join(ROOT, 'docs', 'architecture.md'), 'utf8');
  const at = doc.indexOf(`\n${HEADING}\n`);
  if (at < 0) throw new Error(`docs/architecture.md has no heading "${HEADING}"`);
  const block = /```\n([\s\S]*?)```/.exec(doc.slice(at))?.[1];
  if (!block) throw new Error(`docs/architecture.md: no diagram block under "${HEADING}"`);
  const arrows = new Map<string, Set<string>>();
  const shared = new Set<string>();
  for (const line of block.split('\n').filter((l) => l.trim() !== '')) {
    const m = /^(\S+)\s+─+>\s*(.*)$/.exec(line);
    if (!m) throw new Error(`docs/architecture.md: cannot read the diagram line ${JSON.stringify(line)}`);
    const targets = m[2]!.replace(/\([^)]*\)/g, '').split(',').map((t) => t.trim()).filter(Boolean);
    if (m[1] === '*') targets.forEach((t) => shared.add(t));
    else arrows.set(m[1]!, new Set(targets));
  }
  return { arrows, shared };
}

/** lib/env/x.ts -> 'env'; lib/errors.ts (or the errors.js an import names) -> 'errors.ts'. */
function roomOf(file: string): string {
  const [first, ...rest] = relative(LIB, file).split(sep);
  return rest.length === 0 ? first!.replace(/\.js$/, '.ts') : first!;
}

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? sources(join(dir, e.name)) : e.name.endsWith('.ts') ? [join(dir, e.name)] : [],
  );
}

/** Every import from one room into another: "from -> to" -> the files that make it. */
function importsBetweenRooms(): Map<string, string[]> {
  const edges = new Map<string, string[]>();
  for (const file of sources(LIB)) {
    const from = roomOf(file);
    // preProcessFile reads import/export ... from, import() and typeof import(), never strings or comments.
    for (const { fileName } of ts.preProcessFile(readFileSync(file, 'utf8'), true, true).importedFiles) {
      if (!fileName.startsWith('.')) continue;
      const target = resolve(dirname(file), fileName);
      if (!target.startsWith(LIB + sep)) continue;
      const to = roomOf(target);
      if (to === from) continue;
      const key = `${from} -> ${to}`;
      edges.set(key, [...(edges.get(key) ?? []), `${relative(ROOT, file)} imports ${fileName}`]);
    }
  }
  return edges;
}

describe("lib/'s rooms", () => {
  const diagram = readDiagram();
  const edges = importsBetweenRooms();
  const rooms = readdirSync(LIB, { withFileTypes: true }).map((e) => e.name).filter((n) => n.endsWith('.ts') || !n.includes('.'));

  it('the diagram names every room of lib/, and only those', () => {
    expect([...diagram.arrows.keys(), ...diagram.shared].sort()).toEqual(rooms.sort());
  });

  it('every import between rooms is an arrow of the diagram', () => {
    const allowed = (from: string, to: string) => diagram.shared.has(to) || (diagram.arrows.get(from)?.has(to) ?? false);
    const strays = [...edges].filter(([key]) => !allowed(...(key.split(' -> ') as [string, string]))).map(([key, why]) => `${key}: ${why.join('; ')}`);
    expect(strays).toEqual([]);
  });

  it('every arrow of the diagram is an import somewhere', () => {
    const unused = [...diagram.arrows].flatMap(([from, tos]) => [...tos].filter((to) => !edges.has(`${from} -> ${to}`)).map((to) => `${from} -> ${to}`));
    expect(unused).toEqual([]);
  });

  it('what every room may use imports nothing of lib/', () => {
    expect([...edges.keys()].filter((key) => diagram.shared.has(key.split(' -> ')[0]!))).toEqual([]);
  });
});
