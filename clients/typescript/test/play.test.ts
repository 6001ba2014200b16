import { describe, expect, it } from "vitest";
import type { Entity } from "../src/index.js";
import {
  BITE,
  DIED,
  RESPAWNED,
  WOLF,
  attackWords,
  entityAt,
  eventWords,
  nearestWolf,
  summonPayload,
  summonWords,
} from "../play/words.js";

const bytes = (text: string) => new TextEncoder().encode(text);
const wolf = (id: bigint, x: number, y: number, hp = 10): Entity => ({
  id,
  position: { x, y },
  name: "wolf",
  kind: WOLF,
  state: bytes(`{"hp":${hp},"max":10}`),
});
const player = (id: bigint, name: string, x: number, y: number): Entity => ({
  id,
  position: { x, y },
  name,
  kind: 0,
  state: bytes('{"hp":20,"max":20}'),
});

describe("the /play page's words for the wolves game", () => {
  const me = 3n;
  const names = new Map([
    [9n, "wolf"],
    [4n, "bob"],
  ]);
  const nameOf = (id: bigint) => names.get(id);
  const event = (source: bigint, kind: number, payload = "") => eventWords({ source, kind, payload: bytes(payload) }, me, nameOf);

  it("says each event the game sends", () => {
    expect(event(9n, BITE, "2")).toBe("wolf bites you for 2");
    expect(event(0n, DIED)).toBe("you died");
    expect(event(9n, DIED)).toBe("wolf died");
    expect(event(me, RESPAWNED)).toBe("you respawned with full health");
    expect(event(4n, RESPAWNED)).toBe("bob respawned");
    expect(event(77n, 42)).toBe("event 42 from #77");
  });

  it("says what an attack did, with the wolf's health when it knows its maximum", () => {
    expect(attackWords(bytes('{"hp":6}'), wolf(9n, 1, 1))).toBe("you hit the wolf: 6/10 health left");
    expect(attackWords(bytes("killed"), wolf(9n, 1, 1))).toBe("you killed the wolf");
    expect(attackWords(bytes('{"hp":6}'), undefined)).toBe("you hit it: 6 health left");
    expect(attackWords(bytes("odd"), wolf(9n, 1, 1))).toBe("you attacked the wolf: odd");
    expect(summonWords(bytes("1234"))).toBe("you summoned a wolf (#1234)");
  });

  it("aims at the nearest wolf, and a click at a wolf before a player in the cell", () => {
    const seen = [player(4n, "bob", 10, 11), wolf(12n, 12, 10), wolf(11n, 8, 8), wolf(10n, 12, 12)];
    // Two wolves 2 cells away (Chebyshev): the lower id.
    expect(nearestWolf({ x: 10, y: 10 }, seen)?.id).toBe(10n);
    expect(nearestWolf({ x: 10, y: 10 }, [player(4n, "bob", 10, 11)])).toBeUndefined();
    expect(entityAt({ x: 12, y: 10 }, [...seen, player(5n, "cy", 12, 10)])?.id).toBe(12n);
    expect(entityAt({ x: 10, y: 11 }, seen)?.name).toBe("bob");
    expect(entityAt({ x: 0, y: 0 }, seen)).toBeUndefined();
  });

  it("summons on the side the player faces", () => {
    const text = (b: Uint8Array) => new TextDecoder().decode(b);
    expect(["up", "down", "left", "right"].map((f) => text(summonPayload(f as "up")))).toEqual(["0,-1", "0,1", "-1,0", "1,0"]);
  });
});
