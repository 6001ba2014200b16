import { describe, expect, it } from "vitest";
import { View, type ProtocolViolation, type ViewEvents } from "../src/index.js";
import { serverMessage, type ServerMessageInit } from "./helpers.js";

function started(): { view: View; log: string[]; violations: ProtocolViolation[] } {
  const view = new View();
  view.start({ playerId: 1n, name: "ada", position: { x: 5, y: 5 }, mapWidth: 100, mapHeight: 100, viewRange: 8 });
  const log: string[] = [];
  const violations: ProtocolViolation[] = [];
  view.on("entered", (e) => log.push(`entered ${e.id} ${e.name} kind ${e.kind} at ${e.position.x},${e.position.y}`));
  view.on("moved", ({ entity, previous }) =>
    log.push(`moved ${entity.id} ${previous.x},${previous.y} -> ${entity.position.x},${entity.position.y}`),
  );
  view.on("left", (e) => log.push(`left ${e.id}`));
  view.on("stateChanged", ({ entity, previous }) => log.push(`state ${entity.id} [${[...previous]}] -> [${[...entity.state]}]`));
  view.on("reset", ({ position }) => log.push(`reset at ${position.x},${position.y}`));
  view.on("chat", ({ from, text, sender }) => log.push(`chat ${from} (${sender?.name ?? "unseen"}): ${text}`));
  view.on("event", ({ source, kind, payload }) => log.push(`event ${source} kind ${kind} [${[...payload]}]`));
  view.on("violation", (v) => violations.push(v));
  return { view, log, violations };
}

function feed(view: View, ...messages: ServerMessageInit[]): void {
  for (const message of messages) view.apply(serverMessage(message));
}

const entered = (id: bigint, name: string, x: number, y: number, kind = 0, state = new Uint8Array()): ServerMessageInit => ({
  kind: { case: "entered", value: { playerId: id, name, position: { x, y }, kind, state } },
});
const moved = (id: bigint, x: number, y: number, clientTime = 0n): ServerMessageInit => ({
  kind: { case: "moved", value: { playerId: id, position: { x, y }, clientTime } },
});
const left = (id: bigint): ServerMessageInit => ({ kind: { case: "left", value: { playerId: id } } });

describe("View", () => {
  it("tracks entities that enter, move and leave, players and NPCs alike", () => {
    const { view, log, violations } = started();
    feed(view, entered(2n, "bob", 6, 5), entered(900n, "wolf", 7, 7, 3, new Uint8Array([100])), moved(2n, 6, 6), left(900n));
    expect(log).toEqual([
      "entered 2 bob kind 0 at 6,5",
      "entered 900 wolf kind 3 at 7,7",
      "moved 2 6,5 -> 6,6",
      "left 900",
    ]);
    expect([...view.entities.keys()]).toEqual([2n]);
    expect(view.get(2n)?.position).toEqual({ x: 6, y: 6 });
    expect(violations).toEqual([]);
  });

  it("moves the player itself on its own Moved, ack or not", () => {
    const { view, log } = started();
    feed(view, moved(1n, 5, 4, 9n), moved(1n, 5, 3));
    expect(view.self?.position).toEqual({ x: 5, y: 3 });
    expect(log).toEqual(["moved 1 5,5 -> 5,4", "moved 1 5,4 -> 5,3"]);
  });

  it("keeps public state from Entered and StateChanged, the player's own included", () => {
    const { view, log } = started();
    feed(
      view,
      entered(900n, "wolf", 7, 7, 3, new Uint8Array([100])),
      { kind: { case: "stateChanged", value: { entityId: 900n, state: new Uint8Array([60]) } } },
      { kind: { case: "stateChanged", value: { entityId: 1n, state: new Uint8Array([1, 2]) } } },
    );
    expect(view.get(900n)?.state).toEqual(new Uint8Array([60]));
    expect(view.self?.state).toEqual(new Uint8Array([1, 2]));
    expect(log.slice(1)).toEqual(["state 900 [100] -> [60]", "state 1 [] -> [1,2]"]);
  });

  it("forgets everything on ViewReset and takes the position it gives", () => {
    const { view, log } = started();
    feed(view, entered(2n, "bob", 6, 5), entered(3n, "cy", 4, 4));
    feed(view, { kind: { case: "viewReset", value: { playerId: 1n, position: { x: 40, y: 41 } } } });
    expect(view.entities.size).toBe(0);
    expect(view.self?.position).toEqual({ x: 40, y: 41 });
    feed(view, entered(2n, "bob", 41, 41));
    expect(log.slice(2)).toEqual(["reset at 40,41", "entered 2 bob kind 0 at 41,41"]);
  });

  it("passes chat (with the sender when in sight) and game events through", () => {
    const { view, log } = started();
    feed(
      view,
      entered(2n, "bob", 6, 5),
      { kind: { case: "chat", value: { playerId: 2n, text: "hi" } } },
      { kind: { case: "chat", value: { playerId: 77n, text: "from afar" } } },
      { kind: { case: "event", value: { source: 0n, kind: 4, payload: new Uint8Array([9]) } } },
    );
    expect(log.slice(1)).toEqual(["chat 2 (bob): hi", "chat 77 (unseen): from afar", "event 0 kind 4 [9]"]);
  });

  it("reports protocol violations instead of throwing, and keeps going", () => {
    const { view, log, violations } = started();
    expect(() =>
      feed(
        view,
        moved(50n, 1, 1),
        left(51n),
        { kind: { case: "stateChanged", value: { entityId: 52n, state: new Uint8Array([1]) } } },
        entered(1n, "me again", 0, 0),
        entered(2n, "bob", 6, 5),
        entered(2n, "bob", 6, 6),
      ),
    ).not.toThrow();
    expect(violations.map((v) => v.description)).toEqual([
      "Moved for 50, not in sight",
      "Left for 51, not in sight",
      "StateChanged for 52, not in sight",
      "Entered for the player itself (1)",
      "Entered for 2, already in sight",
    ]);
    expect(violations[0]?.message?.kind.case).toBe("moved");
    // The duplicate Entered is taken as the newer word on the entity.
    expect(view.get(2n)?.position).toEqual({ x: 6, y: 6 });
    expect(log).toEqual(["entered 2 bob kind 0 at 6,5", "entered 2 bob kind 0 at 6,6"]);
  });

  it("does not let a throwing listener break the view or other listeners", async () => {
    const { view, log } = started();
    const thrown: unknown[] = [];
    const onError = (error: unknown) => thrown.push(error);
    process.on("uncaughtException", onError);
    try {
      view.on("entered", () => {
        throw new Error("app bug");
      });
      const seen: ViewEvents["entered"][] = [];
      view.on("entered", (e) => seen.push(e));
      feed(view, entered(2n, "bob", 6, 5));
      expect(seen.map((e) => e.id)).toEqual([2n]);
      expect(log).toEqual(["entered 2 bob kind 0 at 6,5"]);
      await new Promise((resolve) => setTimeout(resolve, 10));
      expect(thrown).toEqual([new Error("app bug")]);
    } finally {
      process.off("uncaughtException", onError);
    }
  });

  it("unsubscribes", () => {
    const view = new View();
    view.start({ playerId: 1n, name: "ada", position: { x: 0, y: 0 }, mapWidth: 9, mapHeight: 9, viewRange: 2 });
    let count = 0;
    const off = view.on("left", () => count++);
    view.once("entered", () => count++);
    feed(view, entered(2n, "bob", 1, 1), entered(3n, "cy", 1, 1), left(2n));
    off();
    feed(view, left(3n));
    expect(count).toBe(2);
    expect(view.listenerCount("left")).toBe(0);
  });
});
