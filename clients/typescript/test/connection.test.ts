import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import {
  Connection,
  Direction,
  ErrorCode,
  MeridianError,
  type ConnectionEvents,
  type ConnectionOptions,
  type ProtocolViolation,
} from "../src/index.js";
import { FakeSocket, flush, loginOk, TOKEN } from "./helpers.js";

async function loggedIn(options: ConnectionOptions = {}): Promise<{ connection: Connection; socket: FakeSocket }> {
  const connection = await Connection.connect("ws://gateway.test/", { WebSocket: FakeSocket, ...options });
  const socket = FakeSocket.last();
  const login = connection.login("ada");
  socket.deliver(loginOk(7n, 10, 20));
  await login;
  return { connection, socket };
}

function settleLog(settled: string[], label: string, promise: Promise<unknown>): void {
  promise.then(
    (value) => settled.push(`${label} ok ${value instanceof Uint8Array ? `[${[...value]}]` : JSON.stringify(value)}`),
    (error: MeridianError) => settled.push(`${label} ${error.codeName}: ${error.detail}`),
  );
}

beforeEach(() => {
  FakeSocket.made = [];
});

afterEach(() => {
  vi.useRealTimers();
});

describe("Connection: login", () => {
  it("sends Login with name, spawn and token, and resolves with what LoginOk says", async () => {
    const connection = await Connection.connect("ws://gateway.test/", { WebSocket: FakeSocket });
    const socket = FakeSocket.last();
    expect(socket.binaryType).toBe("arraybuffer");
    const login = connection.login("ada", { spawn: { x: 3, y: 4 }, token: "jwt" });
    expect(connection.state).toBe("loggingIn");
    const sent = socket.sent[0]!;
    expect(sent.kind.case === "login" && [sent.kind.value.name, sent.kind.value.spawn?.x, sent.kind.value.spawn?.y, sent.kind.value.token]).toEqual([
      "ada",
      3,
      4,
      "jwt",
    ]);
    socket.deliver(loginOk(7n, 10, 20));
    await expect(login).resolves.toEqual({
      playerId: 7n,
      name: "ada",
      position: { x: 10, y: 20 },
      mapWidth: 1000,
      mapHeight: 500,
      viewRange: 16,
      resumeToken: TOKEN,
    });
    expect(connection.state).toBe("playing");
    expect(connection.view.self?.id).toBe(7n);
  });

  it("rejects the login with the server's error and stays open for another try", async () => {
    const connection = await Connection.connect("ws://gateway.test/", { WebSocket: FakeSocket });
    const socket = FakeSocket.last();
    const login = connection.login("ada", { token: "expired" });
    socket.deliver({ kind: { case: "error", value: { code: ErrorCode.INVALID_TOKEN, detail: "token expired" } } });
    await expect(login).rejects.toMatchObject({ code: ErrorCode.INVALID_TOKEN, detail: "token expired", local: false });
    expect(connection.state).toBe("open");
    const retry = connection.login("ada", { token: "fresh" });
    socket.deliver(loginOk());
    await expect(retry).resolves.toMatchObject({ playerId: 7n });
  });

  it("refuses to move before logging in", async () => {
    const connection = await Connection.connect("ws://gateway.test/", { WebSocket: FakeSocket });
    await expect(connection.move("up")).rejects.toMatchObject({ code: ErrorCode.NOT_LOGGED_IN, local: true });
    expect(() => connection.chat("hi")).toThrow(MeridianError);
    expect(FakeSocket.last().sent).toEqual([]);
  });

  it("says what went wrong when there is no WebSocket to use", async () => {
    const saved = (globalThis as { WebSocket?: unknown }).WebSocket;
    delete (globalThis as { WebSocket?: unknown }).WebSocket;
    try {
      await expect(Connection.connect("ws://x/")).rejects.toThrow(/pass one as options.WebSocket/);
    } finally {
      if (saved !== undefined) (globalThis as { WebSocket?: unknown }).WebSocket = saved;
    }
  });
});

describe("Connection: answers", () => {
  it("gives every move and action a non-zero client_time of its own", async () => {
    const { connection, socket } = await loggedIn();
    void connection.move("up");
    void connection.action(5, { target: 900n, payload: new Uint8Array([1]) });
    void connection.move(Direction.LEFT);
    const times = socket.sent.slice(1).map((m) => (m.kind.case === "move" || m.kind.case === "action" ? m.kind.value.clientTime : -1n));
    expect(times.every((t) => t > 0n)).toBe(true);
    expect(new Set(times).size).toBe(3);
    const action = socket.sent[2]!;
    expect(action.kind.case === "action" && [action.kind.value.kind, action.kind.value.target, [...action.kind.value.payload]]).toEqual([
      5,
      900n,
      [1],
    ]);
    const move = socket.sent[3]!;
    expect(move.kind.case === "move" && move.kind.value.direction).toBe(Direction.LEFT);
  });

  it("resolves moves with their acks and actions with their payloads, in order; rejects on Error", async () => {
    const { connection, socket } = await loggedIn();
    const settled: string[] = [];
    settleLog(settled, "up", connection.move("up"));
    settleLog(settled, "hit", connection.action(1, { target: 2n }));
    settleLog(settled, "left", connection.move("left"));
    settleLog(settled, "heal", connection.action(2));
    const [up, hit, leftMove, heal] = socket.sent.slice(1).map((m) =>
      m.kind.case === "move" || m.kind.case === "action" ? m.kind.value.clientTime : 0n,
    );
    socket.deliver({ kind: { case: "moved", value: { playerId: 7n, position: { x: 10, y: 19 }, clientTime: up! } } });
    socket.deliver({ kind: { case: "actionDone", value: { clientTime: hit!, payload: new Uint8Array([42]) } } });
    socket.deliver({ kind: { case: "error", value: { code: ErrorCode.RATE_LIMITED, detail: "too fast", clientTime: leftMove! } } });
    socket.deliver({ kind: { case: "error", value: { code: ErrorCode.REJECTED, detail: "dead", clientTime: heal! } } });
    await flush();
    expect(settled).toEqual(['up ok {"x":10,"y":19}', "hit ok [42]", "left RATE_LIMITED: too fast", "heal REJECTED: dead"]);
    // The view moved before the promise resolved.
    expect(connection.view.self?.position).toEqual({ x: 10, y: 19 });
  });

  it("rejects every pending move and action at ViewReset (not applied), and clears the view", async () => {
    const { connection, socket } = await loggedIn();
    socket.deliver({ kind: { case: "entered", value: { playerId: 2n, name: "bob", position: { x: 11, y: 20 } } } });
    const settled: string[] = [];
    settleLog(settled, "move", connection.move("right"));
    settleLog(settled, "act", connection.action(3));
    socket.deliver({ kind: { case: "viewReset", value: { playerId: 7n, position: { x: 10, y: 20 } } } });
    await flush();
    expect(settled).toEqual(["move UNAVAILABLE: not applied: the view was reset", "act UNAVAILABLE: not applied: the view was reset"]);
    expect(connection.view.entities.size).toBe(0);
    expect(connection.state).toBe("playing");
    // And the connection goes on.
    settleLog(settled, "again", connection.move("right"));
    const again = socket.sent.at(-1)!;
    socket.deliver({
      kind: { case: "moved", value: { playerId: 7n, position: { x: 11, y: 20 }, clientTime: again.kind.case === "move" ? again.kind.value.clientTime : 0n } },
    });
    await flush();
    expect(settled.at(-1)).toBe('again ok {"x":11,"y":20}');
  });

  it("emits errors that answer nothing, and reports answers to nothing as violations", async () => {
    const { connection, socket } = await loggedIn();
    const errors: MeridianError[] = [];
    const violations: ProtocolViolation[] = [];
    connection.on("error", (e) => errors.push(e));
    connection.on("violation", (v) => violations.push(v));
    connection.chat("x".repeat(10));
    socket.deliver({ kind: { case: "error", value: { code: ErrorCode.RATE_LIMITED, detail: "chat too fast" } } });
    socket.deliver({ kind: { case: "actionDone", value: { clientTime: 999n } } });
    socket.deliver({ kind: { case: "moved", value: { playerId: 55n, position: { x: 1, y: 1 } } } });
    socket.onmessage?.({ data: "text" });
    socket.onmessage?.({ data: new Uint8Array([0x0a, 0x05, 1]).buffer });
    expect(errors.map((e) => [e.codeName, e.detail])).toEqual([["RATE_LIMITED", "chat too fast"]]);
    expect(violations.map((v) => v.description)).toEqual([
      "answer for client_time 999, which is not pending",
      "Moved for 55, not in sight",
      "a non-binary WebSocket message (string)",
      expect.stringMatching(/^an undecodable ServerMessage of 3 bytes/),
    ]);
    expect(connection.state).toBe("playing");
  });

  it("refuses to send a message over the frame limit, before sending it", async () => {
    const { connection, socket } = await loggedIn();
    await expect(connection.action(1, { payload: new Uint8Array(5000) })).rejects.toMatchObject({
      code: ErrorCode.FRAME_TOO_LARGE,
      local: true,
    });
    expect(socket.sent.length).toBe(1);
  });
});

describe("Connection: keep-alive", () => {
  it("pings after 30 s without sending, and not while it keeps sending", async () => {
    vi.useFakeTimers();
    const { connection, socket } = await loggedIn();
    const pongs: ConnectionEvents["pong"][] = [];
    connection.on("pong", (p) => pongs.push(p));
    expect(socket.sentKinds()).toEqual(["login"]);

    await vi.advanceTimersByTimeAsync(29_999);
    expect(socket.sentKinds()).toEqual(["login"]);
    await vi.advanceTimersByTimeAsync(1);
    expect(socket.sentKinds()).toEqual(["login", "ping"]);
    const ping = socket.sent[1]!;
    const pingTime = ping.kind.case === "ping" ? ping.kind.value.clientTime : 0n;
    expect(pingTime).not.toBe(0n);
    await vi.advanceTimersByTimeAsync(40);
    socket.deliver({ kind: { case: "pong", value: { clientTime: pingTime } } });
    expect(pongs).toEqual([{ clientTime: pingTime, roundTripMs: 40 }]);

    // Sending something else 20 s after the ping pushes the next ping to 30 s after that.
    await vi.advanceTimersByTimeAsync(20_000 - 40);
    connection.chat("hello");
    await vi.advanceTimersByTimeAsync(29_999);
    expect(socket.sentKinds()).toEqual(["login", "ping", "chat"]);
    await vi.advanceTimersByTimeAsync(1);
    expect(socket.sentKinds()).toEqual(["login", "ping", "chat", "ping"]);
    // Pings and moves never share a client_time.
    void connection.move("up");
    const times = socket.sent.slice(1).flatMap((m) => (m.kind.case === "ping" || m.kind.case === "move" ? [m.kind.value.clientTime] : []));
    expect(new Set(times).size).toBe(3);
  });

  it("takes its interval from the options, and stops once closed", async () => {
    vi.useFakeTimers();
    const { connection, socket } = await loggedIn({ keepAliveMs: 1_000 });
    await vi.advanceTimersByTimeAsync(3_000);
    expect(socket.sentKinds()).toEqual(["login", "ping", "ping", "ping"]);
    await connection.close();
    await vi.advanceTimersByTimeAsync(10_000);
    expect(socket.sentKinds()).toEqual(["login", "ping", "ping", "ping"]);
  });
});

describe("Connection: closing", () => {
  it("closes for good on REPLACED, without resuming, and rejects what was pending", async () => {
    const { connection, socket } = await loggedIn();
    const events: string[] = [];
    connection.on("resuming", () => events.push("resuming"));
    connection.on("closed", ({ reason, error }) => events.push(`closed ${reason} ${error?.codeName}`));
    connection.on("error", (e) => events.push(`error ${e.codeName}`));
    const move = connection.move("up");
    socket.deliver({ kind: { case: "error", value: { code: ErrorCode.REPLACED, detail: "logged in elsewhere" } } });
    socket.serverClose(1000);
    await expect(move).rejects.toMatchObject({ code: ErrorCode.UNAVAILABLE, local: true });
    await flush();
    expect(events).toEqual(["error REPLACED", "closed replaced REPLACED"]);
    expect(connection.state).toBe("closed");
    expect(FakeSocket.made.length).toBe(1);
  });

  it("logs out: sends Logout, closes, says so, and does not resume", async () => {
    const { connection, socket } = await loggedIn();
    const closed: ConnectionEvents["closed"][] = [];
    connection.on("closed", (c) => closed.push(c));
    const resuming = vi.fn();
    connection.on("resuming", resuming);
    await connection.logout();
    expect(socket.sentKinds()).toEqual(["login", "logout"]);
    expect(socket.readyState).toBe(3);
    expect(closed).toEqual([{ reason: "logout" }]);
    expect(resuming).not.toHaveBeenCalled();
    await expect(connection.move("up")).rejects.toMatchObject({ code: ErrorCode.UNAVAILABLE });
  });

  it("closes when the socket drops before login: there is nothing to resume", async () => {
    const connection = await Connection.connect("ws://gateway.test/", { WebSocket: FakeSocket });
    const login = connection.login("ada");
    const closed = vi.fn();
    connection.on("closed", closed);
    FakeSocket.last().serverClose();
    await expect(login).rejects.toMatchObject({ code: ErrorCode.UNAVAILABLE, local: true });
    expect(closed).toHaveBeenCalledWith(expect.objectContaining({ reason: "dropped" }));
    expect(FakeSocket.made.length).toBe(1);
  });
});
