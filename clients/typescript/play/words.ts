/**
 * What the `/play` page says about the game, as plain words: the answers to its actions
 * and the events it receives. The kinds and payloads are those of Meridian's example game,
 * wolves (`examples/wolves/src/lib.rs`; `docs/protocol.md`, section 12). Another game's
 * events are shown by number.
 *
 * No DOM and no connection here, so the tests feed it as data.
 */
import type { Entity, Point } from "../src/index.js";

/** Wolves' NPC kind. */
export const WOLF = 1;
/** Wolves' actions: attack an adjacent wolf (`target`), summon one (payload `dx,dy`). */
export const ATTACK = 1;
export const SUMMON = 2;
/** Wolves' events. */
export const BITE = 1;
export const DIED = 2;
export const RESPAWNED = 3;

/** A direction the player last moved towards, for where a summoned wolf comes. */
export type Facing = "up" | "down" | "left" | "right";

const text = (bytes: Uint8Array) => new TextDecoder().decode(bytes);

/** `{"hp":H,"max":M}`, the public state of wolves and players alike. */
export function health(state: Uint8Array): { hp: number; max: number } | undefined {
  try {
    const parsed = JSON.parse(text(state)) as { hp?: unknown; max?: unknown };
    if (typeof parsed.hp === "number" && typeof parsed.max === "number" && parsed.max > 0) {
      return { hp: parsed.hp, max: parsed.max };
    }
  } catch {
    // Not JSON: a game with another state format.
  }
  return undefined;
}

function chebyshev(a: Point, b: Point): number {
  return Math.max(Math.abs(a.x - b.x), Math.abs(a.y - b.y));
}

/** The wolf an attack key aims at: the nearest in sight (ties: the lowest id). */
export function nearestWolf(me: Point, entities: Iterable<Entity>): Entity | undefined {
  let best: Entity | undefined;
  for (const entity of entities) {
    if (entity.kind !== WOLF) continue;
    if (best === undefined) {
      best = entity;
      continue;
    }
    const [d, bestD] = [chebyshev(me, entity.position), chebyshev(me, best.position)];
    if (d < bestD || (d === bestD && entity.id < best.id)) best = entity;
  }
  return best;
}

/** What a click on the cell `at` attacks: a wolf there, else anyone there (the game decides). */
export function entityAt(at: Point, entities: Iterable<Entity>): Entity | undefined {
  const there = [...entities].filter((e) => e.position.x === at.x && e.position.y === at.y);
  const byId = (a: Entity, b: Entity) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);
  return there.filter((e) => e.kind === WOLF).sort(byId)[0] ?? there.sort(byId)[0];
}

/** SUMMON's payload: the cell next to the player on the side it faces. */
export function summonPayload(facing: Facing): Uint8Array {
  const [dx, dy] = { up: [0, -1], down: [0, 1], left: [-1, 0], right: [1, 0] }[facing];
  return new TextEncoder().encode(`${dx},${dy}`);
}

/** An attack's `ActionDone`: `{"hp":H}` (the wolf's health left) or `killed`. */
export function attackWords(payload: Uint8Array, target: Entity | undefined): string {
  const it = target ? `the ${target.name}` : "it";
  const answer = text(payload);
  if (answer === "killed") return `you killed ${it}`;
  try {
    const { hp } = JSON.parse(answer) as { hp?: unknown };
    if (typeof hp === "number") {
      const max = target ? health(target.state)?.max : undefined;
      return `you hit ${it}: ${max === undefined ? hp : `${hp}/${max}`} health left`;
    }
  } catch {
    // Not the wolves game's answer: shown as it came.
  }
  return `you attacked ${it}: ${answer}`;
}

/** A summon's `ActionDone`: the new wolf's id. */
export function summonWords(payload: Uint8Array): string {
  const id = text(payload);
  return /^\d+$/.test(id) ? `you summoned a wolf (#${id})` : `you summoned: ${id}`;
}

/**
 * A `GameEvent` as words. `name` finds an entity's name by id (also one that just left
 * sight: a wolf's DIED comes as it is removed); `self` is the player's own id.
 */
export function eventWords(
  event: { source: bigint; kind: number; payload: Uint8Array },
  self: bigint | undefined,
  name: (id: bigint) => string | undefined,
): string {
  const from = event.source === 0n ? "the world" : name(event.source) ?? `#${event.source}`;
  switch (event.kind) {
    case BITE:
      return `${from} bites you for ${text(event.payload) || "?"}`;
    case DIED:
      // Source 0: the player's own health ran out; else an entity in sight died.
      return event.source === 0n || event.source === self ? "you died" : `${from} died`;
    case RESPAWNED:
      return event.source === self ? "you respawned with full health" : `${from} respawned`;
    default:
      return `event ${event.kind} from ${from}`;
  }
}
